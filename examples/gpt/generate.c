/* generate.c: sampling from the GPT through qkv_generate(). The step
 * callback recomputes the whole window with a plan compiled for the full
 * block; a cached model (keys and values kept from step to step) would
 * replace the callback and its state, not the loop around it. */
#include <string.h>
#include "gpt.h"

typedef struct {
  QkvPlan *plan; /* logits (1, block, vocab) of the window in x */
  QkvTensor *x;  /* (1, block): the last ids fed; the causal mask hides those after them */
} Recompute;

static gboolean
recompute_step(gpointer data, gint step, const gint32 *tokens, const gint32 *parents, gint n_rows,
               float *logits, GError **error)
{
  Recompute *r = data;
  gint32 *x = qkv_tensor_i32(r->x);
  gint block = (gint)qkv_tensor_dim(r->x, 1), n = MIN(step + 1, block);
  memmove(x, x + (step >= block), (n - 1) * sizeof(gint32)); /* slides a full window */
  x[n - 1] = tokens[0];
  if (!qkv_plan_run(r->plan, error))
    return FALSE;
  gint64 vocab = qkv_tensor_dim(qkv_plan_output(r->plan, 0), 2);
  const float *out = qkv_tensor_const_data(qkv_plan_output(r->plan, 0));
  memcpy(logits, out + (n - 1) * vocab, vocab * sizeof(float));
  return TRUE;
}

gboolean
gpt_generate(QkvParams *params, const GptConfig *cfg, const gint32 *prompt, gint n_prompt,
             gint length, const QkvSampleOptions *sample, QkvPrecision precision, gint32 *out,
             gint *n_out, GError **error)
{
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvBuilder b = {.graph = g, .params = params, .inits = &gpt_inits};
  QkvShape window = QKV_SHAPE(1, cfg->block);
  QkvValue *logits = gpt_logits(&b, cfg, qkv_graph_input(g, "x", QKV_I32, &window, error), error);
  QkvPlanOptions po = qkv_plan_options_default();
  po.precision = precision;
  g_autoptr(QkvPlan) plan = logits ? qkv_graph_compile(g, &logits, 1, &po, error) : NULL;
  g_autoptr(QkvTensor) x = qkv_tensor_new(QKV_I32, &window);
  QkvGenerateOptions options = {.sample = *sample, .vocab = cfg->vocab, .bos = -1, .eos = -1};
  return plan && qkv_plan_bind(plan, "x", x, error) &&
         qkv_generate(&options, 1, prompt, &n_prompt, length, recompute_step, &(Recompute){plan, x},
                      out, n_out, error);
}
