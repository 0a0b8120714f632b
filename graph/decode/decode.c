/* decode.c: step decoders (qkv-decode.h): the book's Transformer and its
 * Bahdanau-attention GRU decoder, each as two compiled plans built from the
 * parameters the training graph uses:
 *
 *  - an encoder plan, run once per batch of sentences, on rows (each
 *    sentence repeated for its beam slots): the Transformer's encoder and,
 *    for every decoder block, the encoder-decoder attention's keys and
 *    values (enc · W_kᵀ, enc · W_vᵀ split into heads), which the full
 *    decoder recomputes at every step; the GRU encoder's outputs and state;
 *  - a step plan, run once per emitted token, taking one token per row.
 *
 * The Transformer's step plan keeps, per block, the self-attention keys and
 * values of the tokens decoded so far in a cache of max_len positions bound
 * as an input, (rows, heads, max_len, d_head). The current token's own key
 * and value are outputs of the step: its query attends to them and to the
 * cache, as the scores [q·k_new, q·K_cache] masked to the first step + 1
 * (valid lengths: the new key first, then the step cached ones). After the
 * run the host writes k_new and v_new into the cache at position step, so
 * a step costs one token's projections and a pass over max_len cached keys,
 * however long the output has grown. The token's position comes in as an
 * input of positional_encoding.
 *
 * Every shape is fixed when compiled (max_rows, src_len, max_len): a smaller
 * batch runs on padded rows, a shorter source on padded columns that the
 * valid lengths mask. Nothing is allocated per step. */
#include <math.h>
#include <qkv/qkv.h>
#include <qkv/qkv-decode.h>
#include <string.h>

#include "decode/decode-internal.h"
#include "models/transformer-internal.h"
#include "error-private.h"

static void
tensors_free(QkvTensor **t, gint n)
{
  for (gint i = 0; t != NULL && i < n; i++)
    qkv_tensor_free(t[i]);
  g_free(t);
}

void
qkv_step_decoder_free(QkvStepDecoder *d)
{
  if (d == NULL)
    return;
  qkv_plan_free(d->enc_plan);
  qkv_graph_free(d->enc_graph);
  qkv_plan_free(d->step_plan);
  qkv_graph_free(d->step_graph);
  qkv_tensor_free(d->src);
  qkv_tensor_free(d->src_valid);
  qkv_tensor_free(d->tokens);
  qkv_tensor_free(d->row_valid);
  qkv_tensor_free(d->positions);
  qkv_tensor_free(d->self_valid);
  qkv_tensor_free(d->target_pos);
  tensors_free(d->self, d->n_self);
  tensors_free(d->cross, d->n_cross);
  g_free(d->scratch);
  g_free(d);
}

gint64
qkv_step_decoder_vocab(const QkvStepDecoder *d)
{
  g_return_val_if_fail(d != NULL, 0);
  return d->vocab;
}

/* A step decoder must not make up weights: building found every parameter
 * it asked for, or the ones it created are removed again and named. */
static gboolean
decode_params_all_found(QkvParams *params, const QkvParamsMark *mark, guint n_before,
                        const gchar *me, GError **error)
{
  if (qkv_params_size(params) == n_before)
    return TRUE;
  g_set_error(error, QKV_ERROR, QKV_ERROR_NOT_FOUND, "%s: parameter '%s' is not in the store", me,
              qkv_param_name(qkv_params_nth(params, n_before)));
  qkv_params_rollback(params, mark);
  return FALSE;
}

QkvTensor *
decode_new_tensor(QkvDType dtype, QkvShape shape, GError **error)
{
  return qkv_tensor_try_new(dtype, &shape, error);
}

QkvPlan *
decode_compile(QkvGraph *g, QkvValue *const *outs, guint n, gint n_threads, GError **error)
{
  for (guint i = 0; i < n; i++)
    if (outs[i] == NULL)
      return NULL;
  QkvPlanOptions o = qkv_plan_options_default();
  o.n_threads = n_threads;
  return qkv_graph_compile(g, outs, n, &o, error);
}

gboolean
decode_bind_all(QkvPlan *plan, const gchar *prefix, QkvTensor **t, gint n, GError **error)
{
  for (gint i = 0; i < n; i++) {
    g_autofree gchar *name = g_strdup_printf("%s%d", prefix, i);
    if (!qkv_plan_bind(plan, name, t[i], error))
      return FALSE;
  }
  return TRUE;
}

/* ---- the Transformer ---------------------------------------------------- */

static QkvValue *
weight(QkvBuilder *b, const gchar *block, const gchar *what, gint64 out, gint64 in, GError **error)
{
  g_autofree gchar *name = g_strdup_printf("%s.%s.weight", block, what);
  QkvShape s = QKV_SHAPE(out, in);
  return qkv_build_param(b, name, &s, "linear_weight", in, error);
}

/* A projection of an attention: its weight and, with attention biases,
 * its bias (else NULL). FALSE when a parameter is missing. */
typedef struct {
  QkvValue *w, *bias;
} Projection;

