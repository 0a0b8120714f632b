/* plan.c: compiling a graph (order, pruning, liveness-based arena layout)
 * and running it. Running allocates nothing: every pointer a kernel sees is
 * fixed at compile time, except graph inputs, which are patched in on bind. */
#include "core/core-private.h"

#include <string.h>

#define ARENA_ALIGN 64

QkvPlanOptions
qkv_plan_options_default(void)
{
  QkvPlanOptions o = {0};
  return o;
}

/* ---- a first-fit allocator of offsets inside the arena ---- */

typedef struct {
  gsize offset, size;
} Block;

typedef struct {
  GArray *free; /* Block, sorted by offset, never adjacent */
  gsize top;
  gboolean overflow; /* the layout needs more than G_MAXSIZE bytes */
} OffsetAllocator;

/* n rounded up to the arena alignment; G_MAXSIZE if that does not fit
 * (a plugin's scratch_size may return anything). */
static gsize
round_up(gsize n)
{
  if (n > G_MAXSIZE - ARENA_ALIGN)
    return G_MAXSIZE;
  return (n + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
}

static gsize
offsets_alloc(OffsetAllocator *a, gsize size)
{
  /* best fit among free blocks keeps large holes for large tensors */
  gint best = -1;
  for (guint i = 0; i < a->free->len; i++) {
    Block *b = &g_array_index(a->free, Block, i);
    if (b->size >= size && (best < 0 || b->size < g_array_index(a->free, Block, best).size))
      best = (gint)i;
  }
  if (best >= 0) {
    Block *b = &g_array_index(a->free, Block, best);
    gsize off = b->offset;
    b->offset += size;
    b->size -= size;
    if (b->size == 0)
      g_array_remove_index(a->free, best);
    return off;
  }
  /* grow: reuse a free block that ends at the top */
  if (a->free->len > 0) {
    Block *last = &g_array_index(a->free, Block, a->free->len - 1);
    if (last->offset + last->size == a->top) {
      gsize off = last->offset;
      if (!g_size_checked_add(&a->top, off, size))
        a->overflow = TRUE;
      g_array_remove_index(a->free, a->free->len - 1);
      return off;
    }
  }
  gsize off = a->top;
  if (!g_size_checked_add(&a->top, a->top, size)) {
    a->overflow = TRUE;
    return 0;
  }
  return off;
}

static void
offsets_free(OffsetAllocator *a, gsize offset, gsize size)
{
  guint i = 0;
  while (i < a->free->len && g_array_index(a->free, Block, i).offset < offset)
    i++;
  Block nb = {offset, size};
  g_array_insert_val(a->free, i, nb);
  /* merge with the next block, then with the previous one */
  if (i + 1 < a->free->len) {
    Block *cur = &g_array_index(a->free, Block, i), *next = &g_array_index(a->free, Block, i + 1);
    if (cur->offset + cur->size == next->offset) {
      cur->size += next->size;
      g_array_remove_index(a->free, i + 1);
    }
  }
  if (i > 0) {
    Block *prev = &g_array_index(a->free, Block, i - 1), *cur = &g_array_index(a->free, Block, i);
    if (prev->offset + prev->size == cur->offset) {
      prev->size += cur->size;
      g_array_remove_index(a->free, i);
    }
  }
}

/* ---- the plan ---- */

typedef struct {
  QkvNode *node;
  QkvKernelCtx ctx;
  QkvView *in;
  QkvView *out;
  gsize scratch_offset;
  double seconds; /* profiling: time spent in this step's kernel */
} Step;

typedef struct {
  guint step;
  guint slot;
} Patch;

typedef struct {
  QkvValue *value;
  QkvTensor *bound;
  gboolean needed;
  GArray *patches; /* Patch: ctx.in[slot] of step */
  QkvShape shape;  /* the bound tensor's shape when it was bound */
} Binding;

typedef struct {
  QkvParam *param;
  QkvValue *grad;
} ParamGrad;

struct _QkvPlan {
  QkvGraph *graph;
  QkvPlanOptions options;
  gint n_threads;
  gint max_threads; /* scratch memory is sized for this many */
  guint64 seed;
  guint64 step;
  Step *steps;
  guint n_steps;
  guint8 *arena;
  gsize arena_size;
  gsize intermediates_size;
  gsize *value_offset;      /* per value id: arena offset, or G_MAXSIZE if not in the arena */
  gpointer *value_external; /* per value id: memory outside the arena (a param's gradient) */
  Binding *bindings;        /* one per graph input */
  guint n_bindings;
  QkvValue **output_values;
  QkvTensor **outputs;
  guint n_outputs;
  ParamGrad *param_grads;
  guint n_param_grads;
  gboolean profiling;
  guint64 profiled_runs;
  /* Variable shapes: the shape every value has in the current run (graph
   * inputs: as bound), the scratch sizes compile reserved, and buffers for
   * re-running shape rules, all allocated at compile time. */
  QkvShape *value_shape;
  gsize *step_scratch;
  QkvShape *rule_in_shapes;
  QkvDType *rule_in_dtypes;
  gboolean shapes_dirty;  /* a bound shape changed since the last shape pass */
  gboolean shapes_varied; /* the current shapes are not the compiled ones */
};

typedef struct {
  gsize offset, size;
  gint last_use;
  gboolean pinned, freed;
} Buffer;

static gpointer
value_pointer(QkvPlan *plan, QkvValue *v)
{
  switch (v->kind) {
  case QKV_VALUE_OP:
    if (plan->value_external[v->id] != NULL)
      return plan->value_external[v->id];
    return plan->arena + plan->value_offset[v->id];
  case QKV_VALUE_PARAM:
    return qkv_tensor_data(qkv_param_value(v->param));
  case QKV_VALUE_CONSTANT:
    return qkv_tensor_data(v->constant);
  case QKV_VALUE_INPUT: {
    for (guint i = 0; i < plan->n_bindings; i++)
      if (plan->bindings[i].value == v)
        return plan->bindings[i].bound ? qkv_tensor_data(plan->bindings[i].bound) : NULL;
    return NULL;
  }
  }
  return NULL;
}

/* Every dim of got is at most the one of max, same rank. */
static gboolean
shape_fits(const QkvShape *got, const QkvShape *max)
{
  if (got->rank != max->rank)
    return FALSE;
  for (gint d = 0; d < got->rank; d++)
    if (got->dims[d] > max->dims[d])
      return FALSE;
  return TRUE;
}

static gint
binding_index(QkvPlan *plan, QkvValue *v)
{
  for (guint i = 0; i < plan->n_bindings; i++)
    if (plan->bindings[i].value == v)
      return (gint)i;
  return -1;
}

QkvPlan *
qkv_graph_compile(QkvGraph *graph, QkvValue *const *outputs, guint n_outputs,
                  const QkvPlanOptions *options, GError **error)
{
  g_return_val_if_fail(graph != NULL, NULL);
  g_return_val_if_fail(n_outputs == 0 || outputs != NULL, NULL);
  QkvPlanOptions opts = options ? *options : qkv_plan_options_default();
  for (guint i = 0; i < n_outputs; i++) {
    if (outputs[i] == NULL) {
      if (error == NULL || *error == NULL) /* else an earlier failure said why */
        g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT, "compile: output %u is NULL", i);
      return NULL;
    }
    if (outputs[i]->graph != graph) {
      g_set_error(error, QKV_ERROR, QKV_ERROR_GRAPH_MISMATCH,
                  "compile: output %u ('%s') belongs to another graph", i, outputs[i]->name);
      return NULL;
    }
  }
  const guint n_values = graph->values->len, n_nodes = graph->nodes->len;
  gboolean with_grads = !opts.skip_param_grads && graph->param_grads->len > 0;

  QkvPlan *plan = g_new0(QkvPlan, 1);
  plan->graph = graph;
  plan->options = opts;
  plan->n_threads = opts.n_threads > 0 ? opts.n_threads : qkv_get_num_threads();
  /* room for a later qkv_plan_set_n_threads() up to the machine's cores */
  plan->max_threads = MAX(plan->n_threads, (gint)g_get_num_processors());
  plan->seed = opts.seed;

  /* roots: requested outputs and parameter gradients */
  gint *last_use = g_new(gint, n_values);
  gboolean *needed = g_new0(gboolean, n_values);
  for (guint i = 0; i < n_values; i++)
    last_use[i] = -1;
  for (guint i = 0; i < n_outputs; i++) {
    needed[outputs[i]->id] = TRUE;
    last_use[outputs[i]->id] = G_MAXINT;
  }
  if (with_grads) {
    plan->n_param_grads = graph->param_grads->len;
    plan->param_grads = g_new0(ParamGrad, plan->n_param_grads);
    for (guint i = 0; i < graph->param_grads->len; i++) {
      QkvValue *pv = g_ptr_array_index(graph->param_grads, i);
      QkvValue *gv = g_hash_table_lookup(graph->grads, pv);
      plan->param_grads[i].param = pv->param;
      plan->param_grads[i].grad = gv;
      needed[gv->id] = TRUE;
      last_use[gv->id] = G_MAXINT;
    }
  }
  /* A node that computes a parameter's gradient writes it straight into the
   * store: no arena space, no copy after the run. (A value that is the
   * gradient of two parameters goes to the first; the other gets a copy.) */
  plan->value_external = g_new0(gpointer, n_values);
  for (guint i = 0; i < plan->n_param_grads && !opts.no_memory_reuse; i++) {
    QkvValue *gv = plan->param_grads[i].grad;
    if (gv->kind == QKV_VALUE_OP && plan->value_external[gv->id] == NULL)
      plan->value_external[gv->id] = qkv_tensor_data(qkv_param_grad(plan->param_grads[i].param));
  }
  /* prune: walk back from the roots */
  gboolean *node_needed = g_new0(gboolean, n_nodes);
  guint n_steps = 0;
  for (guint n = n_nodes; n-- > 0;) {
    QkvNode *node = g_ptr_array_index(graph->nodes, n);
    gboolean any = FALSE;
    for (guint o = 0; o < node->n_outputs; o++)
      any |= needed[node->outputs[o]->id];
    if (!any)
      continue;
    node_needed[n] = TRUE;
    n_steps++;
    for (guint i = 0; i < node->n_inputs; i++)
      needed[node->inputs[i]->id] = TRUE;
  }
  plan->n_steps = n_steps;
  plan->steps = g_new0(Step, MAX(n_steps, 1));
  guint s = 0;
  for (guint n = 0; n < n_nodes; n++)
    if (node_needed[n])
      plan->steps[s++].node = g_ptr_array_index(graph->nodes, n);

  /* liveness: the last step that reads each value */
  for (s = 0; s < n_steps; s++) {
    QkvNode *node = plan->steps[s].node;
    for (guint i = 0; i < node->n_inputs; i++) {
      QkvValue *in = node->inputs[i];
      if (last_use[in->id] != G_MAXINT)
        last_use[in->id] = MAX(last_use[in->id], (gint)s);
    }
  }

  if (opts.no_memory_reuse)
    for (guint i = 0; i < n_values; i++)
      last_use[i] = G_MAXINT;

  /* layout: assign arena offsets in execution order */
  OffsetAllocator alloc = {g_array_new(FALSE, FALSE, sizeof(Block)), 0, FALSE};
  /* the largest single request, for the message if the arena cannot be had */
  gsize largest = 0;
  g_autofree gchar *largest_what = NULL;
  GArray *buffers = g_array_new(FALSE, TRUE, sizeof(Buffer));
  gint *value_buffer = g_new(gint, n_values);
  for (guint i = 0; i < n_values; i++)
    value_buffer[i] = -1;
  gsize *scratch_size = g_new0(gsize, MAX(n_steps, 1));
  plan->value_offset = g_new(gsize, n_values);
  for (guint i = 0; i < n_values; i++)
    plan->value_offset[i] = G_MAXSIZE;

  for (s = 0; s < n_steps; s++) {
    QkvNode *node = plan->steps[s].node;
    for (guint o = 0; o < node->n_outputs; o++) {
      QkvValue *out = node->outputs[o];
      gsize bytes = (gsize)qkv_shape_numel(&out->shape) * qkv_dtype_size(out->dtype);
      if (last_use[out->id] < (gint)s)
        last_use[out->id] = (gint)s; /* written, never read: dies at once */
      if (plan->value_external[out->id] != NULL)
        continue;
      /* a statistic: saturate rather than wrap */
      if (!g_size_checked_add(&plan->intermediates_size, plan->intermediates_size, round_up(bytes)))
        plan->intermediates_size = G_MAXSIZE;
      gint reuse = -1;
      if (o == 0 && (node->op->flags & QKV_OP_INPLACE) && node->n_inputs > 0 &&
          node->inputs[0]->kind == QKV_VALUE_OP) {
        QkvValue *in0 = node->inputs[0];
        gint b = value_buffer[in0->id];
        Buffer *buf = &g_array_index(buffers, Buffer, MAX(b, 0));
        gsize in_bytes = (gsize)qkv_shape_numel(&in0->shape) * qkv_dtype_size(in0->dtype);
        gboolean shared_with_other_input = FALSE;
        for (guint i = 1; i < node->n_inputs; i++)
          shared_with_other_input |=
              node->inputs[i]->kind == QKV_VALUE_OP && value_buffer[node->inputs[i]->id] == b;
        if (b >= 0 && !buf->pinned && buf->last_use == (gint)s && in_bytes == bytes &&
            in0->dtype == out->dtype && !shared_with_other_input)
          reuse = b;
      }
      if (reuse >= 0) {
        Buffer *buf = &g_array_index(buffers, Buffer, reuse);
        buf->last_use = last_use[out->id];
        buf->pinned = last_use[out->id] == G_MAXINT;
        value_buffer[out->id] = reuse;
      } else {
        Buffer buf = {0};
        buf.size = round_up(bytes);
        if (buf.size > largest) {
          g_autofree gchar *shape = qkv_shape_to_string(&out->shape);
          largest = buf.size;
          g_free(largest_what);
          largest_what = g_strdup_printf("value '%s' of node '%s', %s %s", out->name, node->name,
                                         qkv_dtype_name(out->dtype), shape);
        }
        buf.offset = buf.size ? offsets_alloc(&alloc, buf.size) : 0;
        buf.last_use = last_use[out->id];
        buf.pinned = last_use[out->id] == G_MAXINT;
        g_array_append_val(buffers, buf);
        value_buffer[out->id] = (gint)buffers->len - 1;
      }
    }
    if (node->op->scratch_size != NULL) {
      QkvShapeCtx sctx;
      g_autofree QkvShape *ins = g_new(QkvShape, MAX(node->n_inputs, 1));
      g_autofree QkvDType *idt = g_new(QkvDType, MAX(node->n_inputs, 1));
      qkv_node_fill_shape_ctx(node, &sctx, ins, idt);
      scratch_size[s] = round_up(node->op->scratch_size(&sctx, plan->max_threads));
      if (scratch_size[s] > largest) {
        largest = scratch_size[s];
        g_free(largest_what);
        largest_what =
            g_strdup_printf("scratch memory of node '%s' (op '%s')", node->name, node->op->name);
      }
      if (scratch_size[s] > 0) {
        plan->steps[s].scratch_offset = offsets_alloc(&alloc, scratch_size[s]);
        offsets_free(&alloc, plan->steps[s].scratch_offset, scratch_size[s]);
      }
    }
    /* release what this step was the last to touch */
    for (guint k = 0; k < node->n_inputs + node->n_outputs; k++) {
      QkvValue *v = k < node->n_inputs ? node->inputs[k] : node->outputs[k - node->n_inputs];
      if (v->kind != QKV_VALUE_OP || value_buffer[v->id] < 0)
        continue;
      Buffer *buf = &g_array_index(buffers, Buffer, value_buffer[v->id]);
      if (!buf->pinned && !buf->freed && buf->last_use <= (gint)s) {
        buf->freed = TRUE;
        if (buf->size)
          offsets_free(&alloc, buf->offset, buf->size);
      }
    }
  }
  plan->arena_size = alloc.top;
  plan->arena = alloc.overflow ? NULL : qkv_aligned_alloc0(MAX(plan->arena_size, 1));
  if (plan->arena == NULL) {
    if (alloc.overflow)
      g_set_error(error, QKV_ERROR, QKV_ERROR_MEMORY,
                  "compile: the plan's arena would need more than %" G_GSIZE_FORMAT
                  " bytes (largest request: %" G_GSIZE_FORMAT " bytes for %s)",
                  G_MAXSIZE, largest, largest_what);
    else
      g_set_error(error, QKV_ERROR, QKV_ERROR_MEMORY,
                  "compile: cannot allocate the plan's arena of %" G_GSIZE_FORMAT
                  " bytes (largest request: %" G_GSIZE_FORMAT " bytes for %s)",
                  plan->arena_size, largest, largest_what ? largest_what : "nothing");
    g_free(scratch_size);
    g_free(value_buffer);
    g_array_unref(buffers);
    g_array_unref(alloc.free);
    g_free(node_needed);
    g_free(needed);
    g_free(last_use);
    qkv_plan_free(plan);
    return NULL;
  }
  for (guint i = 0; i < n_values; i++)
    if (value_buffer[i] >= 0)
      plan->value_offset[i] = g_array_index(buffers, Buffer, value_buffer[i]).offset;

  /* bindings for graph inputs */
  plan->n_bindings = graph->inputs->len;
  plan->bindings = g_new0(Binding, MAX(plan->n_bindings, 1));
  for (guint i = 0; i < plan->n_bindings; i++) {
    plan->bindings[i].value = g_ptr_array_index(graph->inputs, i);
    plan->bindings[i].needed = needed[plan->bindings[i].value->id];
    plan->bindings[i].patches = g_array_new(FALSE, FALSE, sizeof(Patch));
  }

  /* kernel contexts */
  for (s = 0; s < n_steps; s++) {
    Step *st = &plan->steps[s];
    QkvNode *node = st->node;
    st->in = g_new0(QkvView, MAX(node->n_inputs, 1));
    st->out = g_new0(QkvView, node->n_outputs);
    for (guint i = 0; i < node->n_inputs; i++) {
      QkvValue *in = node->inputs[i];
      st->in[i].shape = in->shape;
      st->in[i].dtype = in->dtype;
      st->in[i].data = value_pointer(plan, in);
      if (in->kind == QKV_VALUE_INPUT) {
        Patch p = {s, i};
        g_array_append_val(plan->bindings[binding_index(plan, in)].patches, p);
      }
    }
    for (guint o = 0; o < node->n_outputs; o++) {
      st->out[o].shape = node->outputs[o]->shape;
      st->out[o].dtype = node->outputs[o]->dtype;
      st->out[o].data = value_pointer(plan, node->outputs[o]);
    }
    st->ctx.op_name = node->op->name;
    st->ctx.node_name = node->name;
    st->ctx.n_inputs = node->n_inputs;
    st->ctx.n_outputs = node->n_outputs;
    st->ctx.in = st->in;
    st->ctx.out = st->out;
    st->ctx.attrs = node->attrs;
    st->ctx.scratch = scratch_size[s] ? plan->arena + st->scratch_offset : NULL;
    st->ctx.scratch_size = scratch_size[s];
    st->ctx.training = opts.training;
    st->ctx.node_id = node->id;
  }

  /* variable shapes (see reshape_steps) */
  guint max_inputs = 1;
  plan->value_shape = g_new(QkvShape, MAX(n_values, 1));
  for (guint i = 0; i < n_values; i++)
    plan->value_shape[i] = ((QkvValue *)g_ptr_array_index(graph->values, i))->shape;
  plan->step_scratch = g_new0(gsize, MAX(n_steps, 1));
  for (s = 0; s < n_steps; s++) {
    plan->step_scratch[s] = scratch_size[s];
    max_inputs = MAX(max_inputs, plan->steps[s].node->n_inputs);
  }
  plan->rule_in_shapes = g_new0(QkvShape, max_inputs);
  plan->rule_in_dtypes = g_new0(QkvDType, max_inputs);
  for (guint i = 0; i < plan->n_bindings; i++)
    plan->bindings[i].shape = plan->bindings[i].value->shape;

  /* requested outputs as tensors that borrow plan memory */
  plan->n_outputs = n_outputs;
  plan->output_values = g_new0(QkvValue *, MAX(n_outputs, 1));
  plan->outputs = g_new0(QkvTensor *, MAX(n_outputs, 1));
  for (guint i = 0; i < n_outputs; i++) {
    plan->output_values[i] = outputs[i];
    plan->outputs[i] =
        qkv_tensor_new_view(outputs[i]->dtype, &outputs[i]->shape, value_pointer(plan, outputs[i]));
  }

  g_free(scratch_size);
  g_free(value_buffer);
  g_array_unref(buffers);
  g_array_unref(alloc.free);
  g_free(node_needed);
  g_free(needed);
  g_free(last_use);
  return plan;
}

