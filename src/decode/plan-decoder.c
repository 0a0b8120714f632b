/* plan-decoder.c: QkvPlanDecoder (qkv-decode.h), the step callback of
 * qkv_generate() and qkv_beam_search() over any plan compiled from a graph
 * built in cached mode (QkvBuilderCache): it binds the plan's "tokens" and
 * "positions", moves the caches' rows to their parents, and restarts the
 * context when the caches are full. Nothing is allocated per step. */
#include <qkv/qkv.h>
#include <qkv/qkv-decode.h>
#include <string.h>

#include "error-private.h"
#include "plan/plan-private.h"

struct _QkvPlanDecoder {
  QkvPlan *plan; /* borrowed */
  QkvTensor *tokens, *positions;
  gint rows;
  gint64 max_len;
  /* rows × max_len: the token row r fed at step t sits at [r, t % max_len],
   * for refeeding a restarted context; scratch for moving rows */
  gint32 *history, *scratch;
  gint next_step; /* the step the next call must be (or 0) */
  gint start;     /* the step whose token sits at position 0 */
};

QkvPlanDecoder *
qkv_plan_decoder_new(QkvPlan *plan, gint rows, gint64 max_len, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  g_return_val_if_fail(plan != NULL, NULL);
  if (plan->decoder != NULL) {
    /* a second one would rebind the inputs under the first and share its
     * caches (the plan's states) */
    g_set_error_literal(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                        "qkv_plan_decoder_new: the plan already has a QkvPlanDecoder (its caches "
                        "are the plan's states): free that one first");
    return NULL;
  }
  if (rows < 1 || max_len < 1 || max_len > G_MAXINT32 || (gsize)rows > G_MAXSIZE / 8 / max_len) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "qkv_plan_decoder_new: rows (%d) and max_len (%" G_GINT64_FORMAT
                ") must be at least 1 and fit in memory",
                rows, max_len);
    return NULL;
  }
  g_autoptr(QkvPlanDecoder) d = g_new0(QkvPlanDecoder, 1);
  d->plan = plan;
  d->rows = rows;
  d->max_len = max_len;
  QkvShape ts = QKV_SHAPE(rows, 1), ps = QKV_SHAPE(rows);
  d->tokens = qkv_tensor_try_new(QKV_I32, &ts, error);
  d->positions = d->tokens ? qkv_tensor_try_new(QKV_I32, &ps, error) : NULL;
  d->history = g_try_new0(gint32, (gsize)rows * max_len);
  d->scratch = g_try_new0(gint32, (gsize)rows * max_len);
  if (d->positions == NULL)
    return NULL;
  if (d->history == NULL || d->scratch == NULL) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_MEMORY,
                "qkv_plan_decoder_new: no memory for %d rows of %" G_GINT64_FORMAT " tokens", rows,
                max_len);
    return NULL;
  }
  if (!qkv_plan_bind(plan, "tokens", d->tokens, error) ||
      !qkv_plan_bind(plan, "positions", d->positions, error))
    return NULL;
  plan->decoder = d;
  return g_steal_pointer(&d);
}

void
qkv_plan_decoder_free(QkvPlanDecoder *d)
{
  if (d == NULL)
    return;
  if (d->plan->decoder == d)
    d->plan->decoder = NULL;
  qkv_tensor_free(d->tokens);
  qkv_tensor_free(d->positions);
  g_free(d->history);
  g_free(d->scratch);
  g_free(d);
}

/* Run the plan on the tokens of step t of every row (history), at their
 * position in the current context. */
static gboolean
feed(QkvPlanDecoder *d, gint t, GError **error)
{
  gint32 *tk = qkv_tensor_i32(d->tokens), *pos = qkv_tensor_i32(d->positions);
  for (gint r = 0; r < d->rows; r++) {
    tk[r] = d->history[(gsize)r * d->max_len + t % d->max_len];
    pos[r] = t - d->start;
  }
  return qkv_plan_run(d->plan, error);
}

static gboolean
check_step(QkvPlanDecoder *d, gint step, gint n_rows, GError **error)
{
  if (n_rows >= 1 && n_rows <= d->rows && (step == 0 || step == d->next_step))
    return TRUE;
  g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
              "qkv_plan_decoder_step: step %d for %d rows, but the decoder expects step 0 or %d "
              "for 1 to %d rows",
              step, n_rows, d->next_step, d->rows);
  return FALSE;
}

gboolean
qkv_plan_decoder_step(gpointer decoder, gint step, const gint32 *tokens, const gint32 *parents,
                      gint n_rows, float *logits, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  QkvPlanDecoder *d = decoder;
  g_return_val_if_fail(d != NULL && tokens != NULL && logits != NULL, FALSE);
  if (!check_step(d, step, n_rows, error))
    return FALSE;
  if (step == 0)
    d->start = 0;
  gboolean moved = FALSE;
  for (gint r = 0; parents != NULL && step > 0 && r < n_rows; r++)
    moved |= parents[r] != r;
  /* the caches first: qkv_plan_reorder_states() checks the parents */
  if (moved && !qkv_plan_reorder_states(d->plan, parents, n_rows, error))
    return FALSE;
  if (moved) {
    gsize row = (gsize)d->max_len;
    memcpy(d->scratch, d->history, (gsize)n_rows * row * sizeof(gint32));
    for (gint r = 0; r < n_rows; r++)
      memcpy(d->history + r * row, d->scratch + parents[r] * row, row * sizeof(gint32));
  }
  for (gint r = 0; r < d->rows; r++) /* rows past n_rows repeat the last */
    d->history[(gsize)r * d->max_len + step % d->max_len] = tokens[MIN(r, n_rows - 1)];
  if (step - d->start == d->max_len) {
    /* the caches are full: the context restarts from the last max_len / 2
     * tokens, this one included, fed again at positions 0 … */
    d->start = step - (gint)MAX(d->max_len / 2, 1) + 1;
    for (gint t = d->start; t < step; t++)
      if (!feed(d, t, error))
        return FALSE;
  }
  if (!feed(d, step, error))
    return FALSE;
  const QkvTensor *out = qkv_plan_output(d->plan, 0);
  gint64 vocab = qkv_tensor_numel(out) / d->rows;
  memcpy(logits, qkv_tensor_const_data(out), (gsize)(n_rows * vocab) * sizeof(float));
  d->next_step = step + 1;
  return TRUE;
}
