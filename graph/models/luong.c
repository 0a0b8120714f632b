/* luong.c: Luong attention (Luong, Pham & Manning 2015): the dot, general
 * and concat scores, global, local-m and local-p alignment, the attentional
 * vector, and a seq2seq on the book's GRU encoder and decoder with optional
 * input feeding. Everything is composed from public ops; the local windows
 * are boolean masks computed in the graph from the positions, so nothing is
 * built on the host per batch and a plan runs at any smaller batch. */
#include <qkv/qkv.h>

#include "nn/builder-checks.h"
#include "models/gru-internal.h"
#include "models/luong-internal.h"
#include "error-private.h"

static gboolean
check_attention_config(const gchar *me, const gchar *field, const QkvLuongAttentionConfig *cfg,
                       GError **error)
{
  if ((guint)cfg->score > QKV_LUONG_CONCAT || (guint)cfg->align > QKV_LUONG_LOCAL_P) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "%s: %s has score %d and align %d; no such score or alignment", me, field,
                (gint)cfg->score, (gint)cfg->align);
    return FALSE;
  }
  if (cfg->align != QKV_LUONG_GLOBAL && cfg->window < 1) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "%s: %s.window is %d, it must be > 0 for local attention", me, field, cfg->window);
    return FALSE;
  }
  return TRUE;
}

/* luong_prepare() under the scope of the attention's name. */
static gboolean
prepare(QkvBuilder *b, const QkvLuongAttentionConfig *cfg, QkvValue *source, QkvValue *src_valid,
        Luong *a, GError **error)
{
  const gint64 H = qkv_value_shape(source)->dims[2], S = qkv_value_shape(source)->dims[1];
  *a = (Luong){.cfg = *cfg, .hidden = H, .src_len = S, .source = source, .valid = src_valid};
  QkvShape hh = QKV_SHAPE(H, H), h2h = QKV_SHAPE(H, 2 * H), vh = QKV_SHAPE(1, H);
  switch (cfg->score) {
  case QKV_LUONG_DOT:
    a->keys = source;
    break;
  case QKV_LUONG_GENERAL: {
    /* h_tᵀ (W_a h̄_s): project the source once */
    QkvValue *w_a = qkv_build_param(b, "W_a.weight", &hh, "linear_weight", H, error);
    a->keys = qkv_matmul(source, w_a, FALSE, TRUE, error);
    break;
  }
  case QKV_LUONG_CONCAT: {
    /* W_a [h_t; h̄_s] = W_a[:, :H] h_t + W_a[:, H:] h̄_s: the source half
     * once, the query half per query */
    QkvValue *w_a = qkv_build_param(b, "W_a.weight", &h2h, "linear_weight", 2 * H, error);
    a->v_a = qkv_build_param(b, "v_a.weight", &vh, "linear_weight", H, error);
    a->w_query = qkv_slice(w_a, -1, 0, H, error);
    a->keys = qkv_matmul(source, qkv_slice(w_a, -1, H, 2 * H, error), FALSE, TRUE, error);
    break;
  }
  }
  if (cfg->align == QKV_LUONG_LOCAL_P) {
    a->w_p = qkv_build_param(b, "W_p.weight", &hh, "linear_weight", H, error);
    a->v_p = qkv_build_param(b, "v_p.weight", &vh, "linear_weight", H, error);
  }
  const gboolean local = cfg->align != QKV_LUONG_GLOBAL;
  if (local) {
    /* S: each sentence's valid length, (B, 1, 1) against scores (B, n, S) */
    a->length = src_valid
                    ? qkv_unsqueeze(qkv_unsqueeze(qkv_cast(src_valid, QKV_F32, error), -1, error),
                                    -1, error)
                    : qkv_graph_scalar(b->graph, (float)S);
    g_autofree float *pos = g_new(float, S);
    for (gint64 s = 0; s < S; s++)
      pos[s] = (float)s;
    QkvShape ps = QKV_SHAPE(S);
    g_autoptr(QkvTensor) pt = qkv_tensor_new_f32(&ps, pos);
    a->positions = qkv_graph_constant(b->graph, pt, error);
    a->window = qkv_graph_scalar(b->graph, (float)cfg->window);
  }
  /* errors chain, so one check of what this configuration uses (the rest
   * stays NULL): luong_attend() would read a missing window or mask as none */
  return a->keys && (cfg->score != QKV_LUONG_CONCAT || a->v_a) &&
         (!local || (a->length && a->positions && a->window)) &&
         (cfg->align != QKV_LUONG_LOCAL_P || (a->w_p && a->v_p));
}

