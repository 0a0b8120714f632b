/* state.c: graph states in a plan (qkv_graph_state()). A state's buffer is
 * the plan's, outside the arena, zeroed at compile, and keeps its contents
 * across runs; the only nodes that change it are in-place writers, which
 * compile orders after the state's other readers.
 *
 * A writer's output 0 is the state itself, after the write: compile points
 * that value at the state's buffer (alias_writer_outputs), so the writer
 * touches only the slots it writes and nothing copies the state. That is
 * sound because of the order: every node that reads the state without
 * depending on the writer runs before it (and sees the previous run's
 * contents), every node that reads output 0 depends on the writer and runs
 * after it (and sees the new contents), and output 0 is never in the arena,
 * so no other value is laid out over it and no in-place op overwrites it.
 * A plan output that is a writer's output 0 is therefore a view of the
 * state: qkv_plan_reset_state() and qkv_plan_reorder_states() change it
 * too. */
#include "plan/plan-private.h"

#include <string.h>
#include "error-private.h"

/* The ops that write their input 0, a state, in place. */
static gboolean
writes_state(const QkvNode *node)
{
  return g_strcmp0(node->op->name, "kv_cache_append") == 0;
}

gboolean
qkv_plan_states_alloc(QkvPlan *plan, GError **error)
{
  QkvGraph *graph = plan->graph;
  guint n_values = graph->values->len;
  plan->state_values = g_new0(QkvValue *, MAX(n_values, 1));
  plan->state_views = g_new0(QkvTensor *, MAX(n_values, 1));
  for (guint i = 0; i < n_values; i++) {
    QkvValue *v = g_ptr_array_index(graph->values, i);
    if (v->kind != QKV_VALUE_STATE)
      continue;
    gsize bytes = (gsize)qkv_shape_numel(&v->shape) * qkv_dtype_size(v->dtype);
    gpointer data = qkv_aligned_alloc0(bytes);
    if (data == NULL) {
      g_set_error(error, QKV_ERROR, QKV_ERROR_MEMORY,
                  "compile: cannot allocate %" G_GSIZE_FORMAT " bytes for state '%s'", bytes,
                  v->name);
      return FALSE;
    }
    plan->value_external[v->id] = data;
    plan->state_values[plan->n_states] = v;
    plan->state_views[plan->n_states] = qkv_tensor_new_view(v->dtype, &v->shape, data);
    plan->n_states++;
  }
  return TRUE;
}

void
qkv_plan_states_free(QkvPlan *plan)
{
  for (guint i = 0; i < plan->n_states; i++) {
    qkv_tensor_free(plan->state_views[i]);
    qkv_aligned_free(plan->value_external[plan->state_values[i]->id]);
  }
  g_free(plan->state_views);
  g_free(plan->state_values);
  g_free(plan->state_scratch);
}

static gboolean
reads(const QkvNode *node, const QkvValue *v)
{
  for (guint i = 0; i < node->n_inputs; i++)
    if (node->inputs[i] == v)
      return TRUE;
  return FALSE;
}

/* The step that computes input i of node, or -1 (not a node's output, or
 * pruned). */
static gint
producer(const gint *step_of, const QkvNode *node, guint i)
{
  const QkvValue *in = node->inputs[i];
  return in->kind == QKV_VALUE_OP ? step_of[in->node->id] : -1;
}

/* Move the writer at step w after the readers of its state that do not
 * depend on it: those readers and their ancestors after w go, in their
 * order, just before the writer; everything else keeps its place. */
