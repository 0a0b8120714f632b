/* gru.c: PyTorch's multi-layer GRU and the book's GRU encoder plus
 * Bahdanau-attention decoder (d2l 0.17, sections 9.7 and 10.4), unrolled over
 * time as graph nodes. */
#include <qkv/qkv.h>

#include "builder-checks.h"

typedef struct {
  QkvValue *w_ih, *w_hh, *b_ih, *b_hh;
} GruLayer;

static gboolean
gru_layer_params(QkvBuilder *b, const gchar *name, gint k, gint64 in, gint64 hidden,
                 GruLayer *layer, GError **error)
{
  g_autofree gchar *wi = g_strdup_printf("%s.weight_ih_l%d", name, k);
  g_autofree gchar *wh = g_strdup_printf("%s.weight_hh_l%d", name, k);
  g_autofree gchar *bi = g_strdup_printf("%s.bias_ih_l%d", name, k);
  g_autofree gchar *bh = g_strdup_printf("%s.bias_hh_l%d", name, k);
  QkvShape wis = QKV_SHAPE(3 * hidden, in), whs = QKV_SHAPE(3 * hidden, hidden);
  QkvShape bs = QKV_SHAPE(3 * hidden);
  /* nn.GRU draws every parameter from U(±1/√hidden); the book re-initialises
   * the weights with Xavier, which xavier_linear selects here too */
  layer->w_ih = qkv_build_param(b, wi, &wis, "linear_weight", hidden, error);
  layer->w_hh = layer->w_ih ? qkv_build_param(b, wh, &whs, "linear_weight", hidden, error) : NULL;
  layer->b_ih = layer->w_hh ? qkv_build_param(b, bi, &bs, "linear_bias", hidden, error) : NULL;
  layer->b_hh = layer->b_ih ? qkv_build_param(b, bh, &bs, "linear_bias", hidden, error) : NULL;
  return layer->b_hh != NULL;
}

/* One GRU step: gi = x W_ihᵀ + b_ih already computed (B, 3H); h (B, H). */
static QkvValue *
gru_cell(const GruLayer *layer, QkvValue *gi, QkvValue *h, gint64 hidden, GError **error)
{
  QkvValue *gh = qkv_matmul(h, layer->w_hh, FALSE, TRUE, error);
  gh = gh ? qkv_add(gh, layer->b_hh, error) : NULL;
  if (gh == NULL)
    return NULL;
  QkvValue *gi_r = qkv_slice(gi, -1, 0, hidden, error);
  QkvValue *gi_z = qkv_slice(gi, -1, hidden, 2 * hidden, error);
  QkvValue *gi_n = qkv_slice(gi, -1, 2 * hidden, 3 * hidden, error);
  QkvValue *gh_r = qkv_slice(gh, -1, 0, hidden, error);
  QkvValue *gh_z = qkv_slice(gh, -1, hidden, 2 * hidden, error);
  QkvValue *gh_n = qkv_slice(gh, -1, 2 * hidden, 3 * hidden, error);
  if (!gi_r || !gi_z || !gi_n || !gh_r || !gh_z || !gh_n)
    return NULL;
  QkvValue *r = qkv_sigmoid(qkv_add(gi_r, gh_r, error), error);
  QkvValue *z = r ? qkv_sigmoid(qkv_add(gi_z, gh_z, error), error) : NULL;
  QkvValue *rn = z ? qkv_mul(r, gh_n, error) : NULL;
  QkvValue *n = rn ? qkv_tanh(qkv_add(gi_n, rn, error), error) : NULL;
  /* h' = (1 - z) n + z h = n + z (h - n) */
  QkvValue *diff = n ? qkv_sub(h, n, error) : NULL;
  QkvValue *zd = diff ? qkv_mul(z, diff, error) : NULL;
  return zd ? qkv_add(n, zd, error) : NULL;
}

static QkvValue *
zeros(QkvGraph *graph, gint64 rows, gint64 cols)
{
  QkvShape s = QKV_SHAPE(rows, cols);
  g_autoptr(QkvTensor) t = qkv_tensor_new(QKV_F32, &s);
  return qkv_graph_constant(graph, t, NULL);
}

/* Row l of a (L, B, H) state as (B, H). */
static QkvValue *
state_row(QkvValue *state, gint l, GError **error)
{
  const QkvShape *s = qkv_value_shape(state);
  QkvShape bh = QKV_SHAPE(s->dims[1], s->dims[2]);
  QkvValue *row = qkv_slice(state, 0, l, l + 1, error);
  return row ? qkv_reshape(row, &bh, error) : NULL;
}