void
qkv_plan_free(QkvPlan *plan)
{
  if (plan == NULL)
    return;
  for (guint s = 0; s < plan->n_steps; s++) {
    g_free(plan->steps[s].in);
    g_free(plan->steps[s].out);
  }
  g_free(plan->steps);
  for (guint i = 0; i < plan->n_bindings; i++)
    g_array_unref(plan->bindings[i].patches);
  g_free(plan->bindings);
  for (guint i = 0; i < plan->n_outputs; i++)
    qkv_tensor_free(plan->outputs[i]);
  g_free(plan->outputs);
  g_free(plan->output_values);
  g_free(plan->param_grads);
  g_free(plan->value_offset);
  g_free(plan->value_external);
  g_free(plan->value_shape);
  g_free(plan->step_scratch);
  g_free(plan->rule_in_shapes);
  g_free(plan->rule_in_dtypes);
  qkv_aligned_free(plan->arena);
  g_free(plan);
}

gboolean
qkv_plan_bind(QkvPlan *plan, const gchar *input_name, QkvTensor *tensor, GError **error)
{
  g_return_val_if_fail(plan != NULL && input_name != NULL && tensor != NULL, FALSE);
  Binding *b = NULL;
  for (guint i = 0; i < plan->n_bindings; i++)
    if (g_str_equal(plan->bindings[i].value->name, input_name))
      b = &plan->bindings[i];
  if (b == NULL) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_NOT_FOUND, "bind: the graph has no input '%s'",
                input_name);
    return FALSE;
  }
  QkvValue *v = b->value;
  if (tensor->dtype != v->dtype || !shape_fits(&tensor->shape, &v->shape)) {
    g_autofree gchar *want = qkv_shape_to_string(&v->shape);
    g_autofree gchar *got = qkv_shape_to_string(&tensor->shape);
    g_set_error(error, QKV_ERROR, QKV_ERROR_SHAPE,
                "bind: input '%s' is %s%s, the tensor given is %s%s (a bound tensor may be "
                "smaller in any dim, never bigger, and must have the same rank and dtype)",
                input_name, qkv_dtype_name(v->dtype), want, qkv_dtype_name(tensor->dtype), got);
    return FALSE;
  }
  b->bound = tensor;
  if (!qkv_shape_equal(&tensor->shape, &b->shape)) {
    b->shape = tensor->shape;
    plan->shapes_dirty = TRUE;
  }
  for (guint i = 0; i < b->patches->len; i++) {
    Patch *p = &g_array_index(b->patches, Patch, i);
    plan->steps[p->step].in[p->slot].data = tensor->data;
  }
  for (guint i = 0; i < plan->n_outputs; i++)
    if (plan->output_values[i] == v)
      plan->outputs[i]->data = tensor->data;
  return TRUE;
}

