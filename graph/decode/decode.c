/* decode.c: step decoders (qkv-decode.h): the book's Transformer and its
 * Bahdanau-attention GRU decoder, each as two compiled plans built from the
 * parameters the training graph uses:
 *
 *  - an encoder plan, run once per batch of sentences, on rows (each
 *    sentence repeated for its beam slots): the Transformer's encoder and,
 *    for every decoder block, the encoder-decoder attention's keys and
 *    values; the GRU encoder's outputs and state;
 *  - a step plan, run once per emitted token, taking one token per row.
 *
 * The Transformer's step plan is the full decoder's builder
 * (qkv_build_transformer_decoder) in cached mode (QkvBuilderCache): each
 * block's causal self-attention keeps the keys and values of the tokens
 * decoded so far in graph states of max_len positions that the plan owns
 * (rows, heads, max_len, d_head), appends the token's own at position step
 * (kv_cache_append) and attends over the filled part (kv_cache_attention),
 * so a step costs one token's projections and a pass over the keys cached
 * so far, never over all max_len slots; beam search moves the caches' rows
 * to their parents (qkv_plan_reorder_states). The encoder-decoder attention's keys and
 * values, which the full decoder recomputes at every step, are projected
 * once per sentence by the encoder plan (qkv_build_mha_keys_values) and
 * bound to the step plan (QkvBuilderCache.cross_inputs). The same builder
 * as training: one mechanism for any model.
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

/* The encoder plan: src (R, S), src_valid (R) → per block the keys then
 * the values of attention2 (R, heads, S, d_head), projected once per
 * source (qkv_build_mha_keys_values). */
static gboolean
transformer_encoder_plan(QkvStepDecoder *d, QkvBuilder *b, gint n_threads, GError **error)
{
  const QkvTransformerConfig *c = &d->tc;
  QkvShape rs = QKV_SHAPE(d->max_rows, d->src_len), r = QKV_SHAPE(d->max_rows);
  QkvValue *src = qkv_graph_input(b->graph, "src", QKV_I32, &rs, error);
  QkvValue *valid = src ? qkv_graph_input(b->graph, "src_valid", QKV_I32, &r, error) : NULL;
  QkvValue *enc = valid ? qkv_build_transformer_encoder(b, c, src, valid, error) : NULL;
  g_autofree QkvValue **outs = g_new0(QkvValue *, 2 * c->num_layers);
  QkvMhaOptions o = {.bias = c->attention_bias};
  for (gint i = 0; enc != NULL && i < c->num_layers; i++) {
    qkv_builder_push_printf(b, error, "decoder.blks.block%d", i);
    outs[2 * i] = qkv_build_mha_keys_values(b, "attention2", enc, enc, c->num_hiddens, c->num_heads,
                                            &o, &outs[2 * i + 1], error);
    qkv_builder_pop(b);
    if (outs[2 * i] == NULL)
      return FALSE;
  }
  if (enc == NULL)
    return FALSE;
  d->enc_plan = decode_compile(b->graph, outs, 2 * c->num_layers, n_threads, error);
  return d->enc_plan != NULL;
}

/* The step plan: the full decoder's builder in cached mode
 * (QkvBuilderCache) on one token per row at "positions"; attention2 takes
 * the encoder plan's keys and values as the inputs
 * "decoder.blks.block<i>.attention2.keys" and ".values" (cross_inputs).
 * Outputs: 0 logits (R, V), then per block the cross-attention weights
 * (R, heads, 1, S). */
static gboolean
transformer_step_plan(QkvStepDecoder *d, QkvBuilder *b, gint n_threads, GError **error)
{
  const QkvTransformerConfig *c = &d->tc;
  const gint L = c->num_layers;
  QkvGraph *g = b->graph;
  QkvShape r1 = QKV_SHAPE(d->max_rows, 1), r = QKV_SHAPE(d->max_rows);
  QkvShape es = QKV_SHAPE(d->max_rows, d->src_len, c->num_hiddens);
  QkvShape logits_shape = QKV_SHAPE(d->max_rows, c->tgt_vocab);
  QkvValue *tokens = qkv_graph_input(g, "tokens", QKV_I32, &r1, error);
  QkvValue *positions = tokens ? qkv_graph_input(g, "positions", QKV_I32, &r, error) : NULL;
  /* the encoder outputs' shape only: cross_inputs reads no more of them */
  QkvValue *enc = positions ? qkv_graph_input(g, "enc", QKV_F32, &es, error) : NULL;
  QkvValue *src_valid = enc ? qkv_graph_input(g, "src_valid", QKV_I32, &r, error) : NULL;
  QkvBuilderCache cache = {.max_len = d->max_len, .positions = positions, .cross_inputs = TRUE};
  QkvBuilder cached = *b; /* no scope pushed: a copy is a builder */
  cached.cache = &cache;
  g_autofree QkvValue **outs = g_new0(QkvValue *, 1 + L);
  QkvTransformerTaps taps = {.cross_weights = outs + 1};
  QkvValue *logits = src_valid ? qkv_build_transformer_decoder_taps(&cached, c, tokens, enc,
                                                                    src_valid, &taps, error)
                               : NULL;
  outs[0] = logits ? qkv_reshape(logits, &logits_shape, error) : NULL;
  if (outs[0] == NULL)
    return FALSE;
  d->step_plan = decode_compile(g, outs, 1 + L, n_threads, error);
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
  d->positions = decode_new_tensor(QKV_I32, QKV_SHAPE(max_rows), error);
  if (d->positions == NULL)
    return NULL;
  const gint L = d->num_layers, H = config->num_heads;
  d->n_cross = 2 * L;
  d->cross = g_new0(QkvTensor *, 2 * L);
  for (gint i = 0; i < 2 * L; i++)
    if ((d->cross[i] = decode_new_tensor(
             QKV_F32, QKV_SHAPE(max_rows, H, src_len, config->num_hiddens / H), error)) == NULL)
      return NULL;
  QkvPlan *sp = d->step_plan, *ep = d->enc_plan;
  if (!qkv_plan_bind(ep, "src", d->src, error) ||
      !qkv_plan_bind(ep, "src_valid", d->src_valid, error) ||
      !qkv_plan_bind(sp, "tokens", d->tokens, error) ||
      !qkv_plan_bind(sp, "positions", d->positions, error) ||
      !qkv_plan_bind(sp, "src_valid", d->row_valid, error))
    return NULL;
  for (gint i = 0; i < 2 * L; i++) {
    g_autofree gchar *name =
        g_strdup_printf("decoder.blks.block%d.attention2.%s", i / 2, i % 2 ? "values" : "keys");
    if (!qkv_plan_bind(sp, name, d->cross[i], error))
      return NULL;
  }
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
    /* slots past a row's position are never read; zeros keep them finite */
    if (!qkv_plan_reset_state(d->step_plan, NULL, error))
      return FALSE;
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
      /* the plan's caches (rows, heads, max_len, d_head) */
      if (!qkv_plan_reorder_states(d->step_plan, parents, n_rows, error))
        return FALSE;
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
    gint32 *pos = qkv_tensor_i32(d->positions);
    for (gint r = 0; r < d->max_rows; r++)
      pos[r] = step;
  }
  if (d->target_pos != NULL)
    qkv_tensor_fill(d->target_pos, step);
  if (!qkv_plan_run(d->step_plan, error))
    return FALSE;
  if (d->transformer) {
    /* kv_cache_append wrote this step's keys and values during the run */
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
  return qkv_plan_output(d->step_plan, d->transformer ? (guint)(1 + layer) : 2);
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