static void
move_writer_after_readers(QkvPlan *plan, gint *step_of, guint w)
{
  guint n = plan->n_steps;
  QkvValue *state = plan->steps[w].node->inputs[0];
  gboolean *dep = g_new0(gboolean, n);
  gboolean *anc = g_new0(gboolean, n);
  dep[w] = TRUE;
  for (guint s = w + 1; s < n; s++) {
    QkvNode *node = plan->steps[s].node;
    for (guint i = 0; i < node->n_inputs; i++) {
      gint p = producer(step_of, node, i);
      dep[s] |= p >= (gint)w && dep[p];
    }
    anc[s] = !dep[s] && reads(node, state);
  }
  for (guint s = n; s-- > w + 1;) {
    QkvNode *node = plan->steps[s].node;
    for (guint i = 0; anc[s] && i < node->n_inputs; i++) {
      gint p = producer(step_of, node, i);
      if (p > (gint)w)
        anc[p] = TRUE;
    }
  }
  Step *order = g_new(Step, n - w);
  guint k = 0;
  for (guint s = w + 1; s < n; s++)
    if (anc[s])
      order[k++] = plan->steps[s];
  order[k++] = plan->steps[w];
  for (guint s = w + 1; s < n; s++)
    if (!anc[s])
      order[k++] = plan->steps[s];
  memcpy(plan->steps + w, order, (n - w) * sizeof(Step));
  for (guint s = w; s < n; s++)
    step_of[plan->steps[s].node->id] = (gint)s;
  g_free(order);
  g_free(anc);
  g_free(dep);
}

/* Point each writer's output 0 (the state after the write) at the state's
 * buffer; see the top of this file for why that is sound. */
static void
alias_writer_outputs(QkvPlan *plan, GPtrArray *writers)
{
  for (guint j = 0; j < writers->len; j++) {
    QkvNode *node = g_ptr_array_index(writers, j);
    QkvValue *state = node->inputs[0], *out = node->outputs[0];
    g_assert(out->dtype == state->dtype && qkv_shape_equal(&out->shape, &state->shape));
    plan->value_external[out->id] = plan->value_external[state->id];
  }
}

gboolean
qkv_plan_order_state_writers(QkvPlan *plan, GError **error)
{
  guint n_nodes = plan->graph->nodes->len;
  gint *step_of = g_new(gint, MAX(n_nodes, 1));
  for (guint i = 0; i < n_nodes; i++)
    step_of[i] = -1;
  for (guint s = 0; s < plan->n_steps; s++)
    step_of[plan->steps[s].node->id] = (gint)s;
  GPtrArray *writers = g_ptr_array_new();
  gboolean ok = TRUE;
  for (guint s = 0; s < plan->n_steps && ok; s++) {
    QkvNode *node = plan->steps[s].node;
    if (!writes_state(node))
      continue;
    QkvValue *state = node->inputs[0];
    if (state->kind != QKV_VALUE_STATE) {
      g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                  "compile: %s '%s' writes its input 0 in place, which must be a graph state "
                  "(qkv_graph_state), not '%s'",
                  node->op->name, node->name, state->name);
      ok = FALSE;
    }
    for (guint j = 0; j < writers->len && ok; j++)
      if (((QkvNode *)g_ptr_array_index(writers, j))->inputs[0] == state) {
        g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                    "compile: state '%s' has two writers in one plan ('%s' and '%s')", state->name,
                    ((QkvNode *)g_ptr_array_index(writers, j))->name, node->name);
        ok = FALSE;
      }
    g_ptr_array_add(writers, node);
  }
  for (guint j = 0; j < writers->len && ok; j++) {
    QkvNode *node = g_ptr_array_index(writers, j);
    move_writer_after_readers(plan, step_of, (guint)step_of[node->id]);
  }
  if (ok)
    alias_writer_outputs(plan, writers);
  g_ptr_array_unref(writers);
  g_free(step_of);
  return ok;
}

gboolean
qkv_plan_check_state_writes(QkvPlan *plan, GError **error)
{
  for (guint s = 0; s < plan->n_steps; s++) {
    const Step *st = &plan->steps[s];
    QkvValueKind pos_kind = st->node->n_inputs > 2 ? st->node->inputs[2]->kind : QKV_VALUE_OP;
    if (!writes_state(st->node) || (pos_kind != QKV_VALUE_INPUT && pos_kind != QKV_VALUE_CONSTANT))
      continue;
    const gint32 *pos = st->in[2].data;
    gint64 t_max = st->in[0].shape.dims[2];
    gint64 t = st->in[1].shape.dims[2];
    for (gint64 b = 0; b < st->in[2].shape.dims[0]; b++)
      if (pos[b] < 0 || pos[b] + t > t_max) {
        g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                    "run: %s '%s': row %" G_GINT64_FORMAT " at position %d with %" G_GINT64_FORMAT
                    " new slots does not fit the cache of %" G_GINT64_FORMAT " slots",
                    st->node->op->name, st->node->name, b, (int)pos[b], t, t_max);
        return FALSE;
      }
  }
  return TRUE;
}