/* Re-run every step's shape rule on the bound shapes, so that kernels see the
 * smaller views. Memory was laid out for the compiled shapes: each value must
 * fit in its buffer and each scratch request in what compile reserved, else
 * the run is refused. Allocates nothing (except for an error message). */
static gboolean
reshape_steps(QkvPlan *plan, GError **error)
{
  gboolean varied = FALSE;
  for (guint i = 0; i < plan->n_bindings; i++) {
    Binding *b = &plan->bindings[i];
    plan->value_shape[b->value->id] = b->shape;
    varied |= !qkv_shape_equal(&b->shape, &b->value->shape);
  }
  if (!varied && !plan->shapes_varied) {
    plan->shapes_dirty = FALSE;
    return TRUE;
  }
  /* until this pass completes, the views may be half updated */
  plan->shapes_varied = TRUE;
  for (guint s = 0; s < plan->n_steps; s++) {
    Step *st = &plan->steps[s];
    QkvNode *node = st->node;
    QkvShapeCtx ctx;
    memset(&ctx, 0, sizeof(ctx));
    gboolean changed = FALSE;
    for (guint i = 0; i < node->n_inputs; i++) {
      QkvValue *in = node->inputs[i];
      plan->rule_in_shapes[i] = plan->value_shape[in->id];
      plan->rule_in_dtypes[i] = in->dtype;
      changed |= !qkv_shape_equal(&plan->rule_in_shapes[i], &in->shape);
    }
    if (changed && (node->op->flags & QKV_OP_STATIC_SHAPE)) {
      g_set_error(error, QKV_ERROR, QKV_ERROR_SHAPE,
                  "run: node '%s' (op '%s') fixes its output shape when the graph is built, so "
                  "the plan cannot run it on inputs smaller than compiled",
                  node->name, node->op->name);
      return FALSE;
    }
    ctx.op_name = node->op->name;
    ctx.node_name = node->name;
    ctx.n_inputs = node->n_inputs;
    ctx.in_shapes = plan->rule_in_shapes;
    ctx.in_dtypes = plan->rule_in_dtypes;
    ctx.attrs = node->attrs;
    ctx.n_outputs = 1;
    if (!changed) {
      for (guint o = 0; o < node->n_outputs; o++)
        ctx.out_shapes[o] = node->outputs[o]->shape;
    } else {
      GError *rule_error = NULL;
      if (!node->op->shape(&ctx, &rule_error)) {
        if (rule_error == NULL)
          qkv_shape_error(&ctx, &rule_error, QKV_ERROR_SHAPE, "the shape rule rejected the inputs");
        g_propagate_prefixed_error(error, rule_error, "run: with the bound shapes: ");
        return FALSE;
      }
      if (ctx.n_outputs != node->n_outputs)
        return qkv_shape_error(&ctx, error, QKV_ERROR_SHAPE,
                               "run: with the bound shapes the node has %u outputs, compiled %u",
                               ctx.n_outputs, node->n_outputs);
      for (guint o = 0; o < node->n_outputs; o++) {
        QkvValue *out = node->outputs[o];
        if (!qkv_shape_is_valid(&ctx.out_shapes[o]) || ctx.out_dtypes[o] != out->dtype ||
            ctx.out_shapes[o].rank != out->shape.rank ||
            qkv_shape_numel(&ctx.out_shapes[o]) > qkv_shape_numel(&out->shape)) {
          g_autofree gchar *want = qkv_shape_to_string(&out->shape);
          g_autofree gchar *got = qkv_shape_to_string(&ctx.out_shapes[o]);
          return qkv_shape_error(&ctx, error, QKV_ERROR_SHAPE,
                                 "run: with the bound shapes output %u would be %s%s, which does "
                                 "not fit the %s%s compiled",
                                 o, qkv_dtype_name(ctx.out_dtypes[o]), got,
                                 qkv_dtype_name(out->dtype), want);
        }
      }
      if (node->op->scratch_size != NULL) {
        gsize need = round_up(node->op->scratch_size(&ctx, plan->max_threads));
        if (need > plan->step_scratch[s])
          return qkv_shape_error(&ctx, error, QKV_ERROR_SHAPE,
                                 "run: with the bound shapes the node needs %" G_GSIZE_FORMAT
                                 " bytes of scratch memory, more than the %" G_GSIZE_FORMAT
                                 " compiled",
                                 need, plan->step_scratch[s]);
      }
    }
    for (guint i = 0; i < node->n_inputs; i++)
      st->in[i].shape = plan->rule_in_shapes[i];
    for (guint o = 0; o < node->n_outputs; o++) {
      st->out[o].shape = ctx.out_shapes[o];
      plan->value_shape[node->outputs[o]->id] = ctx.out_shapes[o];
    }
  }
  /* parameter gradients are copied whole into the store: their shapes must
   * not have moved (a gradient of a fixed-shape parameter never does) */
  for (guint i = 0; i < plan->n_param_grads; i++) {
    QkvValue *g = plan->param_grads[i].grad;
    if (!qkv_shape_equal(&plan->value_shape[g->id], &g->shape)) {
      g_set_error(error, QKV_ERROR, QKV_ERROR_SHAPE,
                  "run: with the bound shapes the gradient '%s' of parameter '%s' changes shape",
                  g->name, qkv_param_name(plan->param_grads[i].param));
      return FALSE;
    }
  }
  for (guint i = 0; i < plan->n_outputs; i++)
    plan->outputs[i]->shape = plan->value_shape[plan->output_values[i]->id];
  plan->shapes_varied = varied;
  plan->shapes_dirty = FALSE;
  return TRUE;
}