static gboolean
projection(QkvBuilder *b, const QkvTransformerConfig *c, const gchar *attention, const gchar *what,
           Projection *p, GError **error)
{
  const gint64 D = c->num_hiddens;
  p->w = weight(b, attention, what, D, D, error);
  p->bias = NULL;
  if (p->w == NULL || !c->attention_bias)
    return p->w != NULL;
  g_autofree gchar *name = g_strdup_printf("%s.%s.bias", attention, what);
  QkvShape s = QKV_SHAPE(D);
  p->bias = qkv_build_param(b, name, &s, "linear_bias", D, error);
  return p->bias != NULL;
}

/* x · wᵀ (+ bias): an attention's input or output projection. */
static QkvValue *
project(QkvValue *x, const Projection *p, GError **error)
{
  QkvValue *y = x ? qkv_matmul(x, p->w, FALSE, TRUE, error) : NULL;
  return y && p->bias ? qkv_add(y, p->bias, error) : y;
}

/* x (R, n, d) · wᵀ (+ bias) split into heads: (R, heads, n, d_head). */
static QkvValue *
project_heads(QkvValue *x, const Projection *p, gint heads, GError **error)
{
  const QkvShape *s = qkv_value_shape(x);
  gint64 rows = s->dims[0], n = s->dims[1], d = s->dims[2];
  QkvValue *y = project(x, p, error);
  if (n == 1) { /* (R, 1, d) is already (R, heads, 1, d_head) in memory */
    QkvShape hs = QKV_SHAPE(rows, heads, 1, d / heads);
    return y ? qkv_reshape(y, &hs, error) : NULL;
  }
  QkvShape split = QKV_SHAPE(rows, n, heads, d / heads);
  const gint perm[] = {0, 2, 1, 3};
  y = y ? qkv_reshape(y, &split, error) : NULL;
  return y ? qkv_permute(y, perm, 4, error) : NULL;
}

/* The encoder plan: src (R, S), src_valid (R) → per block k then v of
 * attention2, (R, heads, S, d_head). */
static gboolean
transformer_encoder_plan(QkvStepDecoder *d, QkvBuilder *b, gint n_threads, GError **error)
{
  const QkvTransformerConfig *c = &d->tc;
  QkvShape rs = QKV_SHAPE(d->max_rows, d->src_len), r = QKV_SHAPE(d->max_rows);
  QkvValue *src = qkv_graph_input(b->graph, "src", QKV_I32, &rs, error);
  QkvValue *valid = src ? qkv_graph_input(b->graph, "src_valid", QKV_I32, &r, error) : NULL;
  QkvValue *enc = valid ? qkv_build_transformer_encoder(b, c, src, valid, error) : NULL;
  g_autofree QkvValue **outs = g_new0(QkvValue *, 2 * c->num_layers);
  for (gint i = 0; enc != NULL && i < c->num_layers; i++) {
    g_autofree gchar *att = g_strdup_printf("decoder.blks.block%d.attention2", i);
    Projection k, v;
    if (!projection(b, c, att, "W_k", &k, error) || !projection(b, c, att, "W_v", &v, error))
      return FALSE;
    outs[2 * i] = project_heads(enc, &k, c->num_heads, error);
    outs[2 * i + 1] = outs[2 * i] ? project_heads(enc, &v, c->num_heads, error) : NULL;
    if (outs[2 * i + 1] == NULL)
      return FALSE;
  }
  if (enc == NULL)
    return FALSE;
  d->enc_plan = decode_compile(b->graph, outs, 2 * c->num_layers, n_threads, error);
  return d->enc_plan != NULL;
}

/* Block i's self-attention for one token per row, h (R, 1, d) its input,
 * over [this token, the cached ones] masked to self_valid: the output
 * (R, 1, d) after W_o; new_kv gets k_new and v_new (R, heads, 1, d_head). */
static QkvValue *
step_self_attention(QkvStepDecoder *d, QkvBuilder *b, gint i, QkvValue *h, QkvValue *self_valid,
                    QkvValue **new_kv, GError **error)
{
  const QkvTransformerConfig *c = &d->tc;
  const gint64 D = c->num_hiddens, R = d->max_rows;
  const gint H = c->num_heads;
  g_autofree gchar *att = g_strdup_printf("decoder.blks.block%d.attention1", i);
  g_autofree gchar *kc_name = g_strdup_printf("self_kv%d", 2 * i);
  g_autofree gchar *vc_name = g_strdup_printf("self_kv%d", 2 * i + 1);
  QkvShape cache = QKV_SHAPE(R, H, d->max_len, D / H), row = QKV_SHAPE(R, 1, D);
  QkvValue *kc = qkv_graph_input(b->graph, kc_name, QKV_F32, &cache, error);
  QkvValue *vc = kc ? qkv_graph_input(b->graph, vc_name, QKV_F32, &cache, error) : NULL;
  Projection pq, pk, pv, po;
  if (vc == NULL || !projection(b, c, att, "W_q", &pq, error) ||
      !projection(b, c, att, "W_k", &pk, error) || !projection(b, c, att, "W_v", &pv, error) ||
      !projection(b, c, att, "W_o", &po, error))
    return NULL;
  QkvValue *q = project_heads(h, &pq, H, error);
  new_kv[0] = q ? project_heads(h, &pk, H, error) : NULL;
  new_kv[1] = new_kv[0] ? project_heads(h, &pv, H, error) : NULL;
  QkvValue *s_new = new_kv[1] ? qkv_matmul(q, new_kv[0], FALSE, TRUE, error) : NULL;
  QkvValue *s_old = s_new ? qkv_matmul(q, kc, FALSE, TRUE, error) : NULL;
  QkvValue *parts[] = {s_new, s_old};
  QkvValue *s = s_old ? qkv_concat(parts, 2, -1, error) : NULL;
  s = s ? qkv_scale(s, 1.0 / sqrt((double)(D / H)), error) : NULL;
  QkvValue *w = s ? qkv_masked_softmax(s, self_valid, FALSE, error) : NULL;
  QkvValue *w_new = w ? qkv_slice(w, -1, 0, 1, error) : NULL;
  QkvValue *w_old = w_new ? qkv_slice(w, -1, 1, (gint64)d->max_len + 1, error) : NULL;
  QkvValue *o_new = w_old ? qkv_matmul(w_new, new_kv[1], FALSE, FALSE, error) : NULL;
  QkvValue *o_old = o_new ? qkv_matmul(w_old, vc, FALSE, FALSE, error) : NULL;
  QkvValue *a = o_old ? qkv_add(o_old, o_new, error) : NULL;
  a = a ? qkv_reshape(a, &row, error) : NULL;
  return project(a, &po, error);
}

