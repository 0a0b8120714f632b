/* arena.c: the memory of a plan. Every intermediate value and every
 * kernel's scratch memory gets a fixed offset in one arena, laid out at
 * compile time from the values' lifetimes so that values which are never
 * alive together share bytes; running then allocates nothing. */
#include "plan/plan-private.h"

#include <string.h>

#define ARENA_ALIGN 64

/* ---- a best-fit allocator of offsets inside the arena ---- */

typedef struct {
  gsize offset, size;
} Block;

typedef struct {
  GArray *free; /* Block, sorted by offset, never adjacent */
  gsize top;
  gboolean overflow; /* the layout needs more than G_MAXSIZE bytes */
} OffsetAllocator;

/* A plugin's scratch_size may return anything, hence the saturation. */
gsize
qkv_arena_round_up(gsize n)
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

/* ---- the liveness layout ---- */

/* One stretch of arena bytes, shared by a value and the values computed in
 * place over it. */
typedef struct {
  gsize offset, size;
  gint last_use;
  gboolean pinned, freed;
} Buffer;

typedef struct {
  QkvPlan *plan;
  gint *last_use; /* the caller's, per value id */
  OffsetAllocator alloc;
  GArray *buffers;    /* Buffer */
  gint *value_buffer; /* per value id: index into buffers, or -1 */
  /* the largest single request, for the message if the arena cannot be had */
  gsize largest;
  gchar *largest_what;
} ArenaLayout;

static void
layout_init(ArenaLayout *l, QkvPlan *plan, gint *last_use)
{
  const guint n_values = plan->graph->values->len;
  memset(l, 0, sizeof *l);
  l->plan = plan;
  l->last_use = last_use;
  l->alloc.free = g_array_new(FALSE, FALSE, sizeof(Block));
  l->buffers = g_array_new(FALSE, TRUE, sizeof(Buffer));
  l->value_buffer = g_new(gint, n_values);
  for (guint i = 0; i < n_values; i++)
    l->value_buffer[i] = -1;
}

static void
layout_clear(ArenaLayout *l)
{
  g_free(l->largest_what);
  g_free(l->value_buffer);
  g_array_unref(l->buffers);
  g_array_unref(l->alloc.free);
}

static gsize
value_bytes(const QkvPlan *plan, const QkvValue *v)
{
  return (gsize)qkv_shape_numel(&v->shape) * qkv_dtype_size(qkv_plan_value_dtype(plan, v));
}

/* Remember the largest request; what is only formatted when it is one. */
static gboolean
layout_is_largest(ArenaLayout *l, gsize size)
{
  if (size <= l->largest)
    return FALSE;
  l->largest = size;
  g_clear_pointer(&l->largest_what, g_free);
  return TRUE;
}

/* The buffer of the node's first input, if output 0 (of that many bytes)
 * may overwrite it: the op works in place, the input dies at this step and
 * no other input of the step reads the same bytes. Else -1. */
static gint
inplace_buffer(const ArenaLayout *l, const QkvNode *node, guint o, gsize bytes, gint s)
{
  if (o != 0 || !(node->op->flags & QKV_OP_INPLACE) || node->n_inputs == 0 ||
      node->inputs[0]->kind != QKV_VALUE_OP)
    return -1;
  const QkvValue *in0 = node->inputs[0];
  gint b = l->value_buffer[in0->id];
  if (b < 0)
    return -1;
  const Buffer *buf = &g_array_index(l->buffers, Buffer, b);
  if (buf->pinned || buf->last_use != s || value_bytes(l->plan, in0) != bytes ||
      qkv_plan_value_dtype(l->plan, in0) != qkv_plan_value_dtype(l->plan, node->outputs[0]))
    return -1;
  for (guint i = 1; i < node->n_inputs; i++)
    if (node->inputs[i]->kind == QKV_VALUE_OP && l->value_buffer[node->inputs[i]->id] == b)
      return -1;
  return b;
}

/* Give output o of step s's node its bytes: the input buffer it may
 * overwrite, or a new buffer. */
static void
place_output(ArenaLayout *l, const QkvNode *node, guint o, gint s)
{
  QkvPlan *plan = l->plan;
  QkvValue *out = node->outputs[o];
  gsize bytes = value_bytes(plan, out);
  if (l->last_use[out->id] < s)
    l->last_use[out->id] = s; /* written, never read: dies at once */
  if (plan->value_external[out->id] != NULL)
    return;
  /* a statistic: saturate rather than wrap */
  if (!g_size_checked_add(&plan->intermediates_size, plan->intermediates_size,
                          qkv_arena_round_up(bytes)))
    plan->intermediates_size = G_MAXSIZE;
  gint reuse = inplace_buffer(l, node, o, bytes, s);
  if (reuse >= 0) {
    Buffer *buf = &g_array_index(l->buffers, Buffer, reuse);
    buf->last_use = l->last_use[out->id];
    buf->pinned = l->last_use[out->id] == G_MAXINT;
    l->value_buffer[out->id] = reuse;
    return;
  }
  Buffer buf = {0};
  buf.size = qkv_arena_round_up(bytes);
  if (layout_is_largest(l, buf.size)) {
    g_autofree gchar *shape = qkv_shape_to_string(&out->shape);
    l->largest_what = g_strdup_printf("value '%s' of node '%s', %s %s", out->name, node->name,
                                      qkv_dtype_name(qkv_plan_value_dtype(plan, out)), shape);
  }
  buf.offset = buf.size ? offsets_alloc(&l->alloc, buf.size) : 0;
  buf.last_use = l->last_use[out->id];
  buf.pinned = l->last_use[out->id] == G_MAXINT;
  g_array_append_val(l->buffers, buf);
  l->value_buffer[out->id] = (gint)l->buffers->len - 1;
}

