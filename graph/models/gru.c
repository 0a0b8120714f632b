/* gru.c: PyTorch's multi-layer GRU and the book's GRU encoder plus
 * Bahdanau-attention decoder (d2l 0.17, sections 9.7 and 10.4), unrolled over
 * time as graph nodes. */
#include <qkv/qkv.h>

#include "nn/builder-checks.h"
#include "models/gru-internal.h"
#include "error-private.h"

gboolean
gru_layer_params(QkvBuilder *b, const gchar *name, gint k, gint64 in, gint64 hidden,
                 GruLayer *layer, GError **error)
{
  /* nn.GRU's names carry the layer: "weight_ih_l0" under the GRU's name */
  g_autofree gchar *wi = g_strdup_printf("weight_ih_l%d", k);
  g_autofree gchar *wh = g_strdup_printf("weight_hh_l%d", k);
  g_autofree gchar *bi = g_strdup_printf("bias_ih_l%d", k);
  g_autofree gchar *bh = g_strdup_printf("bias_hh_l%d", k);
  QkvShape wis = QKV_SHAPE(3 * hidden, in), whs = QKV_SHAPE(3 * hidden, hidden);
  QkvShape bs = QKV_SHAPE(3 * hidden);
  /* nn.GRU draws every parameter from U(±1/√hidden); the book re-initialises
   * the weights with Xavier, which xavier_linear selects here too */
  qkv_builder_push(b, name, error);
  layer->w_ih = qkv_build_param(b, wi, &wis, "linear_weight", hidden, error);
  layer->w_hh = qkv_build_param(b, wh, &whs, "linear_weight", hidden, error);
  layer->b_ih = qkv_build_param(b, bi, &bs, "linear_bias", hidden, error);
  layer->b_hh = qkv_build_param(b, bh, &bs, "linear_bias", hidden, error);
  qkv_builder_pop(b);
  return qkv_values_present(
      "gru", (QkvValue *[]){layer->w_ih, layer->w_hh, layer->b_ih, layer->b_hh}, 4, error);
}

/* One GRU step: gi = x W_ihᵀ + b_ih already computed (B, 3H); h (B, H), or
 * NULL for the zero state, where h W_hhᵀ vanishes and h' = (1 - z) n. Leaving
 * the zero state out of the graph keeps every shape relative to the input's,
 * so a plan runs with a smaller batch than it was compiled for. */
QkvValue *
gru_cell(const GruLayer *layer, QkvValue *gi, QkvValue *h, gint64 hidden, GError **error)
{
  QkvValue *gh =
      h ? qkv_add(qkv_matmul(h, layer->w_hh, FALSE, TRUE, error), layer->b_hh, error) : layer->b_hh;
  QkvValue *r = qkv_sigmoid(
      qkv_add(qkv_slice(gi, -1, 0, hidden, error), qkv_slice(gh, -1, 0, hidden, error), error),
      error);
  QkvValue *z = qkv_sigmoid(qkv_add(qkv_slice(gi, -1, hidden, 2 * hidden, error),
                                    qkv_slice(gh, -1, hidden, 2 * hidden, error), error),
                            error);
  QkvValue *n =
      qkv_tanh(qkv_add(qkv_slice(gi, -1, 2 * hidden, 3 * hidden, error),
                       qkv_mul(r, qkv_slice(gh, -1, 2 * hidden, 3 * hidden, error), error), error),
               error);
  /* h' = (1 - z) n + z h = n + z (h - n) */
  QkvValue *h_minus_n = h ? qkv_sub(h, n, error) : qkv_neg(n, error);
  return qkv_add(n, qkv_mul(z, h_minus_n, error), error);
}

/* Row l of a (L, B, H) state as (B, H). */
QkvValue *
gru_state_row(QkvValue *state, gint l, GError **error)
{
  gint axis = 0;
  return qkv_squeeze(qkv_slice(state, 0, l, l + 1, error), &axis, 1, error);
}

/* Stack n values of shape (B, H) along a new axis at position axis (0 or 1). */
QkvValue *
gru_stack(QkvValue *const *rows, guint n, gint axis, GError **error)
{
  g_autofree QkvValue **lifted = g_new0(QkvValue *, n);
  for (guint i = 0; i < n; i++)
    lifted[i] = qkv_unsqueeze(rows[i], axis, error);
  return qkv_concat(lifted, n, axis, error);
}