/* Block i's encoder-decoder attention for h (R, 1, d) on the keys and
 * values of the encoder plan: the output (R, 1, d) after W_o; *cross_w
 * gets its weights (R, heads, 1, S). */
static QkvValue *
step_cross_attention(QkvStepDecoder *d, QkvBuilder *b, gint i, QkvValue *h, QkvValue *src_valid,
                     QkvValue **cross_w, GError **error)
{
  const QkvTransformerConfig *c = &d->tc;
  const gint64 D = c->num_hiddens, R = d->max_rows;
  const gint H = c->num_heads;
  g_autofree gchar *att = g_strdup_printf("decoder.blks.block%d.attention2", i);
  g_autofree gchar *kx_name = g_strdup_printf("cross_kv%d", 2 * i);
  g_autofree gchar *vx_name = g_strdup_printf("cross_kv%d", 2 * i + 1);
  QkvShape xs = QKV_SHAPE(R, H, d->src_len, D / H), row = QKV_SHAPE(R, 1, D);
  QkvValue *kx = qkv_graph_input(b->graph, kx_name, QKV_F32, &xs, error);
  QkvValue *vx = kx ? qkv_graph_input(b->graph, vx_name, QKV_F32, &xs, error) : NULL;
  Projection pq, po;
  if (vx == NULL || !projection(b, c, att, "W_q", &pq, error) ||
      !projection(b, c, att, "W_o", &po, error))
    return NULL;
  QkvValue *q = project_heads(h, &pq, H, error);
  QkvValue *s = q ? qkv_matmul(q, kx, FALSE, TRUE, error) : NULL;
  s = s ? qkv_scale(s, 1.0 / sqrt((double)(D / H)), error) : NULL;
  *cross_w = s ? qkv_masked_softmax(s, src_valid, FALSE, error) : NULL;
  QkvValue *a = *cross_w ? qkv_matmul(*cross_w, vx, FALSE, FALSE, error) : NULL;
  a = a ? qkv_reshape(a, &row, error) : NULL;
  return project(a, &po, error);
}

/* One decoder block for one token per row, as the full decoder's (post-LN
 * or pre-LN, transformer_sublayer_in/out). x (R, 1, d). new_kv gets k_new
 * and v_new (R, heads, 1, d_head), *cross_w the block's encoder-decoder
 * attention weights (R, heads, 1, S). */
static QkvValue *
transformer_step_block(QkvStepDecoder *d, QkvBuilder *b, gint i, QkvValue *x, QkvValue *self_valid,
                       QkvValue *src_valid, QkvValue **new_kv, QkvValue **cross_w, GError **error)
{
  const QkvTransformerConfig *c = &d->tc;
  g_autofree gchar *blk = g_strdup_printf("decoder.blks.block%d", i);
  g_autofree gchar *an1 = g_strconcat(blk, ".addnorm1", NULL);
  g_autofree gchar *an2 = g_strconcat(blk, ".addnorm2", NULL);
  g_autofree gchar *an3 = g_strconcat(blk, ".addnorm3", NULL);
  g_autofree gchar *ffn = g_strconcat(blk, ".ffn", NULL);
  QkvValue *h = transformer_sublayer_in(b, c, an1, x, error);
  QkvValue *a = h ? step_self_attention(d, b, i, h, self_valid, new_kv, error) : NULL;
  QkvValue *y = a ? transformer_sublayer_out(b, c, an1, x, a, error) : NULL;
  h = y ? transformer_sublayer_in(b, c, an2, y, error) : NULL;
  QkvValue *a2 = h ? step_cross_attention(d, b, i, h, src_valid, cross_w, error) : NULL;
  QkvValue *z = a2 ? transformer_sublayer_out(b, c, an2, y, a2, error) : NULL;
  h = z ? transformer_sublayer_in(b, c, an3, z, error) : NULL;
  QkvValue *f = h ? qkv_build_ffn_activation(b, ffn, h, c->ffn_hiddens, c->num_hiddens,
                                             c->ffn_activation, error)
                  : NULL;
  return f ? transformer_sublayer_out(b, c, an3, z, f, error) : NULL;
}