/* Scratch memory lives only while its step runs: reserve it at the current
 * layout and give it back at once. */
static void
reserve_scratch(ArenaLayout *l, guint s)
{
  QkvPlan *plan = l->plan;
  const QkvNode *node = plan->steps[s].node;
  if (node->op->scratch_size == NULL)
    return;
  QkvShapeCtx sctx;
  g_autofree QkvShape *ins = g_new(QkvShape, MAX(node->n_inputs, 1));
  g_autofree QkvDType *idt = g_new(QkvDType, MAX(node->n_inputs, 1));
  qkv_node_fill_shape_ctx(node, &sctx, ins, idt);
  for (guint o = 0; o < node->n_outputs && o < QKV_MAX_OUTPUTS; o++)
    sctx.out_dtypes[o] = qkv_plan_value_dtype(plan, node->outputs[o]);
  gsize size = qkv_arena_round_up(node->op->scratch_size(&sctx, plan->max_threads));
  plan->step_scratch[s] = size;
  if (layout_is_largest(l, size))
    l->largest_what =
        g_strdup_printf("scratch memory of node '%s' (op '%s')", node->name, node->op->name);
  if (size > 0) {
    plan->steps[s].scratch_offset = offsets_alloc(&l->alloc, size);
    offsets_free(&l->alloc, plan->steps[s].scratch_offset, size);
  }
}

/* Release the buffers that step s was the last to touch. */
static void
release_dead(ArenaLayout *l, const QkvNode *node, gint s)
{
  for (guint k = 0; k < node->n_inputs + node->n_outputs; k++) {
    QkvValue *v = k < node->n_inputs ? node->inputs[k] : node->outputs[k - node->n_inputs];
    if (v->kind != QKV_VALUE_OP || l->value_buffer[v->id] < 0)
      continue;
    Buffer *buf = &g_array_index(l->buffers, Buffer, l->value_buffer[v->id]);
    if (!buf->pinned && !buf->freed && buf->last_use <= s) {
      buf->freed = TRUE;
      if (buf->size)
        offsets_free(&l->alloc, buf->offset, buf->size);
    }
  }
}

static gboolean
allocate_arena(ArenaLayout *l, GError **error)
{
  QkvPlan *plan = l->plan;
  plan->arena_size = l->alloc.top;
  plan->arena = l->alloc.overflow ? NULL : qkv_aligned_alloc0(MAX(plan->arena_size, 1));
  if (plan->arena != NULL)
    return TRUE;
  if (l->alloc.overflow)
    g_set_error(error, QKV_ERROR, QKV_ERROR_MEMORY,
                "compile: the plan's arena would need more than %" G_GSIZE_FORMAT
                " bytes (largest request: %" G_GSIZE_FORMAT " bytes for %s)",
                G_MAXSIZE, l->largest, l->largest_what);
  else
    g_set_error(error, QKV_ERROR, QKV_ERROR_MEMORY,
                "compile: cannot allocate the plan's arena of %" G_GSIZE_FORMAT
                " bytes (largest request: %" G_GSIZE_FORMAT " bytes for %s)",
                plan->arena_size, l->largest, l->largest_what ? l->largest_what : "nothing");
  return FALSE;
}

gboolean
qkv_arena_lay_out(QkvPlan *plan, gint *last_use, GError **error)
{
  const guint n_values = plan->graph->values->len;
  plan->step_scratch = g_new0(gsize, MAX(plan->n_steps, 1));
  plan->value_offset = g_new(gsize, n_values);
  for (guint i = 0; i < n_values; i++)
    plan->value_offset[i] = G_MAXSIZE;

  ArenaLayout l;
  layout_init(&l, plan, last_use);
  for (guint s = 0; s < plan->n_steps; s++) {
    const QkvNode *node = plan->steps[s].node;
    for (guint o = 0; o < node->n_outputs; o++)
      place_output(&l, node, o, (gint)s);
    reserve_scratch(&l, s);
    release_dead(&l, node, (gint)s);
  }
  gboolean ok = allocate_arena(&l, error);
  for (guint i = 0; ok && i < n_values; i++)
    if (l.value_buffer[i] >= 0)
      plan->value_offset[i] = g_array_index(l.buffers, Buffer, l.value_buffer[i]).offset;
  layout_clear(&l);
  return ok;
}

gpointer
qkv_plan_value_pointer(QkvPlan *plan, QkvValue *v)
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
  case QKV_VALUE_STATE:
    return plan->value_external[v->id];
  case QKV_VALUE_INPUT: {
    for (guint i = 0; i < plan->n_bindings; i++)
      if (plan->bindings[i].value == v)
        return plan->bindings[i].bound ? qkv_tensor_data(plan->bindings[i].bound) : NULL;
    return NULL;
  }
  }
  return NULL;
}