gboolean
luong_prepare(QkvBuilder *b, const gchar *name, const QkvLuongAttentionConfig *cfg,
              QkvValue *source, QkvValue *src_valid, Luong *a, GError **error)
{
  qkv_builder_push(b, name, error);
  gboolean prepared = prepare(b, cfg, source, src_valid, a, error);
  qkv_builder_pop(b);
  return prepared;
}

QkvValue *
luong_target_positions(QkvBuilder *b, const Luong *a, gint64 first, gint64 n, GError **error)
{
  if (a->cfg.align != QKV_LUONG_LOCAL_M)
    return NULL;
  g_autofree float *tpos = g_new(float, n);
  for (gint64 i = 0; i < n; i++)
    tpos[i] = (float)(first + i);
  QkvShape ts = QKV_SHAPE(n, 1);
  g_autoptr(QkvTensor) tt = qkv_tensor_new_f32(&ts, tpos);
  return qkv_graph_constant(b->graph, tt, error);
}

QkvValue *
luong_attend(QkvBuilder *b, const Luong *a, QkvValue *queries, QkvValue *target_positions,
             QkvValue **weights, GError **error)
{
  QkvValue *scores;
  if (a->cfg.score == QKV_LUONG_CONCAT) {
    /* tanh(W_a[:, :H] h_t + W_a[:, H:] h̄_s) for every (t, s): (B, n, S, H) */
    QkvValue *q = qkv_matmul(queries, a->w_query, FALSE, TRUE, error);
    QkvValue *features = qkv_tanh(
        qkv_add(qkv_unsqueeze(q, 2, error), qkv_unsqueeze(a->keys, 1, error), error), error);
    const gint last = 3;
    scores = qkv_squeeze(qkv_matmul(features, a->v_a, FALSE, TRUE, error), &last, 1, error);
  } else {
    scores = qkv_matmul(queries, a->keys, FALSE, TRUE, error); /* (B, n, S) */
  }

  QkvValue *w;
  if (a->cfg.align == QKV_LUONG_GLOBAL) {
    w = qkv_masked_softmax(scores, a->valid, FALSE, error);
  } else {
    QkvValue *centre;
    if (a->cfg.align == QKV_LUONG_LOCAL_M) {
      /* p_t = min(t, S - 1): target positions (n, 1) or (B, n, 1) against
       * (B, 1, 1) */
      if (target_positions == NULL)
        return NULL; /* its builder's error is set */
      QkvValue *last = qkv_sub(a->length, qkv_graph_scalar(b->graph, 1.0f), error);
      centre = qkv_minimum(target_positions, last, error);
    } else {
      /* p_t = S · sigmoid(v_pᵀ tanh(W_p h_t)): (B, n, 1) */
      QkvValue *hidden = qkv_tanh(qkv_matmul(queries, a->w_p, FALSE, TRUE, error), error);
      centre = qkv_mul(a->length,
                       qkv_sigmoid(qkv_matmul(hidden, a->v_p, FALSE, TRUE, error), error), error);
    }
    QkvValue *offset = qkv_sub(a->positions, centre, error); /* s - p_t */
    QkvValue *inside = qkv_le(qkv_abs(offset, error), a->window, error);
    w = qkv_masked_softmax_full(scores, a->valid, inside, QKV_MASK_BOOLEAN, FALSE, error);
    if (a->cfg.align == QKV_LUONG_LOCAL_P) {
      /* exp(−(s − p_t)² / (2σ²)) with σ = D / 2: exp(−2 (s − p_t)² / D²) */
      const double D = a->cfg.window;
      w = qkv_mul(w, qkv_exp(qkv_scale(qkv_square(offset, error), -2.0 / (D * D), error), error),
                  error);
    }
  }
  if (weights != NULL)
    *weights = w;
  return qkv_matmul(w, a->source, FALSE, FALSE, error);
}