/* Stack n values of shape (B, H) along a new axis at position axis (0 or 1). */
static QkvValue *
stack(QkvValue *const *rows, guint n, gint axis, GError **error)
{
  const QkvShape *s = qkv_value_shape(rows[0]);
  QkvShape one =
      axis == 0 ? QKV_SHAPE(1, s->dims[0], s->dims[1]) : QKV_SHAPE(s->dims[0], 1, s->dims[1]);
  g_autofree QkvValue **lifted = g_new0(QkvValue *, n);
  for (guint i = 0; i < n; i++) {
    lifted[i] = qkv_reshape(rows[i], &one, error);
    if (lifted[i] == NULL)
      return NULL;
  }
  return qkv_concat(lifted, n, axis, error);
}

static QkvValue *
gru(QkvBuilder *b, const gchar *name, QkvValue *x, QkvValue *h0, gint64 hidden, gint num_layers,
    double dropout, QkvValue **h_n, GError **error)
{
  const QkvShape *xs = qkv_value_shape(x);
  gint64 steps = xs->dims[0], batch = xs->dims[1];
  QkvValue *seq = x;
  g_autofree QkvValue **finals = g_new0(QkvValue *, num_layers);
  g_autofree QkvValue **outs = g_new0(QkvValue *, MAX(steps, 1));
  for (gint k = 0; k < num_layers; k++) {
    gint64 in = qkv_value_shape(seq)->dims[2];
    GruLayer layer;
    if (!gru_layer_params(b, name, k, in, hidden, &layer, error))
      return NULL;
    /* the input projection of every step at once */
    QkvValue *gi_all = qkv_matmul(seq, layer.w_ih, FALSE, TRUE, error);
    gi_all = gi_all ? qkv_add(gi_all, layer.b_ih, error) : NULL;
    QkvValue *h = h0 ? state_row(h0, k, error) : zeros(b->graph, batch, hidden);
    if (gi_all == NULL || h == NULL)
      return NULL;
    QkvShape row = QKV_SHAPE(batch, 3 * hidden);
    for (gint64 t = 0; t < steps; t++) {
      QkvValue *gi = qkv_slice(gi_all, 0, t, t + 1, error);
      gi = gi ? qkv_reshape(gi, &row, error) : NULL;
      h = gi ? gru_cell(&layer, gi, h, hidden, error) : NULL;
      if (h == NULL)
        return NULL;
      outs[t] = h;
    }
    finals[k] = h;
    seq = stack(outs, (guint)steps, 0, error);
    if (seq != NULL && dropout > 0 && k < num_layers - 1)
      seq = qkv_dropout(seq, dropout, error);
    if (seq == NULL)
      return NULL;
  }
  if (h_n != NULL) {
    *h_n = stack(finals, (guint)num_layers, 0, error);
    if (*h_n == NULL)
      return NULL;
  }
  return seq;
}

QkvValue *
qkv_build_gru(QkvBuilder *b, const gchar *name, QkvValue *x, QkvValue *h0, gint64 hidden,
              gint num_layers, double dropout, QkvValue **h_n, GError **error)
{
  BUILDER_RETURN_IF_INVALID(b);
  g_return_val_if_fail(name != NULL, NULL);
  if (h_n != NULL)
    *h_n = NULL;
  if (x == NULL)
    return NULL;
  const gchar *me = "qkv_build_gru";
  if (!builder_check_positive(me, "hidden", hidden, error) ||
      !builder_check_positive(me, "num_layers", num_layers, error) ||
      !builder_check_dropout(me, "dropout", dropout, error))
    return NULL;
  const QkvShape *xs = qkv_value_shape(x);
  if (xs->rank != 3 || xs->dims[0] < 1) {
    g_autofree gchar *sh = qkv_shape_to_string(xs);
    g_set_error(error, QKV_ERROR, QKV_ERROR_SHAPE,
                "%s '%s': x must be (T, B, in) with T >= 1, got %s", me, name, sh);
    return NULL;
  }
  if (h0 != NULL) {
    const QkvShape *hs = qkv_value_shape(h0);
    QkvShape want = QKV_SHAPE(num_layers, xs->dims[1], hidden);
    if (!qkv_shape_equal(hs, &want)) {
      g_autofree gchar *have = qkv_shape_to_string(hs);
      g_autofree gchar *need = qkv_shape_to_string(&want);
      g_set_error(error, QKV_ERROR, QKV_ERROR_SHAPE,
                  "%s '%s': h0 must be (num_layers, B, hidden) = %s, got %s", me, name, need, have);
      return NULL;
    }
  }
  QkvBuilderMark mark;
  qkv_builder_begin(b, &mark);
  QkvValue *final_state = NULL;
  QkvValue *out =
      gru(b, name, x, h0, hidden, num_layers, dropout, h_n ? &final_state : NULL, error);
  out = qkv_builder_end(b, &mark, out);
  if (out != NULL && h_n != NULL)
    *h_n = final_state;
  return out;
}