/* Step plan outputs: 0 logits (R, V); then per block k_new, v_new; then per
 * block the cross-attention weights. */
static gboolean
transformer_step_plan(QkvStepDecoder *d, QkvBuilder *b, gint n_threads, GError **error)
{
  const QkvTransformerConfig *c = &d->tc;
  const gint L = c->num_layers;
  QkvGraph *g = b->graph;
  QkvShape r1 = QKV_SHAPE(d->max_rows, 1), r = QKV_SHAPE(d->max_rows);
  QkvShape logits_shape = QKV_SHAPE(d->max_rows, c->tgt_vocab);
  QkvValue *tokens = qkv_graph_input(g, "tokens", QKV_I32, &r1, error);
  QkvValue *positions = tokens ? qkv_graph_input(g, "positions", QKV_I32, &r, error) : NULL;
  QkvValue *self_valid = positions ? qkv_graph_input(g, "self_valid", QKV_I32, &r, error) : NULL;
  QkvValue *src_valid = self_valid ? qkv_graph_input(g, "src_valid", QKV_I32, &r, error) : NULL;
  QkvValue *x = src_valid ? qkv_build_embedding(b, transformer_embedding_name(c, "decoder"), tokens,
                                                c->tgt_vocab, c->num_hiddens, error)
                          : NULL;
  x = x ? qkv_scale(x, sqrt((double)c->num_hiddens), error) : NULL;
  x = x ? qkv_positional_encoding_at(x, positions, 0.0, 0, error) : NULL;
  g_autofree QkvValue **outs = g_new0(QkvValue *, 1 + 3 * L);
  for (gint i = 0; x != NULL && i < L; i++)
    x = transformer_step_block(d, b, i, x, self_valid, src_valid, &outs[1 + 2 * i],
                               &outs[1 + 2 * L + i], error);
  x = x ? transformer_final_norm(b, c, "decoder", x, error) : NULL;
  QkvValue *logits = transformer_output(b, c, x, error);
  outs[0] = logits ? qkv_reshape(logits, &logits_shape, error) : NULL;
  if (outs[0] == NULL)
    return FALSE;
  d->step_plan = decode_compile(g, outs, 1 + 3 * L, n_threads, error);
  return d->step_plan != NULL;
}

static gboolean
decode_common_tensors(QkvStepDecoder *d, GError **error)
{
  d->src = decode_new_tensor(QKV_I32, QKV_SHAPE(d->max_rows, d->src_len), error);
  d->src_valid = d->src ? decode_new_tensor(QKV_I32, QKV_SHAPE(d->max_rows), error) : NULL;
  d->tokens = d->src_valid ? decode_new_tensor(QKV_I32, QKV_SHAPE(d->max_rows, 1), error) : NULL;
  d->row_valid = d->tokens ? decode_new_tensor(QKV_I32, QKV_SHAPE(d->max_rows), error) : NULL;
  return d->row_valid != NULL;
}

gboolean
decode_build_plans(QkvStepDecoder *d, QkvParams *params, const gchar *me, DecodePlanFunc encoder,
                   DecodePlanFunc step, gint n_threads, GError **error)
{
  QkvParamsMark mark;
  qkv_params_mark(params, &mark);
  guint n_before = qkv_params_size(params);
  d->enc_graph = qkv_graph_new();
  d->step_graph = qkv_graph_new();
  QkvBuilder eb = {.graph = d->enc_graph, .params = params};
  QkvBuilder sb = {.graph = d->step_graph, .params = params};
  if (!encoder(d, &eb, n_threads, error) || !step(d, &sb, n_threads, error)) {
    qkv_params_rollback(params, &mark);
    return FALSE;
  }
  return decode_params_all_found(params, &mark, n_before, me, error) &&
         decode_common_tensors(d, error);
}