static gboolean
check_attention_inputs(const gchar *me, const gchar *name, QkvValue *queries, QkvValue *source,
                       QkvValue *src_valid, GError **error)
{
  const QkvShape *qs = qkv_value_shape(queries), *ss = qkv_value_shape(source);
  if (qs->rank != 3 || ss->rank != 3 || qs->dims[2] != ss->dims[2] || qs->dims[0] != ss->dims[0] ||
      qs->dims[1] < 1 || ss->dims[1] < 1) {
    g_autofree gchar *q = qkv_shape_to_string(qs);
    g_autofree gchar *s = qkv_shape_to_string(ss);
    g_set_error(error, QKV_ERROR, QKV_ERROR_SHAPE,
                "%s '%s': queries (B, n_q, H) and source (B, S, H) must agree, got %s and %s", me,
                name, q, s);
    return FALSE;
  }
  if (src_valid != NULL) {
    const QkvShape *vs = qkv_value_shape(src_valid);
    if (vs->rank != 1 || vs->dims[0] != ss->dims[0] || qkv_value_dtype(src_valid) != QKV_I32) {
      g_autofree gchar *v = qkv_shape_to_string(vs);
      g_set_error(error, QKV_ERROR, QKV_ERROR_SHAPE,
                  "%s '%s': src_valid must be i32 (B) with B = %" G_GINT64_FORMAT ", got %s %s", me,
                  name, ss->dims[0], qkv_dtype_name(qkv_value_dtype(src_valid)), v);
      return FALSE;
    }
  }
  return TRUE;
}

QkvValue *
qkv_build_luong_attention(QkvBuilder *b, const gchar *name, const QkvLuongAttentionConfig *cfg,
                          QkvValue *queries, QkvValue *source, QkvValue *src_valid,
                          gint64 first_position, QkvValue **weights, GError **error)
{
  if (weights != NULL) /* a failure leaves out-values NULL */
    *weights = NULL;
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  g_return_val_if_fail(name != NULL && cfg != NULL, NULL);
  if (weights != NULL)
    *weights = NULL;
  BUILDER_RETURN_IF_INVALID(b, error);
  if (queries == NULL || source == NULL)
    return NULL;
  const gchar *me = "qkv_build_luong_attention";
  if (!check_attention_config(me, "cfg", cfg, error) ||
      !check_attention_inputs(me, name, queries, source, src_valid, error))
    return NULL;
  QkvBuilderMark mark;
  qkv_builder_begin(b, &mark);
  Luong a;
  QkvValue *w = NULL, *context = NULL;
  if (luong_prepare(b, name, cfg, source, src_valid, &a, error))
    context = luong_attend(
        b, &a, queries,
        luong_target_positions(b, &a, first_position, qkv_value_shape(queries)->dims[1], error),
        weights ? &w : NULL, error);
  context = qkv_builder_end(b, &mark, context);
  if (context != NULL && weights != NULL)
    *weights = w;
  return context;
}

QkvValue *
luong_attentional(QkvBuilder *b, const gchar *name, QkvValue *context, QkvValue *h, GError **error)
{
  QkvValue *pair[] = {context, h};
  return qkv_tanh(qkv_build_linear(b, name, qkv_concat(pair, 2, -1, error),
                                   qkv_value_shape(h)->dims[qkv_value_shape(h)->rank - 1], FALSE,
                                   error),
                  error);
}

QkvValue *
qkv_build_luong_attentional(QkvBuilder *b, const gchar *name, QkvValue *context, QkvValue *h,
                            GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  BUILDER_RETURN_IF_INVALID(b, error);
  g_return_val_if_fail(name != NULL, NULL);
  if (context == NULL || h == NULL)
    return NULL;
  QkvBuilderMark mark;
  qkv_builder_begin(b, &mark);
  return qkv_builder_end(b, &mark, luong_attentional(b, name, context, h, error));
}