static gint
state_index(QkvPlan *plan, const gchar *name)
{
  for (guint i = 0; i < plan->n_states; i++)
    if (g_strcmp0(plan->state_values[i]->name, name) == 0)
      return (gint)i;
  return -1;
}

const QkvTensor *
qkv_plan_state(QkvPlan *plan, const gchar *name)
{
  g_return_val_if_fail(plan != NULL && name != NULL, NULL);
  gint i = state_index(plan, name);
  return i >= 0 ? plan->state_views[i] : NULL;
}

gboolean
qkv_plan_reset_state(QkvPlan *plan, const gchar *name, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  g_return_val_if_fail(plan != NULL, FALSE);
  gint only = name != NULL ? state_index(plan, name) : -1;
  if (name != NULL && only < 0) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_NOT_FOUND, "reset_state: the plan has no state '%s'",
                name);
    return FALSE;
  }
  if (!g_atomic_int_compare_and_exchange(&plan->busy, 0, 1)) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_BUSY,
                "reset_state: the plan is being bound or run in another thread");
    return FALSE;
  }
  for (guint i = 0; i < plan->n_states; i++)
    if (only < 0 || (gint)i == only)
      memset(qkv_tensor_data(plan->state_views[i]), 0, qkv_tensor_nbytes(plan->state_views[i]));
  g_atomic_int_set(&plan->busy, 0);
  return TRUE;
}

/* FALSE with QKV_ERROR_INVALID_ARGUMENT unless n_rows ≥ 0, every state has n_rows rows
 * and every parent is one of them. */
static gboolean
check_reorder(QkvPlan *plan, const gint32 *parents, gint n_rows, GError **error)
{
  if (n_rows < 0) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "reorder_states: n_rows %d is negative", n_rows);
    return FALSE;
  }
  for (guint i = 0; i < plan->n_states; i++) {
    const QkvShape *s = qkv_tensor_shape(plan->state_views[i]);
    if (s->rank < 1 || s->dims[0] < n_rows) {
      g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                  "reorder_states: state '%s' has fewer than the %d rows asked for",
                  plan->state_values[i]->name, n_rows);
      return FALSE;
    }
  }
  for (gint r = 0; r < n_rows; r++)
    if (parents[r] < 0 || parents[r] >= n_rows) {
      g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                  "reorder_states: parents[%d] = %d is not a row in [0, %d)", r, parents[r],
                  n_rows);
      return FALSE;
    }
  return TRUE;
}

gboolean
qkv_plan_reorder_states(QkvPlan *plan, const gint32 *parents, gint n_rows, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  g_return_val_if_fail(plan != NULL && (parents != NULL || n_rows == 0), FALSE);
  if (!check_reorder(plan, parents, n_rows, error))
    return FALSE;
  gsize largest = 0;
  for (guint i = 0; i < plan->n_states; i++)
    largest = MAX(largest, qkv_tensor_nbytes(plan->state_views[i]));
  if (plan->state_scratch == NULL && largest > 0 &&
      (plan->state_scratch = g_try_malloc(largest)) == NULL) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_MEMORY,
                "reorder_states: cannot allocate %" G_GSIZE_FORMAT " bytes", largest);
    return FALSE;
  }
  if (!g_atomic_int_compare_and_exchange(&plan->busy, 0, 1)) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_BUSY,
                "reorder_states: the plan is being bound or run in another thread");
    return FALSE;
  }
  for (guint i = 0; i < plan->n_states; i++) {
    QkvTensor *t = plan->state_views[i];
    gsize row = qkv_tensor_nbytes(t) / (gsize)qkv_tensor_shape(t)->dims[0];
    guint8 *data = qkv_tensor_data(t);
    memcpy(plan->state_scratch, data, row * (gsize)n_rows);
    for (gint r = 0; r < n_rows; r++)
      memcpy(data + row * (gsize)r, (guint8 *)plan->state_scratch + row * (gsize)parents[r], row);
  }
  g_atomic_int_set(&plan->busy, 0);
  return TRUE;
}