QkvStepDecoder *
qkv_step_decoder_new_transformer(QkvParams *params, const QkvTransformerConfig *config,
                                 gint max_rows, gint64 src_len, gint max_len, gint n_threads,
                                 GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  g_return_val_if_fail(params != NULL && config != NULL, NULL);
  const gchar *me = "qkv_step_decoder_new_transformer";
  if (!decode_check_transformer(me, config, max_rows, src_len, max_len, error))
    return NULL;
  g_autoptr(QkvStepDecoder) d = g_new0(QkvStepDecoder, 1);
  d->transformer = TRUE;
  d->tc = *config;
  d->tc.dropout = 0.0;
  d->max_rows = max_rows;
  d->src_len = src_len;
  d->max_len = max_len;
  d->num_layers = config->num_layers;
  d->vocab = config->tgt_vocab;

  if (!decode_build_plans(d, params, me, transformer_encoder_plan, transformer_step_plan, n_threads,
                          error))
    return NULL;
  const gint L = d->num_layers, H = config->num_heads;
  const gint64 dh = config->num_hiddens / H;
  d->positions = decode_new_tensor(QKV_I32, QKV_SHAPE(max_rows), error);
  d->self_valid = d->positions ? decode_new_tensor(QKV_I32, QKV_SHAPE(max_rows), error) : NULL;
  if (d->self_valid == NULL)
    return NULL;
  d->n_self = d->n_cross = 2 * L;
  d->self = g_new0(QkvTensor *, 2 * L);
  d->cross = g_new0(QkvTensor *, 2 * L);
  for (gint i = 0; i < 2 * L; i++) {
    d->self[i] = decode_new_tensor(QKV_F32, QKV_SHAPE(max_rows, H, max_len, dh), error);
    d->cross[i] =
        d->self[i] ? decode_new_tensor(QKV_F32, QKV_SHAPE(max_rows, H, src_len, dh), error) : NULL;
    if (d->cross[i] == NULL)
      return NULL;
  }
  d->scratch = g_try_malloc(qkv_tensor_nbytes(d->self[0]));
  if (d->scratch == NULL) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_MEMORY, "%s: no memory for a cache copy", me);
    return NULL;
  }
  QkvPlan *sp = d->step_plan, *ep = d->enc_plan;
  if (!qkv_plan_bind(ep, "src", d->src, error) ||
      !qkv_plan_bind(ep, "src_valid", d->src_valid, error) ||
      !qkv_plan_bind(sp, "tokens", d->tokens, error) ||
      !qkv_plan_bind(sp, "positions", d->positions, error) ||
      !qkv_plan_bind(sp, "self_valid", d->self_valid, error) ||
      !qkv_plan_bind(sp, "src_valid", d->row_valid, error) ||
      !decode_bind_all(sp, "self_kv", d->self, 2 * L, error) ||
      !decode_bind_all(sp, "cross_kv", d->cross, 2 * L, error))
    return NULL;
  return g_steal_pointer(&d);
}

/* ---- Bahdanau ------------------------------------------------------------ */

/* src (R, S), src_valid (R) → outputs 0 the encoder outputs (R, S, H), 1 its
 * state (L, R, H). */
gboolean
decode_gru_encoder_plan(QkvStepDecoder *d, QkvBuilder *b, gint n_threads, GError **error)
{
  const QkvGruSeq2SeqConfig *c = &d->gc;
  const gint perm_tb[] = {1, 0, 2};
  QkvShape rs = QKV_SHAPE(d->max_rows, d->src_len);
  QkvValue *src = qkv_graph_input(b->graph, "src", QKV_I32, &rs, error);
  QkvValue *emb =
      src ? qkv_build_embedding(b, "encoder.embedding", src, c->src_vocab, c->embed_size, error)
          : NULL;
  QkvValue *x = emb ? qkv_permute(emb, perm_tb, 3, error) : NULL;
  QkvValue *state = NULL;
  QkvValue *enc = x ? qkv_build_gru(b, "encoder.rnn", x, NULL, c->num_hiddens, c->num_layers, 0.0,
                                    &state, error)
                    : NULL;
  QkvValue *outs[] = {enc ? qkv_permute(enc, perm_tb, 3, error) : NULL, state};
  if (outs[0] == NULL)
    return FALSE;
  d->enc_plan = decode_compile(b->graph, outs, 2, n_threads, error);
  return d->enc_plan != NULL;
}

/* Outputs: 0 logits (R, V), 1 the new state (L, R, H), 2 the attention
 * weights (R, 1, S). */
static gboolean
bahdanau_step_plan(QkvStepDecoder *d, QkvBuilder *b, gint n_threads, GError **error)
{
  const QkvGruSeq2SeqConfig *c = &d->gc;
  const gint64 H = c->num_hiddens, E = c->embed_size, R = d->max_rows;
  const gint L = c->num_layers;
  QkvGraph *g = b->graph;
  QkvShape r1 = QKV_SHAPE(R, 1), r = QKV_SHAPE(R), ss = QKV_SHAPE(L, R, H);
  QkvShape es = QKV_SHAPE(R, d->src_len, H), qs = QKV_SHAPE(R, 1, H);
  QkvShape xs = QKV_SHAPE(1, R, H + E), hs = QKV_SHAPE(R, H);
  QkvShape hh = QKV_SHAPE(H, H), vh = QKV_SHAPE(1, H);
  QkvValue *tokens = qkv_graph_input(g, "tokens", QKV_I32, &r1, error);
  QkvValue *state = tokens ? qkv_graph_input(g, "self_kv0", QKV_F32, &ss, error) : NULL;
  QkvValue *enc = state ? qkv_graph_input(g, "cross_kv0", QKV_F32, &es, error) : NULL;
  QkvValue *valid = enc ? qkv_graph_input(g, "src_valid", QKV_I32, &r, error) : NULL;
  QkvValue *w_k =
      valid ? qkv_build_param(b, "decoder.attention.W_k.weight", &hh, "linear_weight", H, error)
            : NULL;
  QkvValue *w_q =
      w_k ? qkv_build_param(b, "decoder.attention.W_q.weight", &hh, "linear_weight", H, error)
          : NULL;
  QkvValue *w_v =
      w_q ? qkv_build_param(b, "decoder.attention.w_v.weight", &vh, "linear_weight", H, error)
          : NULL;
  /* the query is the top layer's state, as the book's decoder takes it */
  QkvValue *top = w_v ? qkv_slice(state, 0, L - 1, L, error) : NULL;
  QkvValue *query = top ? qkv_reshape(top, &qs, error) : NULL;
  QkvValue *weights = NULL;
  QkvValue *context =
      query ? qkv_additive_attention(query, enc, enc, w_q, w_k, w_v, valid, 0.0, &weights, error)
            : NULL;
  QkvValue *e =
      context ? qkv_build_embedding(b, "decoder.embedding", tokens, c->tgt_vocab, E, error) : NULL;
  QkvValue *pair[] = {context, e};
  QkvValue *x = e ? qkv_concat(pair, 2, -1, error) : NULL;
  x = x ? qkv_reshape(x, &xs, error) : NULL;
  QkvValue *h_n = NULL;
  QkvValue *out = x ? qkv_build_gru(b, "decoder.rnn", x, state, H, L, 0.0, &h_n, error) : NULL;
  out = out ? qkv_reshape(out, &hs, error) : NULL;
  QkvValue *outs[] = {out ? qkv_build_linear(b, "decoder.dense", out, c->tgt_vocab, TRUE, error)
                          : NULL,
                      h_n, weights};
  if (outs[0] == NULL)
    return FALSE;
  d->step_plan = decode_compile(g, outs, 3, n_threads, error);
  return d->step_plan != NULL;
}