static QkvValue *
luong_seq2seq(QkvBuilder *b, const QkvLuongConfig *cfg, QkvValue *src, QkvValue *src_valid,
              QkvValue *dec_in, QkvValue **weights, GError **error)
{
  const gint64 H = cfg->num_hiddens, E = cfg->embed_size;
  const gint L = cfg->num_layers, perm_tb[] = {1, 0, 2}, step_axis = 1;

  /* encoder: as the book's Seq2SeqEncoder; outputs (B, S, H), state (L, B, H) */
  QkvValue *emb = qkv_build_embedding(b, "encoder.embedding", src, cfg->src_vocab, E, error);
  QkvValue *state = NULL;
  QkvValue *enc = qkv_build_gru(b, "encoder.rnn", qkv_permute(emb, perm_tb, 3, error), NULL, H, L,
                                cfg->dropout, &state, error);
  QkvValue *enc_outputs = qkv_permute(enc, perm_tb, 3, error);
  QkvValue *demb = qkv_build_embedding(b, "decoder.embedding", dec_in, cfg->tgt_vocab, E, error);
  if (enc_outputs == NULL || demb == NULL)
    return NULL;

  QkvValue *attn_vec; /* ã, (B, T, H) */
  if (!cfg->input_feeding) {
    /* the decoder's states do not depend on the attention: run the GRU over
     * every step, then attend for all steps at once */
    QkvValue *dec = qkv_build_gru(b, "decoder.rnn", qkv_permute(demb, perm_tb, 3, error), state, H,
                                  L, cfg->dropout, NULL, error);
    QkvValue *h = qkv_permute(dec, perm_tb, 3, error);
    Luong a;
    if (h == NULL ||
        !luong_prepare(b, "decoder.attention", &cfg->attention, enc_outputs, src_valid, &a, error))
      return NULL;
    QkvValue *context =
        luong_attend(b, &a, h, luong_target_positions(b, &a, 0, qkv_value_shape(h)->dims[1], error),
                     weights, error);
    attn_vec = luong_attentional(b, "decoder.W_c", context, h, error);
  } else {
    g_autofree GruLayer *layers = g_new0(GruLayer, L);
    for (gint k = 0; k < L; k++)
      if (!gru_layer_params(b, "decoder.rnn", k, k == 0 ? E + H : H, H, &layers[k], error))
        return NULL;
    Luong a;
    if (!luong_prepare(b, "decoder.attention", &cfg->attention, enc_outputs, src_valid, &a, error))
      return NULL;
    /* layer 0 reads [embedding; ã_{t-1}]: the embedding's share of the input
     * projection for every step at once, ã's per step (none at t = 0, where
     * ã_0 = 0: leaving it out keeps the shapes relative to the input's) */
    QkvValue *gi_emb =
        qkv_add(qkv_matmul(demb, qkv_slice(layers[0].w_ih, -1, 0, E, error), FALSE, TRUE, error),
                layers[0].b_ih, error); /* (B, T, 3H) */
    QkvValue *w_feed = qkv_slice(layers[0].w_ih, -1, E, E + H, error);
    const gint64 steps = qkv_value_shape(dec_in)->dims[1];
    g_autofree QkvValue **hidden = g_new0(QkvValue *, L);
    for (gint k = 0; k < L; k++)
      hidden[k] = gru_state_row(state, k, error);
    g_autofree QkvValue **outs = g_new0(QkvValue *, steps);
    g_autofree QkvValue **step_weights = g_new0(QkvValue *, steps);
    QkvValue *prev = NULL; /* ã_{t-1}, (B, H) */
    for (gint64 t = 0; t < steps; t++) {
      QkvValue *gi =
          qkv_squeeze(qkv_slice(gi_emb, step_axis, t, t + 1, error), &step_axis, 1, error);
      if (prev != NULL)
        gi = qkv_add(gi, qkv_matmul(prev, w_feed, FALSE, TRUE, error), error);
      QkvValue *xt = NULL;
      for (gint k = 0; k < L; k++) {
        if (k > 0)
          gi = qkv_add(qkv_matmul(xt, layers[k].w_ih, FALSE, TRUE, error), layers[k].b_ih, error);
        if ((xt = hidden[k] = gru_cell(&layers[k], gi, hidden[k], H, error)) == NULL)
          return NULL; /* a NULL state would read as the zero state */
        if (cfg->dropout > 0 && k < L - 1)
          xt = qkv_dropout(xt, cfg->dropout, error);
      }
      QkvValue *query = qkv_unsqueeze(hidden[L - 1], step_axis, error); /* (B, 1, H) */
      QkvValue *context = luong_attend(b, &a, query, luong_target_positions(b, &a, t, 1, error),
                                       weights ? &step_weights[t] : NULL, error);
      outs[t] = luong_attentional(b, "decoder.W_c", context, query, error); /* (B, 1, H) */
      if ((prev = qkv_squeeze(outs[t], &step_axis, 1, error)) == NULL)
        return NULL;
    }
    attn_vec = qkv_concat(outs, (guint)steps, step_axis, error);
    if (weights != NULL)
      *weights = qkv_concat(step_weights, (guint)steps, step_axis, error);
  }
  return qkv_build_linear(b, "decoder.dense", attn_vec, cfg->tgt_vocab, TRUE, error);
}

