/* generate.c: sampling from the GPT through qkv_generate(), one token a
 * step through the model's key/value caches: gpt_logits itself builds the
 * one-token graph when its builder is cached (QkvBuilderCache), the plan
 * keeps every block's keys and values from step to step, and a
 * QkvPlanDecoder feeds it (past the block the context restarts from its
 * last block / 2 characters: learned positions end there). */
#include "gpt.h"

gboolean
gpt_generate(QkvParams *params, const GptConfig *cfg, const gint32 *prompt, gint n_prompt,
             gint length, const QkvSampleOptions *sample, QkvPrecision precision, gint32 *out,
             gint *n_out, GError **error)
{
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvShape one = QKV_SHAPE(1, 1), row = QKV_SHAPE(1);
  QkvValue *positions = qkv_graph_input(g, "positions", QKV_I32, &row, error);
  QkvBuilderCache cache = {.max_len = cfg->block, .positions = positions};
  QkvBuilder b = {.graph = g, .params = params, .inits = &gpt_inits, .cache = &cache};
  QkvValue *tokens = qkv_graph_input(g, "tokens", QKV_I32, &one, error);
  QkvValue *logits = gpt_logits(&b, cfg, tokens, error);
  QkvPlanOptions po = qkv_plan_options_default();
  po.precision = precision;
  g_autoptr(QkvPlan) plan = logits ? qkv_graph_compile(g, &logits, 1, &po, error) : NULL;
  g_autoptr(QkvPlanDecoder) step = plan ? qkv_plan_decoder_new(plan, 1, cfg->block, error) : NULL;
  QkvGenerateOptions options = {.sample = *sample, .vocab = cfg->vocab, .bos = -1, .eos = -1};
  return step && qkv_generate(&options, 1, prompt, &n_prompt, length, qkv_plan_decoder_step, step,
                              out, n_out, error);
}