QkvStepDecoder *
decode_new_gru(const gchar *me, const QkvGruSeq2SeqConfig *config, gint max_rows, gint64 src_len,
               gint max_len, GError **error)
{
  if (!decode_check_gru(me, config, max_rows, src_len, max_len, error))
    return NULL;
  QkvStepDecoder *d = g_new0(QkvStepDecoder, 1);
  d->gc = *config;
  d->gc.dropout = 0.0;
  d->max_rows = max_rows;
  d->src_len = src_len;
  d->max_len = max_len;
  d->num_layers = config->num_layers;
  d->vocab = config->tgt_vocab;
  return d;
}

QkvStepDecoder *
qkv_step_decoder_new_bahdanau(QkvParams *params, const QkvGruSeq2SeqConfig *config, gint max_rows,
                              gint64 src_len, gint max_len, gint n_threads, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  g_return_val_if_fail(params != NULL && config != NULL, NULL);
  const gchar *me = "qkv_step_decoder_new_bahdanau";
  g_autoptr(QkvStepDecoder) d = decode_new_gru(me, config, max_rows, src_len, max_len, error);
  if (d == NULL)
    return NULL;

  if (!decode_build_plans(d, params, me, decode_gru_encoder_plan, bahdanau_step_plan, n_threads,
                          error))
    return NULL;
  d->n_self = d->n_cross = 1;
  d->self = g_new0(QkvTensor *, 1);
  d->cross = g_new0(QkvTensor *, 1);
  d->self[0] = decode_new_tensor(
      QKV_F32, QKV_SHAPE(config->num_layers, max_rows, config->num_hiddens), error);
  d->cross[0] =
      d->self[0]
          ? decode_new_tensor(QKV_F32, QKV_SHAPE(max_rows, src_len, config->num_hiddens), error)
          : NULL;
  if (d->cross[0] == NULL)
    return NULL;
  d->scratch = g_malloc(qkv_tensor_nbytes(d->self[0]));
  QkvPlan *sp = d->step_plan, *ep = d->enc_plan;
  if (!qkv_plan_bind(ep, "src", d->src, error) || !qkv_plan_bind(sp, "tokens", d->tokens, error) ||
      !qkv_plan_bind(sp, "src_valid", d->row_valid, error) ||
      !decode_bind_all(sp, "self_kv", d->self, 1, error) ||
      !decode_bind_all(sp, "cross_kv", d->cross, 1, error))
    return NULL;
  return g_steal_pointer(&d);
}

/* ---- running ------------------------------------------------------------- */

/* The decoder for one call in this thread, or a refusal at once: its
 * caches, staging tensors and plans are one set, which two threads would
 * overwrite under each other. */
static gboolean
decoder_acquire(QkvStepDecoder *d, const gchar *me, GError **error)
{
  if (g_atomic_int_compare_and_exchange(&d->busy, 0, 1))
    return TRUE;
  g_set_error(error, QKV_ERROR, QKV_ERROR_BUSY,
              "%s: the decoder is in use in another thread (a step decoder decodes for one "
              "thread at a time; make one per thread)",
              me);
  return FALSE;
}

static void
decoder_release(QkvStepDecoder *d)
{
  g_atomic_int_set(&d->busy, 0);
}

