/* decode-luong.c: the step decoder of Luong's model (qkv_build_luong_seq2seq):
 * the book's GRU encoder once per sentence (decode_gru_encoder_plan), then
 * one plan run per token: the decoder GRU's layers step from the state the
 * last step left, the top layer's h_t attends over the encoder's outputs,
 * ã_t = tanh(W_c [c_t; h_t]) gives the logits and, with input feeding, is
 * fed back with the next token. Local-m centres its window on the step,
 * which comes in as an input, so one plan serves every step. */
#include <qkv/qkv.h>
#include <qkv/qkv-decode.h>

#include "decode/decode-internal.h"
#include "models/gru-internal.h"
#include "models/luong-internal.h"
#include "error-private.h"

/* Outputs: 0 logits (R, V), 1 the new state (L, R, H), 2 the attention
 * weights (R, 1, S), 3 with input feeding ã_t (1, R, H). */
static gboolean
luong_step_plan(QkvStepDecoder *d, QkvBuilder *b, gint n_threads, GError **error)
{
  const QkvLuongConfig *c = &d->lc;
  const gint64 H = c->num_hiddens, E = c->embed_size, R = d->max_rows, V = c->tgt_vocab;
  const gint L = c->num_layers, step_axis = 1;
  const gboolean feed = c->input_feeding;
  QkvGraph *g = b->graph;
  QkvShape r1 = QKV_SHAPE(R, 1), r = QKV_SHAPE(R), ss = QKV_SHAPE(L, R, H);
  QkvShape fs = QKV_SHAPE(1, R, H), es = QKV_SHAPE(R, d->src_len, H);
  QkvShape re = QKV_SHAPE(R, E), rh = QKV_SHAPE(R, H), rv = QKV_SHAPE(R, V);
  QkvShape ps = QKV_SHAPE(R, 1, 1);

  QkvValue *tokens = qkv_graph_input(g, "tokens", QKV_I32, &r1, error);
  QkvValue *state = tokens ? qkv_graph_input(g, "self_kv0", QKV_F32, &ss, error) : NULL;
  QkvValue *prev = state && feed ? qkv_graph_input(g, "self_kv1", QKV_F32, &fs, error) : NULL;
  QkvValue *enc =
      state && (prev || !feed) ? qkv_graph_input(g, "cross_kv0", QKV_F32, &es, error) : NULL;
  QkvValue *valid = enc ? qkv_graph_input(g, "src_valid", QKV_I32, &r, error) : NULL;
  QkvValue *target_pos = NULL;
  if (valid && c->attention.align == QKV_LUONG_LOCAL_M &&
      (target_pos = qkv_graph_input(g, "target_pos", QKV_F32, &ps, error)) == NULL)
    return FALSE;
  if (valid == NULL)
    return FALSE;

  g_autofree GruLayer *layers = g_new0(GruLayer, L);
  for (gint k = 0; k < L; k++)
    if (!gru_layer_params(b, "decoder.rnn", k, k == 0 ? E + (feed ? H : 0) : H, H, &layers[k],
                          error))
      return FALSE;
  Luong a;
  if (!luong_prepare(b, "decoder.attention", &c->attention, enc, valid, &a, error))
    return FALSE;
  QkvValue *emb = qkv_build_embedding(b, "decoder.embedding", tokens, V, E, error);
  emb = emb ? qkv_reshape(emb, &re, error) : NULL;
  /* layer 0's input projection: the embedding's columns of W_ih, and with
   * input feeding ã_{t-1}'s (zero at the first step, as the full graph's
   * ã_0 = 0) */
  QkvValue *w_emb = feed ? qkv_slice(layers[0].w_ih, -1, 0, E, error) : layers[0].w_ih;
  QkvValue *gi = emb && w_emb ? qkv_matmul(emb, w_emb, FALSE, TRUE, error) : NULL;
  gi = gi ? qkv_add(gi, layers[0].b_ih, error) : NULL;
  if (feed && gi != NULL) {
    QkvValue *w_feed = qkv_slice(layers[0].w_ih, -1, E, E + H, error);
    QkvValue *p = w_feed ? qkv_reshape(prev, &rh, error) : NULL;
    gi = p ? qkv_add(gi, qkv_matmul(p, w_feed, FALSE, TRUE, error), error) : NULL;
  }
  if (gi == NULL)
    return FALSE;
  g_autofree QkvValue **hidden = g_new0(QkvValue *, L);
  QkvValue *x = NULL;
  for (gint k = 0; k < L; k++) {
    if (k > 0)
      gi = qkv_add(qkv_matmul(x, layers[k].w_ih, FALSE, TRUE, error), layers[k].b_ih, error);
    QkvValue *h = gi ? gru_state_row(state, k, error) : NULL;
    if (h == NULL || (x = hidden[k] = gru_cell(&layers[k], gi, h, H, error)) == NULL)
      return FALSE;
  }
  QkvValue *query = qkv_unsqueeze(hidden[L - 1], step_axis, error); /* (R, 1, H) */
  QkvValue *weights = NULL;
  QkvValue *context = query ? luong_attend(b, &a, query, target_pos, &weights, error) : NULL;
  QkvValue *att = context ? luong_attentional(b, "decoder.W_c", context, query, error) : NULL;
  QkvValue *logits =
      att ? qkv_build_linear(b, "decoder.dense", att, V, TRUE, error) : NULL; /* (R, 1, V) */
  QkvValue *outs[] = {logits ? qkv_reshape(logits, &rv, error) : NULL,
                      logits ? gru_stack(hidden, (guint)L, 0, error) : NULL, weights,
                      feed && logits ? qkv_reshape(att, &fs, error) : NULL};
  if (outs[0] == NULL || outs[1] == NULL || (feed && outs[3] == NULL))
    return FALSE;
  d->step_plan = decode_compile(g, outs, feed ? 4 : 3, n_threads, error);
  return d->step_plan != NULL;
}