QkvValue *
qkv_build_luong_seq2seq(QkvBuilder *b, const QkvLuongConfig *cfg, QkvValue *src,
                        QkvValue *src_valid, QkvValue *dec_in, QkvValue **weights, GError **error)
{
  if (weights != NULL) /* a failure leaves out-values NULL */
    *weights = NULL;
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  g_return_val_if_fail(cfg != NULL, NULL);
  if (weights != NULL)
    *weights = NULL;
  BUILDER_RETURN_IF_INVALID(b, error);
  if (src == NULL || src_valid == NULL || dec_in == NULL)
    return NULL;
  const gchar *me = "qkv_build_luong_seq2seq";
  if (!builder_check_positive(me, "cfg->src_vocab", cfg->src_vocab, error) ||
      !builder_check_positive(me, "cfg->tgt_vocab", cfg->tgt_vocab, error) ||
      !builder_check_positive(me, "cfg->embed_size", cfg->embed_size, error) ||
      !builder_check_positive(me, "cfg->num_hiddens", cfg->num_hiddens, error) ||
      !builder_check_positive(me, "cfg->num_layers", cfg->num_layers, error) ||
      !builder_check_dropout(me, "cfg->dropout", cfg->dropout, error) ||
      !check_attention_config(me, "cfg->attention", &cfg->attention, error))
    return NULL;
  const QkvShape *ds = qkv_value_shape(dec_in), *ss = qkv_value_shape(src);
  const QkvShape *vs = qkv_value_shape(src_valid);
  if (ds->rank != 2 || ds->dims[1] < 1 || ss->rank != 2 || ss->dims[1] < 1 || vs->rank != 1 ||
      qkv_value_dtype(src_valid) != QKV_I32 || vs->dims[0] != ss->dims[0]) {
    g_autofree gchar *d = qkv_shape_to_string(ds);
    g_autofree gchar *s = qkv_shape_to_string(ss);
    g_autofree gchar *v = qkv_shape_to_string(vs);
    g_set_error(error, QKV_ERROR, QKV_ERROR_SHAPE,
                "%s: src (B, T_src), src_valid i32 (B) and dec_in (B, T), T >= 1, expected; "
                "got %s, %s %s and %s",
                me, s, qkv_dtype_name(qkv_value_dtype(src_valid)), v, d);
    return NULL;
  }
  QkvBuilderMark mark;
  qkv_builder_begin(b, &mark);
  QkvValue *w = NULL;
  QkvValue *logits = luong_seq2seq(b, cfg, src, src_valid, dec_in, weights ? &w : NULL, error);
  logits = qkv_builder_end(b, &mark, logits);
  if (logits != NULL && weights != NULL)
    *weights = w;
  return logits;
}