static gboolean
decoder_start(QkvStepDecoder *d, const QkvTensor *src, const QkvTensor *src_valid,
              gint rows_per_sentence, GError **error)
{
  const gchar *me = "qkv_step_decoder_start";
  d->rows = 0;
  const QkvShape *ss = qkv_tensor_shape(src), *vs = qkv_tensor_shape(src_valid);
  if (qkv_tensor_dtype(src) != QKV_I32 || qkv_tensor_dtype(src_valid) != QKV_I32 || ss->rank != 2 ||
      vs->rank != 1 || vs->dims[0] != ss->dims[0] || ss->dims[0] < 1 || ss->dims[1] < 1 ||
      ss->dims[1] > d->src_len) {
    g_autofree gchar *a = qkv_shape_to_string(ss);
    g_autofree gchar *b = qkv_shape_to_string(vs);
    g_set_error(error, QKV_ERROR, QKV_ERROR_SHAPE,
                "%s: src must be i32 (n, ≤ %" G_GINT64_FORMAT ") and src_valid i32 (n), got %s "
                "and %s",
                me, d->src_len, a, b);
    return FALSE;
  }
  const gint64 n = ss->dims[0], width = ss->dims[1];
  if (rows_per_sentence < 1 || n * rows_per_sentence > d->max_rows) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "%s: %" G_GINT64_FORMAT " sentences × %d rows each exceed the %d rows compiled", me,
                n, rows_per_sentence, d->max_rows);
    return FALSE;
  }
  const gint32 *sv = qkv_tensor_const_data(src_valid), *sd = qkv_tensor_const_data(src);
  gint32 *dst = qkv_tensor_i32(d->src), *dv = qkv_tensor_i32(d->src_valid);
  gint32 *rv = qkv_tensor_i32(d->row_valid);
  const gint rows = (gint)n * rows_per_sentence;
  /* rows past the last sentence's repeat it: the plans run on every row */
  for (gint r = 0; r < d->max_rows; r++) {
    gint64 s = MIN(r, rows - 1) / rows_per_sentence;
    gint32 *row = dst + (gsize)r * d->src_len;
    memcpy(row, sd + s * width, (gsize)width * sizeof(gint32));
    for (gint64 t = width; t < d->src_len; t++)
      row[t] = 0;
    dv[r] = rv[r] = CLAMP(sv[s], 0, (gint32)width);
  }
  if (!qkv_plan_run(d->enc_plan, error))
    return FALSE;
  for (gint i = 0; i < d->n_cross; i++) {
    const QkvTensor *o = qkv_plan_output(d->enc_plan, d->transformer ? (guint)i : 0);
    if (!qkv_tensor_copy_from(d->cross[i], o, error))
      return FALSE;
  }
  if (d->transformer) {
    /* positions past the step are masked; zeros keep them finite */
    for (gint i = 0; i < d->n_self; i++)
      qkv_tensor_fill(d->self[i], 0.0);
  } else {
    if (!qkv_tensor_copy_from(d->self[0], qkv_plan_output(d->enc_plan, 1), error))
      return FALSE;
    if (d->n_self > 1)
      qkv_tensor_fill(d->self[1], 0.0); /* ã_0 = 0 */
  }
  d->rows = rows;
  d->next_step = 0;
  d->stepped = FALSE;
  return TRUE;
}

gboolean
qkv_step_decoder_start(QkvStepDecoder *d, const QkvTensor *src, const QkvTensor *src_valid,
                       gint rows_per_sentence, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  g_return_val_if_fail(d != NULL && src != NULL && src_valid != NULL, FALSE);
  if (!decoder_acquire(d, "qkv_step_decoder_start", error))
    return FALSE;
  gboolean ok = decoder_start(d, src, src_valid, rows_per_sentence, error);
  decoder_release(d);
  return ok;
}

static gboolean
parents_identity(const gint32 *parents, gint n)
{
  for (gint r = 0; parents != NULL && r < n; r++)
    if (parents[r] != r)
      return FALSE;
  return TRUE;
}

/* Row r of each (outer, max_rows, inner) block of t becomes row parents[r]
 * (for the first used elements of inner only). */
static void
move_rows(float *data, float *scratch, gint64 outer, gint max_rows, gint64 inner, gint64 used,
          const gint32 *parents, gint rows)
{
  for (gint64 o = 0; o < outer; o++) {
    float *block = data + o * max_rows * inner;
    memcpy(scratch, block, (gsize)(rows * inner) * sizeof(float));
    for (gint r = 0; r < rows; r++)
      memcpy(block + r * inner, scratch + parents[r] * inner, (gsize)used * sizeof(float));
  }
}

/* qkv_step_decoder_step() for a caller that holds the decoder (translate's
 * search). */