QkvStepDecoder *
qkv_step_decoder_new_luong(QkvParams *params, const QkvLuongConfig *config, gint max_rows,
                           gint64 src_len, gint max_len, gint n_threads, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  g_return_val_if_fail(params != NULL && config != NULL, NULL);
  const gchar *me = "qkv_step_decoder_new_luong";
  if ((guint)config->attention.score > QKV_LUONG_CONCAT ||
      (guint)config->attention.align > QKV_LUONG_LOCAL_P ||
      (config->attention.align != QKV_LUONG_GLOBAL && config->attention.window < 1)) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "%s: config needs a known score and alignment, and a window ≥ 1 for local "
                "attention",
                me);
    return NULL;
  }
  /* the GRU encoder and decoder have the sizes of the book's Bahdanau model */
  const QkvGruSeq2SeqConfig gc = {config->src_vocab,   config->tgt_vocab,  config->embed_size,
                                  config->num_hiddens, config->num_layers, 0.0};
  g_autoptr(QkvStepDecoder) d = decode_new_gru(me, &gc, max_rows, src_len, max_len, error);
  if (d == NULL)
    return NULL;
  d->luong = TRUE;
  d->lc = *config;
  d->lc.dropout = 0.0;

  if (!decode_build_plans(d, params, me, decode_gru_encoder_plan, luong_step_plan, n_threads,
                          error))
    return NULL;
  const gint64 H = config->num_hiddens;
  d->n_self = config->input_feeding ? 2 : 1;
  d->n_cross = 1;
  d->self = g_new0(QkvTensor *, d->n_self);
  d->cross = g_new0(QkvTensor *, 1);
  d->self[0] = decode_new_tensor(QKV_F32, QKV_SHAPE(config->num_layers, max_rows, H), error);
  if (d->self[0] != NULL && config->input_feeding)
    d->self[1] = decode_new_tensor(QKV_F32, QKV_SHAPE(1, max_rows, H), error);
  if (d->self[d->n_self - 1] == NULL ||
      (d->cross[0] = decode_new_tensor(QKV_F32, QKV_SHAPE(max_rows, src_len, H), error)) == NULL)
    return NULL;
  if (config->attention.align == QKV_LUONG_LOCAL_M &&
      (d->target_pos = decode_new_tensor(QKV_F32, QKV_SHAPE(max_rows, 1, 1), error)) == NULL)
    return NULL;
  d->scratch = g_try_malloc(qkv_tensor_nbytes(d->self[0]));
  if (d->scratch == NULL) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_MEMORY, "%s: no memory for a state copy", me);
    return NULL;
  }
  QkvPlan *sp = d->step_plan, *ep = d->enc_plan;
  if (!qkv_plan_bind(ep, "src", d->src, error) || !qkv_plan_bind(sp, "tokens", d->tokens, error) ||
      !qkv_plan_bind(sp, "src_valid", d->row_valid, error) ||
      (d->target_pos != NULL && !qkv_plan_bind(sp, "target_pos", d->target_pos, error)) ||
      !decode_bind_all(sp, "self_kv", d->self, d->n_self, error) ||
      !decode_bind_all(sp, "cross_kv", d->cross, 1, error))
    return NULL;
  return g_steal_pointer(&d);
}