gboolean
qkv_plan_run(QkvPlan *plan, GError **error)
{
  g_return_val_if_fail(plan != NULL, FALSE);
  for (guint i = 0; i < plan->n_bindings; i++) {
    Binding *b = &plan->bindings[i];
    gboolean is_output = FALSE;
    for (guint j = 0; j < plan->n_outputs; j++)
      is_output |= plan->output_values[j] == b->value;
    if ((b->needed || is_output) && b->bound == NULL) {
      g_set_error(error, QKV_ERROR, QKV_ERROR_UNBOUND,
                  "run: graph input '%s' has no tensor bound (qkv_plan_bind)", b->value->name);
      return FALSE;
    }
  }
  if (plan->shapes_dirty && !reshape_steps(plan, error))
    return FALSE;
  qkv_set_running_plan_threads(plan->n_threads);
  for (guint s = 0; s < plan->n_steps; s++) {
    Step *st = &plan->steps[s];
    st->ctx.n_threads = plan->n_threads;
    st->ctx.seed = plan->seed;
    st->ctx.step = plan->step;
    if (G_UNLIKELY(plan->profiling)) {
      gint64 t0 = g_get_monotonic_time();
      st->node->op->forward(&st->ctx);
      st->seconds += (double)(g_get_monotonic_time() - t0) * 1e-6;
    } else {
      st->node->op->forward(&st->ctx);
    }
  }
  qkv_set_running_plan_threads(0);
  if (plan->profiling)
    plan->profiled_runs++;
  for (guint i = 0; i < plan->n_param_grads; i++) {
    ParamGrad *pg = &plan->param_grads[i];
    QkvTensor *dst = qkv_param_grad(pg->param);
    gconstpointer src = value_pointer(plan, pg->grad);
    if (src != qkv_tensor_data(dst))
      memcpy(qkv_tensor_data(dst), src, qkv_tensor_nbytes(dst));
  }
  plan->step++;
  return TRUE;
}