static QkvValue *
gru(QkvBuilder *b, const gchar *name, QkvValue *x, QkvValue *h0, gint64 hidden, gint num_layers,
    double dropout, QkvValue **h_n, GError **error)
{
  const gint64 steps = qkv_value_shape(x)->dims[0];
  const gint time_axis = 0;
  QkvValue *seq = x;
  g_autofree QkvValue **finals = g_new0(QkvValue *, num_layers);
  g_autofree QkvValue **outs = g_new0(QkvValue *, steps);
  for (gint k = 0; k < num_layers && seq != NULL; k++) {
    GruLayer layer;
    if (!gru_layer_params(b, name, k, qkv_value_shape(seq)->dims[2], hidden, &layer, error))
      return NULL;
    /* the input projection of every step at once */
    QkvValue *gi_all = qkv_add(qkv_matmul(seq, layer.w_ih, FALSE, TRUE, error), layer.b_ih, error);
    QkvValue *h = h0 ? gru_state_row(h0, k, error) : NULL;
    for (gint64 t = 0; t < steps; t++) {
      QkvValue *gi = qkv_squeeze(qkv_slice(gi_all, 0, t, t + 1, error), &time_axis, 1, error);
      if ((h = outs[t] = gru_cell(&layer, gi, h, hidden, error)) == NULL)
        return NULL; /* a NULL h would read as the zero state */
    }
    finals[k] = h;
    seq = gru_stack(outs, (guint)steps, 0, error);
    if (dropout > 0 && k < num_layers - 1)
      seq = qkv_dropout(seq, dropout, error);
  }
  if (h_n != NULL)
    *h_n = gru_stack(finals, (guint)num_layers, 0, error);
  return seq;
}

QkvValue *
qkv_build_gru(QkvBuilder *b, const gchar *name, QkvValue *x, QkvValue *h0, gint64 hidden,
              gint num_layers, double dropout, QkvValue **h_n, GError **error)
{
  if (h_n != NULL) /* a failure leaves out-values NULL */
    *h_n = NULL;
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  g_return_val_if_fail(name != NULL, NULL);
  if (h_n != NULL)
    *h_n = NULL;
  BUILDER_RETURN_IF_INVALID(b, error);
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
  const gint L = cfg->num_layers, perm_tb[] = {1, 0, 2}, step_axis = 1;

  /* encoder: embedding, then the GRU over (T, B, E); outputs (B, T, H) */
  QkvValue *emb = qkv_build_embedding(b, "encoder.embedding", src, cfg->src_vocab, E, error);
  QkvValue *state = NULL;
  QkvValue *enc = qkv_build_gru(b, "encoder.rnn", qkv_permute(emb, perm_tb, 3, error), NULL, H, L,
                                cfg->dropout, &state, error);
  QkvValue *enc_outputs = qkv_permute(enc, perm_tb, 3, error);
  if (taps != NULL) {
    taps->enc_outputs = enc_outputs;
    taps->enc_state = state;
  }

  /* decoder parameters, in the book's order */
  QkvShape hh = QKV_SHAPE(H, H), vh = QKV_SHAPE(1, H);
  qkv_builder_push(b, "decoder.attention", error);
  QkvValue *w_k = qkv_build_param(b, "W_k.weight", &hh, "linear_weight", H, error);
  QkvValue *w_q = qkv_build_param(b, "W_q.weight", &hh, "linear_weight", H, error);
  QkvValue *w_v = qkv_build_param(b, "w_v.weight", &vh, "linear_weight", H, error);
  qkv_builder_pop(b);
  QkvValue *demb = qkv_build_embedding(b, "decoder.embedding", dec_in, cfg->tgt_vocab, E, error);
  g_autofree GruLayer *layers = g_new0(GruLayer, L);
  for (gint k = 0; k < L; k++)
    if (!gru_layer_params(b, "decoder.rnn", k, k == 0 ? E + H : H, H, &layers[k], error))
      return NULL;

  /* one step per target position: attend with the top layer's state, feed
   * [context; embedding] through the layers */
  const gint64 steps = qkv_value_shape(dec_in)->dims[1];
  g_autofree QkvValue **hidden = g_new0(QkvValue *, L);
  for (gint k = 0; k < L; k++)
    hidden[k] = gru_state_row(state, k, error);
  g_autofree QkvValue **outs = g_new0(QkvValue *, steps);
  g_autofree QkvValue **step_weights = g_new0(QkvValue *, steps);
  for (gint64 t = 0; t < steps; t++) {
    QkvValue *query = qkv_unsqueeze(hidden[L - 1], step_axis, error); /* (B, 1, H) */
    QkvValue *context = qkv_additive_attention(query, enc_outputs, enc_outputs, w_q, w_k, w_v,
                                               src_valid, cfg->dropout, &step_weights[t], error);
    QkvValue *pair[] = {context, qkv_slice(demb, step_axis, t, t + 1, error)};
    QkvValue *xt = qkv_squeeze(qkv_concat(pair, 2, -1, error), &step_axis, 1, error);
    for (gint k = 0; k < L; k++) {
      QkvValue *gi =
          qkv_add(qkv_matmul(xt, layers[k].w_ih, FALSE, TRUE, error), layers[k].b_ih, error);
      if ((xt = hidden[k] = gru_cell(&layers[k], gi, hidden[k], H, error)) == NULL)
        return NULL; /* a NULL state would read as the zero state */
      if (cfg->dropout > 0 && k < L - 1)
        xt = qkv_dropout(xt, cfg->dropout, error);
    }
    outs[t] = hidden[L - 1];
  }
  if (weights != NULL) /* (B, T, T_src) from each step's (B, 1, T_src) */
    *weights = qkv_concat(step_weights, (guint)steps, step_axis, error);
  QkvValue *dec_out = gru_stack(outs, (guint)steps, step_axis, error); /* (B, T, H) */
  return qkv_build_linear(b, "decoder.dense", dec_out, cfg->tgt_vocab, TRUE, error);
}