static gboolean
decoder_step(gpointer decoder, gint step, const gint32 *tokens, const gint32 *parents, gint n_rows,
             float *logits, GError **error)
{
  QkvStepDecoder *d = decoder;
  const gchar *me = "qkv_step_decoder_step";
  if (d->rows == 0 || n_rows != d->rows || step != d->next_step || step >= d->max_len) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "%s: step %d for %d rows, but the decoder expects step %d (of at most %d) for %d "
                "rows (call qkv_step_decoder_start first)",
                me, step, n_rows, d->next_step, d->max_len, d->rows);
    return FALSE;
  }
  for (gint r = 0; parents != NULL && r < n_rows; r++)
    if (parents[r] < 0 || parents[r] >= n_rows) {
      g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                  "%s: parents[%d] = %d is not a row in [0, %d)", me, r, parents[r], n_rows);
      return FALSE;
    }
  if (!parents_identity(parents, n_rows)) {
    if (d->transformer) {
      /* a cache is (rows, heads, max_len, d_head): a row's block holds its
       * heads one after the other, each with the step positions filled */
      const QkvShape *cs = qkv_tensor_shape(d->self[0]);
      const gint64 heads = cs->dims[1], dh = cs->dims[3];
      for (gint i = 0; i < d->n_self; i++) {
        float *data = qkv_tensor_f32(d->self[i]);
        memcpy(d->scratch, data, (gsize)(n_rows * heads * d->max_len * dh) * sizeof(float));
        for (gint r = 0; r < n_rows; r++)
          for (gint64 h = 0; h < heads; h++)
            memcpy(data + (r * heads + h) * d->max_len * dh,
                   d->scratch + (parents[r] * heads + h) * d->max_len * dh,
                   (gsize)(step * dh) * sizeof(float));
      }
    } else {
      const gint64 H = d->gc.num_hiddens;
      move_rows(qkv_tensor_f32(d->self[0]), d->scratch, d->num_layers, d->max_rows, H, H, parents,
                n_rows);
      if (d->n_self > 1)
        move_rows(qkv_tensor_f32(d->self[1]), d->scratch, 1, d->max_rows, H, H, parents, n_rows);
    }
  }
  gint32 *tk = qkv_tensor_i32(d->tokens);
  for (gint r = 0; r < d->max_rows; r++)
    tk[r] = tokens[MIN(r, n_rows - 1)];
  if (d->transformer) {
    gint32 *pos = qkv_tensor_i32(d->positions), *sv = qkv_tensor_i32(d->self_valid);
    for (gint r = 0; r < d->max_rows; r++) {
      pos[r] = step;
      sv[r] = step + 1;
    }
  }
  if (d->target_pos != NULL)
    qkv_tensor_fill(d->target_pos, step);
  if (!qkv_plan_run(d->step_plan, error))
    return FALSE;
  if (d->transformer) {
    const QkvShape *cs = qkv_tensor_shape(d->self[0]);
    const gint64 heads = cs->dims[1], dh = cs->dims[3];
    for (gint i = 0; i < d->n_self; i++) {
      const float *kv = qkv_tensor_const_data(qkv_plan_output(d->step_plan, 1 + i));
      float *cache = qkv_tensor_f32(d->self[i]);
      for (gint64 rh = 0; rh < d->max_rows * heads; rh++)
        memcpy(cache + (rh * d->max_len + step) * dh, kv + rh * dh, (gsize)dh * sizeof(float));
    }
  } else if (!qkv_tensor_copy_from(d->self[0], qkv_plan_output(d->step_plan, 1), error) ||
             (d->n_self > 1 &&
              !qkv_tensor_copy_from(d->self[1], qkv_plan_output(d->step_plan, 3), error))) {
    return FALSE;
  }
  memcpy(logits, qkv_tensor_const_data(qkv_plan_output(d->step_plan, 0)),
         (gsize)n_rows * d->vocab * sizeof(float));
  d->next_step = step + 1;
  d->stepped = TRUE;
  return TRUE;
}

gboolean
qkv_step_decoder_step(gpointer decoder, gint step, const gint32 *tokens, const gint32 *parents,
                      gint n_rows, float *logits, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  QkvStepDecoder *d = decoder;
  g_return_val_if_fail(d != NULL && tokens != NULL && logits != NULL, FALSE);
  if (!decoder_acquire(d, "qkv_step_decoder_step", error))
    return FALSE;
  gboolean ok = decoder_step(d, step, tokens, parents, n_rows, logits, error);
  decoder_release(d);
  return ok;
}

const QkvTensor *
qkv_step_decoder_cross_weights(QkvStepDecoder *d, gint layer)
{
  g_return_val_if_fail(d != NULL, NULL);
  gint n = d->transformer ? d->num_layers : 1;
  if (layer < 0)
    layer += n;
  if (!d->stepped || layer < 0 || layer >= n)
    return NULL;
  return qkv_plan_output(d->step_plan, d->transformer ? (guint)(1 + 2 * n + layer) : 2);
}

gboolean
qkv_step_decoder_translate(QkvStepDecoder *d, const QkvTensor *src, const QkvTensor *src_valid,
                           const QkvBeamOptions *options, gint32 *out_tokens, gint *out_lengths,
                           double *out_scores, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  g_return_val_if_fail(d != NULL && options != NULL, FALSE);
  if (options->vocab != d->vocab || options->max_len > d->max_len) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "qkv_step_decoder_translate: options ask for vocab %" G_GINT64_FORMAT
                " and max_len %d; the decoder has vocab %" G_GINT64_FORMAT " and max_len %d",
                options->vocab, options->max_len, d->vocab, d->max_len);
    return FALSE;
  }
  /* before the encoder runs: qkv_beam_search() would refuse them only after it */
  if (options->bos < 0 || options->bos >= d->vocab || options->eos < 0 ||
      options->eos >= d->vocab) {
    g_set_error(
        error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
        "qkv_step_decoder_translate: bos %d and eos %d must be token ids in [0, %" G_GINT64_FORMAT
        ")",
        options->bos, options->eos, d->vocab);
    return FALSE;
  }
  g_return_val_if_fail(src != NULL && src_valid != NULL, FALSE);
  if (!decoder_acquire(d, "qkv_step_decoder_translate", error))
    return FALSE;
  gboolean ok = decoder_start(d, src, src_valid, MAX(options->beam_size, 1), error) &&
                qkv_beam_search(options, (gint)qkv_tensor_dim(src, 0), decoder_step, d, out_tokens,
                                out_lengths, out_scores, error);
  decoder_release(d);
  return ok;
}