void
qkv_plan_set_profiling(QkvPlan *plan, gboolean enable)
{
  g_return_if_fail(plan != NULL);
  plan->profiling = enable;
}

void
qkv_plan_profile_reset(QkvPlan *plan)
{
  g_return_if_fail(plan != NULL);
  for (guint s = 0; s < plan->n_steps; s++)
    plan->steps[s].seconds = 0;
  plan->profiled_runs = 0;
}

typedef struct {
  const gchar *op;
  double seconds;
  guint nodes;
} OpTime;

static gint
compare_op_time(gconstpointer a, gconstpointer b)
{
  double x = ((const OpTime *)a)->seconds, y = ((const OpTime *)b)->seconds;
  return (x < y) - (x > y);
}

gchar *
qkv_plan_profile_report(const QkvPlan *plan)
{
  g_return_val_if_fail(plan != NULL, NULL);
  g_autoptr(GHashTable) index = g_hash_table_new(g_str_hash, g_str_equal);
  g_autoptr(GArray) ops = g_array_new(FALSE, FALSE, sizeof(OpTime));
  double total = 0;
  for (guint s = 0; s < plan->n_steps; s++) {
    const Step *st = &plan->steps[s];
    const gchar *name = st->node->op->name;
    gpointer found;
    if (!g_hash_table_lookup_extended(index, name, NULL, &found)) {
      OpTime t = {name, 0, 0};
      found = GUINT_TO_POINTER(ops->len);
      g_array_append_val(ops, t);
      g_hash_table_insert(index, (gpointer)name, found);
    }
    OpTime *t = &g_array_index(ops, OpTime, GPOINTER_TO_UINT(found));
    t->seconds += st->seconds;
    t->nodes++;
    total += st->seconds;
  }
  g_array_sort(ops, compare_op_time);
  double runs = (double)MAX(plan->profiled_runs, 1);
  GString *out = g_string_new(NULL);
  g_string_append_printf(out, "%-32s %6s %12s %7s\n", "op", "nodes", "ms/run", "share");
  for (guint i = 0; i < ops->len; i++) {
    const OpTime *t = &g_array_index(ops, OpTime, i);
    g_string_append_printf(out, "%-32s %6u %12.3f %6.1f%%\n", t->op, t->nodes,
                           1e3 * t->seconds / runs, total > 0 ? 100 * t->seconds / total : 0.0);
  }
  g_string_append_printf(out, "%-32s %6u %12.3f   (%" G_GUINT64_FORMAT " runs)\n", "total",
                         plan->n_steps, 1e3 * total / runs, plan->profiled_runs);
  return g_string_free(out, FALSE);
}