/* The checks and the all-or-nothing step of both entry points: taps (may be
 * NULL) receives the intermediates, the attention weights only when
 * with_weights (they cost a node). */
static QkvValue *
bahdanau_checked(QkvBuilder *b, const QkvGruSeq2SeqConfig *cfg, QkvValue *src, QkvValue *src_valid,
                 QkvValue *dec_in, gboolean with_weights, QkvSeq2SeqTaps *taps, GError **error)
{
  BUILDER_RETURN_IF_INVALID(b, error);
  if (src == NULL || src_valid == NULL || dec_in == NULL || !check_seq2seq_config(cfg, error))
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
  QkvValue *logits =
      bahdanau_seq2seq(b, cfg, src, src_valid, dec_in,
                       with_weights ? &found.attention_weights : NULL, &found, error);
  logits = qkv_builder_end(b, &mark, logits);
  /* on failure the values found were rolled back with the rest */
  if (logits != NULL && taps != NULL)
    *taps = found;
  return logits;
}

QkvValue *
qkv_build_bahdanau_seq2seq(QkvBuilder *b, const QkvGruSeq2SeqConfig *cfg, QkvValue *src,
                           QkvValue *src_valid, QkvValue *dec_in, QkvValue **weights,
                           GError **error)
{
  if (weights != NULL) /* a failure leaves out-values NULL */
    *weights = NULL;
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  g_return_val_if_fail(cfg != NULL, NULL);
  QkvSeq2SeqTaps taps = {0};
  QkvValue *logits =
      bahdanau_checked(b, cfg, src, src_valid, dec_in, weights != NULL, &taps, error);
  if (weights != NULL)
    *weights = taps.attention_weights;
  return logits;
}

QkvValue *
qkv_build_bahdanau_seq2seq_taps(QkvBuilder *b, const QkvGruSeq2SeqConfig *cfg, QkvValue *src,
                                QkvValue *src_valid, QkvValue *dec_in, QkvSeq2SeqTaps *taps,
                                GError **error)
{
  if (taps != NULL)
    *taps = (QkvSeq2SeqTaps){0};
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  g_return_val_if_fail(cfg != NULL, NULL);
  return bahdanau_checked(b, cfg, src, src_valid, dec_in, taps != NULL, taps, error);
}