static gboolean
check_seq2seq_config(const QkvGruSeq2SeqConfig *cfg, GError **error)
{
  const gchar *me = "qkv_build_bahdanau_seq2seq";
  return builder_check_positive(me, "cfg->src_vocab", cfg->src_vocab, error) &&
         builder_check_positive(me, "cfg->tgt_vocab", cfg->tgt_vocab, error) &&
         builder_check_positive(me, "cfg->embed_size", cfg->embed_size, error) &&
         builder_check_positive(me, "cfg->num_hiddens", cfg->num_hiddens, error) &&
         builder_check_positive(me, "cfg->num_layers", cfg->num_layers, error) &&
         builder_check_dropout(me, "cfg->dropout", cfg->dropout, error);
}

static QkvValue *
bahdanau_seq2seq(QkvBuilder *b, const QkvGruSeq2SeqConfig *cfg, QkvValue *src, QkvValue *src_valid,
                 QkvValue *dec_in, QkvValue **weights, QkvSeq2SeqTaps *taps, GError **error)
{
  const gint64 H = cfg->num_hiddens, E = cfg->embed_size;
  const gint perm_tb[] = {1, 0, 2};

  /* encoder: embedding, then the GRU over (T, B, E) */
  QkvValue *emb = qkv_build_embedding(b, "encoder.embedding", src, cfg->src_vocab, E, error);
  QkvValue *x = emb ? qkv_permute(emb, perm_tb, 3, error) : NULL;
  QkvValue *state = NULL;
  QkvValue *enc =
      x ? qkv_build_gru(b, "encoder.rnn", x, NULL, H, cfg->num_layers, cfg->dropout, &state, error)
        : NULL;
  QkvValue *enc_outputs = enc ? qkv_permute(enc, perm_tb, 3, error) : NULL; /* (B, T, H) */
  if (enc_outputs == NULL)
    return NULL;
  if (taps != NULL) {
    taps->enc_outputs = enc_outputs;
    taps->enc_state = state;
  }

  /* decoder parameters, in the book's order */
  QkvShape hh = QKV_SHAPE(H, H), vh = QKV_SHAPE(1, H);
  QkvValue *w_k =
      qkv_build_param(b, "decoder.attention.W_k.weight", &hh, "linear_weight", H, error);
  QkvValue *w_q =
      w_k ? qkv_build_param(b, "decoder.attention.W_q.weight", &hh, "linear_weight", H, error)
          : NULL;
  QkvValue *w_v =
      w_q ? qkv_build_param(b, "decoder.attention.w_v.weight", &vh, "linear_weight", H, error)
          : NULL;
  QkvValue *demb =
      w_v ? qkv_build_embedding(b, "decoder.embedding", dec_in, cfg->tgt_vocab, E, error) : NULL;
  if (demb == NULL)
    return NULL;
  g_autofree GruLayer *layers = g_new0(GruLayer, cfg->num_layers);
  for (gint k = 0; k < cfg->num_layers; k++)
    if (!gru_layer_params(b, "decoder.rnn", k, k == 0 ? E + H : H, H, &layers[k], error))
      return NULL;

  const QkvShape *ds = qkv_value_shape(dec_in);
  gint64 batch = ds->dims[0], steps = ds->dims[1];
  g_autofree QkvValue **hidden = g_new0(QkvValue *, cfg->num_layers);
  for (gint k = 0; k < cfg->num_layers; k++)
    if ((hidden[k] = state_row(state, k, error)) == NULL)
      return NULL;
  g_autofree QkvValue **outs = g_new0(QkvValue *, steps);
  g_autofree QkvValue **step_weights = g_new0(QkvValue *, steps);
  QkvShape query_shape = QKV_SHAPE(batch, 1, H), in_shape = QKV_SHAPE(batch, E + H);
  for (gint64 t = 0; t < steps; t++) {
    QkvValue *query = qkv_reshape(hidden[cfg->num_layers - 1], &query_shape, error);
    QkvValue *w = NULL;
    QkvValue *context = query ? qkv_additive_attention(query, enc_outputs, enc_outputs, w_q, w_k,
                                                       w_v, src_valid, cfg->dropout, &w, error)
                              : NULL;
    QkvValue *e_t = context ? qkv_slice(demb, 1, t, t + 1, error) : NULL; /* (B, 1, E) */
    QkvValue *pair[] = {context, e_t};
    QkvValue *xt = e_t ? qkv_concat(pair, 2, -1, error) : NULL;
    xt = xt ? qkv_reshape(xt, &in_shape, error) : NULL;
    for (gint k = 0; xt != NULL && k < cfg->num_layers; k++) {
      QkvValue *gi = qkv_matmul(xt, layers[k].w_ih, FALSE, TRUE, error);
      gi = gi ? qkv_add(gi, layers[k].b_ih, error) : NULL;
      hidden[k] = gi ? gru_cell(&layers[k], gi, hidden[k], H, error) : NULL;
      xt = hidden[k];
      if (xt != NULL && cfg->dropout > 0 && k < cfg->num_layers - 1)
        xt = qkv_dropout(xt, cfg->dropout, error);
    }
    if (xt == NULL)
      return NULL;
    outs[t] = hidden[cfg->num_layers - 1];
    step_weights[t] = w; /* (B, 1, T_src) */
  }
  QkvValue *dec_out = stack(outs, (guint)steps, 1, error); /* (B, T, H) */
  if (dec_out != NULL && weights != NULL) {
    *weights = qkv_concat(step_weights, (guint)steps, 1, error);
    if (*weights == NULL)
      return NULL;
  }
  return dec_out ? qkv_build_linear(b, "decoder.dense", dec_out, cfg->tgt_vocab, TRUE, error)
                 : NULL;
}

