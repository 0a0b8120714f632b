/* model.c: the GPT (pre-LN blocks, learned positions, tied output
 * embedding) and its training (AdamW with decay on matrices only, linear
 * warm-up then cosine decay, gradient clipping). */
#include <stdio.h>
#include <string.h>
#include "gpt.h"

/* GPT-2's initialisation: weights and tables N(0, 0.02²), biases 0 */
const QkvBuilderInits gpt_inits = {.embedding = {.kind = QKV_INIT_NORMAL, .std = 0.02},
                                   .weight = {.kind = QKV_INIT_NORMAL, .std = 0.02},
                                   .bias = {.kind = QKV_INIT_ZEROS}};

/* tokens i32 (B, T) → logits (B, T, vocab); with b->cache (generation) the
 * tokens sit at the rows' positions and attention reads the kv cache */
QkvValue *
gpt_logits(QkvBuilder *b, const GptConfig *cfg, QkvValue *tokens, GError **error)
{
  QkvShape te = QKV_SHAPE(cfg->vocab, cfg->d_model), pe = QKV_SHAPE(cfg->block, cfg->d_model);
  QkvValue *wte = qkv_build_param_init(b, "wte", &te, &gpt_inits.embedding, error);
  QkvValue *wpe = qkv_build_param_init(b, "wpe", &pe, &gpt_inits.embedding, error);
  QkvValue *pos = qkv_embedding(qkv_build_positions(b, tokens, error), wpe, error);
  QkvValue *x = qkv_add(qkv_embedding(tokens, wte, error), pos, error);
  QkvMhaOptions attention = {.causal = TRUE, .bias = TRUE};
  for (gint i = 0; i < cfg->layers; i++) {
    qkv_builder_push_printf(b, error, "blocks.%d", i);
    QkvValue *h = qkv_build_layer_norm(b, "ln1", x, 1e-5, TRUE, TRUE, error);
    h = qkv_build_mha_full(b, "attn", h, h, h, cfg->d_model, cfg->heads, &attention, NULL, error);
    x = qkv_add(x, h, error);
    h = qkv_build_layer_norm(b, "ln2", x, 1e-5, TRUE, TRUE, error);
    h = qkv_build_ffn_activation(b, "mlp", h, 4 * cfg->d_model, cfg->d_model, QKV_ACTIVATION_GELU,
                                 error);
    x = qkv_add(x, h, error);
    qkv_builder_pop(b);
  }
  x = qkv_build_layer_norm(b, "ln_f", x, 1e-5, TRUE, TRUE, error);
  return qkv_matmul(x, wte, FALSE, TRUE, error); /* tied: h · wteᵀ */
}

/* Random windows of text into x and the characters after them into y. */
static void
sample_batch(const GptText *text, gint64 block, GRand *rng, QkvTensor *x, QkvTensor *y)
{
  for (gint64 i = 0; i < qkv_tensor_dim(x, 0); i++) {
    gint64 start = g_rand_int_range(rng, 0, (gint32)(text->n - block));
    memcpy(qkv_tensor_i32(x) + i * block, text->ids + start, block * sizeof(gint32));
    memcpy(qkv_tensor_i32(y) + i * block, text->ids + start + 1, block * sizeof(gint32));
  }
}

gboolean
gpt_train(QkvParams *params, const GptConfig *cfg, const GptCorpus *corpus,
          const GptTrainOptions *o, GError **error)
{
  QkvShape bt = QKV_SHAPE(o->batch, cfg->block);
  g_autoptr(QkvTensor) x = qkv_tensor_new(QKV_I32, &bt), y = qkv_tensor_new(QKV_I32, &bt);
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvBuilder b = {.graph = g, .params = params, .inits = &gpt_inits};
  QkvValue *logits = gpt_logits(&b, cfg, qkv_graph_input(g, "x", QKV_I32, &bt, error), error);
  QkvValue *loss = qkv_cross_entropy(logits, qkv_graph_input(g, "y", QKV_I32, &bt, error), NULL,
                                     QKV_REDUCTION_MEAN, error);
  /* one graph, two plans: training, and evaluation without the gradients */
  gboolean bf16 = o->precision == QKV_PRECISION_BF16;
  QkvPlanOptions train_options = {.training = TRUE,
                                  .precision = o->precision,
                                  .bf16_activations = bf16},
                 eval_options = {
                     .skip_param_grads = TRUE, .precision = o->precision, .bf16_activations = bf16};
  g_autoptr(QkvPlan) train = loss && qkv_graph_backward(g, loss, error)
                                 ? qkv_graph_compile(g, &loss, 1, &train_options, error)
                                 : NULL;
  g_autoptr(QkvPlan) eval = train ? qkv_graph_compile(g, &loss, 1, &eval_options, error) : NULL;
  if (!eval || !qkv_plan_bind(train, "x", x, error) || !qkv_plan_bind(train, "y", y, error) ||
      !qkv_plan_bind(eval, "x", x, error) || !qkv_plan_bind(eval, "y", y, error))
    return FALSE;
  QkvOptimConfig adamw = qkv_optim_config_adamw(o->lr);
  adamw.weight_decay = 0; /* none for biases and gains; the group below decays matrices */
  g_autoptr(QkvOptimizer) opt = qkv_optimizer_new_adamw(params, &adamw, error);
  g_autoptr(QkvSchedule) schedule =
      opt && qkv_optimizer_add_group(opt, NULL, qkv_param_filter_matrices, NULL, 1.0,
                                     o->weight_decay, error)
          ? qkv_schedule_try_new_warmup_decay(QKV_DECAY_COSINE, o->warmup, o->steps, o->lr,
                                              o->lr / 10, error)
          : NULL;
  g_autoptr(GRand) rng = g_rand_new_with_seed((guint32)o->seed);
  double train_loss = 0, ms = 0;
  for (gint step = 1, n = 1; schedule && step <= o->steps; step++, n++) {
    sample_batch(&corpus->train, cfg->block, rng, x, y);
    gint64 start = g_get_monotonic_time();
    qkv_schedule_step(schedule, opt);
    if (!qkv_plan_run(train, error) ||
        !qkv_optimizer_step_clipped(opt, o->clip, QKV_CLIP_TORCH, NULL, error))
      return FALSE;
    ms += (g_get_monotonic_time() - start) / 1e3;
    train_loss += qkv_plan_output_scalar(train, 0);
    if (step % o->eval_every != 0 && step != o->steps)
      continue;
    g_autoptr(GRand) val_rng = g_rand_new_with_seed(12345); /* the same windows every time */
    double val_loss = 0;
    for (gint i = 0; i < 8; i++) {
      sample_batch(&corpus->val, cfg->block, val_rng, x, y);
      if (!qkv_plan_run(eval, error))
        return FALSE;
      val_loss += qkv_plan_output_scalar(eval, 0) / 8;
    }
    printf("step %5d  train loss %.4f  val loss %.4f  %.2f ms/step\n", step, train_loss / n,
           val_loss, ms / step);
    train_loss = 0, n = 0;
  }
  return schedule != NULL;
}