const QkvTensor *
qkv_plan_output(QkvPlan *plan, guint index)
{
  g_return_val_if_fail(plan != NULL && index < plan->n_outputs, NULL);
  return plan->outputs[index];
}

float
qkv_plan_output_scalar(QkvPlan *plan, guint index)
{
  const QkvTensor *t = qkv_plan_output(plan, index);
  g_return_val_if_fail(t != NULL && qkv_tensor_numel(t) > 0, 0.0f);
  return (float)qkv_tensor_get(t, 0);
}

gsize
qkv_plan_arena_size(const QkvPlan *plan)
{
  return plan->arena_size;
}

gsize
qkv_plan_intermediates_size(const QkvPlan *plan)
{
  return plan->intermediates_size;
}

guint
qkv_plan_n_steps(const QkvPlan *plan)
{
  return plan->n_steps;
}

void
qkv_plan_set_n_threads(QkvPlan *plan, gint n_threads)
{
  plan->n_threads = n_threads > 0 ? n_threads : qkv_get_num_threads();
  /* kernels' scratch memory was sized for max_threads at compile time */
  plan->n_threads = MIN(plan->n_threads, plan->max_threads);
}

gint
qkv_plan_get_n_threads(const QkvPlan *plan)
{
  return plan->n_threads;
}

void
qkv_plan_set_seed(QkvPlan *plan, guint64 seed)
{
  plan->seed = seed;
}

void
qkv_plan_set_step(QkvPlan *plan, guint64 step)
{
  plan->step = step;
}

guint64
qkv_plan_get_step(const QkvPlan *plan)
{
  return plan->step;
}