QkvValue *
qkv_build_bahdanau_seq2seq(QkvBuilder *b, const QkvGruSeq2SeqConfig *cfg, QkvValue *src,
                           QkvValue *src_valid, QkvValue *dec_in, QkvValue **weights,
                           GError **error)
{
  BUILDER_RETURN_IF_INVALID(b);
  g_return_val_if_fail(cfg != NULL, NULL);
  if (weights != NULL)
    *weights = NULL;
  if (src == NULL || src_valid == NULL || dec_in == NULL)
    return NULL;
  if (!check_seq2seq_config(cfg, error))
    return NULL;
  const QkvShape *ds = qkv_value_shape(dec_in);
  if (ds->rank != 2 || ds->dims[1] < 1) {
    g_autofree gchar *sh = qkv_shape_to_string(ds);
    g_set_error(error, QKV_ERROR, QKV_ERROR_SHAPE,
                "qkv_build_bahdanau_seq2seq: dec_in must be (B, T) with T >= 1, got %s", sh);
    return NULL;
  }
  QkvBuilderMark mark;
  qkv_builder_begin(b, &mark);
  QkvValue *attention_weights = NULL;
  QkvValue *logits = bahdanau_seq2seq(b, cfg, src, src_valid, dec_in,
                                      weights ? &attention_weights : NULL, NULL, error);
  logits = qkv_builder_end(b, &mark, logits);
  if (logits != NULL && weights != NULL)
    *weights = attention_weights;
  return logits;
}

QkvValue *
qkv_build_bahdanau_seq2seq_taps(QkvBuilder *b, const QkvGruSeq2SeqConfig *cfg, QkvValue *src,
                                QkvValue *src_valid, QkvValue *dec_in, QkvSeq2SeqTaps *taps,
                                GError **error)
{
  if (taps != NULL)
    *taps = (QkvSeq2SeqTaps){0};
  BUILDER_RETURN_IF_INVALID(b);
  g_return_val_if_fail(cfg != NULL, NULL);
  if (src == NULL || src_valid == NULL || dec_in == NULL)
    return NULL;
  if (!check_seq2seq_config(cfg, error))
    return NULL;
  const QkvShape *ds = qkv_value_shape(dec_in);
  if (ds->rank != 2 || ds->dims[1] < 1) {
    g_autofree gchar *sh = qkv_shape_to_string(ds);
    g_set_error(error, QKV_ERROR, QKV_ERROR_SHAPE,
                "qkv_build_bahdanau_seq2seq: dec_in must be (B, T) with T >= 1, got %s", sh);
    return NULL;
  }
  QkvBuilderMark mark;
  qkv_builder_begin(b, &mark);
  QkvSeq2SeqTaps found = {0};
  QkvValue *logits = bahdanau_seq2seq(b, cfg, src, src_valid, dec_in,
                                      taps ? &found.attention_weights : NULL, &found, error);
  logits = qkv_builder_end(b, &mark, logits);
  /* on failure the values found were rolled back with the rest */
  if (logits != NULL && taps != NULL)
    *taps = found;
  return logits;
}
