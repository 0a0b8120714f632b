/* builder.c: the builder's name scopes, and all-or-nothing steps for
 * builders from the graph's and the store's public marks. */
#include <string.h>
#include <qkv/qkv.h>

#include "nn/builder-internal.h"

/* One pushed name. */
typedef struct {
  gchar *path;        /* the names up to this level joined by ".", NULL while empty */
  gchar *graph_scope; /* the graph's scope before the push, for the pop */
  gboolean refused;   /* this push, or one below it, failed */
} ScopeLevel;

struct _QkvBuilderScopes {
  /* the builder that pushed: a copy of it holds the same pointer, and must
   * not pop levels the original will pop again */
  const QkvBuilder *owner;
  GArray *levels; /* ScopeLevel, innermost last */
};

/* "a.b", or whichever of a and b is not empty; NULL when both are. */
static gchar *
join_names(const gchar *a, const gchar *b)
{
  gboolean has_a = a != NULL && *a, has_b = b != NULL && *b;
  if (has_a && has_b)
    return g_strconcat(a, ".", b, NULL);
  return has_a ? g_strdup(a) : has_b ? g_strdup(b) : NULL;
}

static ScopeLevel *
top_level(const QkvBuilder *b)
{
  if (b->scopes == NULL || b->scopes->levels->len == 0)
    return NULL;
  return &g_array_index(b->scopes->levels, ScopeLevel, b->scopes->levels->len - 1);
}

static void
scope_level_clear(gpointer data)
{
  ScopeLevel *level = data;
  g_free(level->path);
  g_free(level->graph_scope);
}

/* Why name cannot be pushed onto parent, or NULL when it can. */
static gchar *
push_refusal(const gchar *parent, const gchar *name)
{
  if (!g_utf8_validate(name, -1, NULL))
    return g_strdup_printf("qkv_builder_push: the name under scope '%s' is not valid UTF-8",
                           parent ? parent : "");
  gsize len = (parent ? strlen(parent) + 1 : 0) + strlen(name);
  if (len <= QKV_BUILDER_SCOPE_MAX)
    return NULL;
  g_autofree gchar *start = g_utf8_substring(name, 0, 32);
  return g_strdup_printf("qkv_builder_push: the scope would be %" G_GSIZE_FORMAT
                         " bytes long (name '%s…'), more than QKV_BUILDER_SCOPE_MAX (%d)",
                         len, start, QKV_BUILDER_SCOPE_MAX);
}

gboolean
qkv_builder_push(QkvBuilder *b, const gchar *name, GError **error)
{
  g_return_val_if_fail(b != NULL && name != NULL, FALSE);
  g_return_val_if_fail(b->scopes == NULL || b->scopes->owner == b, FALSE);
  if (b->scopes == NULL) {
    b->scopes = g_new0(QkvBuilderScopes, 1);
    b->scopes->owner = b;
    b->scopes->levels = g_array_new(FALSE, FALSE, sizeof(ScopeLevel));
    g_array_set_clear_func(b->scopes->levels, scope_level_clear);
  }
  const ScopeLevel *top = top_level(b);
  const gchar *parent = top ? top->path : NULL;
  ScopeLevel level = {.refused = top != NULL && top->refused};
  if (b->graph != NULL)
    level.graph_scope = g_strdup(qkv_graph_get_scope(b->graph));
  /* Errors are sticky, but a push always adds a level (each push has its
   * pop): after an earlier failure the level is a refused one, the first
   * error is kept and the push returns FALSE, as every call does then. */
  gboolean sticky = error != NULL && *error != NULL;
  g_autofree gchar *refusal = sticky ? NULL : push_refusal(parent, name);
  if (sticky || refusal != NULL) {
    level.refused = TRUE;
    level.path = g_strdup(parent);
    if (refusal != NULL)
      g_set_error_literal(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT, refusal);
  } else {
    level.path = join_names(parent, name);
    if (b->graph != NULL) {
      g_autofree gchar *graph_scope = join_names(level.graph_scope, name);
      qkv_graph_set_scope(b->graph, graph_scope);
    }
  }
  g_array_append_val(b->scopes->levels, level);
  return !sticky && refusal == NULL;
}

gboolean
qkv_builder_push_printf(QkvBuilder *b, GError **error, const gchar *format, ...)
{
  g_return_val_if_fail(format != NULL, FALSE);
  va_list args;
  va_start(args, format);
  g_autofree gchar *name = g_strdup_vprintf(format, args);
  va_end(args);
  return qkv_builder_push(b, name, error);
}

/* Remove the innermost level (there is one); free the stack once empty. */
static void
pop_level(QkvBuilder *b)
{
  ScopeLevel *level = top_level(b);
  if (b->graph != NULL)
    qkv_graph_set_scope(b->graph, level->graph_scope);
  g_array_set_size(b->scopes->levels, b->scopes->levels->len - 1);
  if (b->scopes->levels->len == 0) {
    g_array_unref(b->scopes->levels);
    g_clear_pointer(&b->scopes, g_free);
  }
}

void
qkv_builder_pop(QkvBuilder *b)
{
  g_return_if_fail(b != NULL);
  g_return_if_fail(b->scopes == NULL || b->scopes->owner == b);
  g_return_if_fail(qkv_builder_get_scope_depth(b) > 0);
  pop_level(b);
}

void
qkv_builder_clear_scopes(QkvBuilder *b)
{
  g_return_if_fail(b != NULL);
  g_return_if_fail(b->scopes == NULL || b->scopes->owner == b);
  while (b->scopes != NULL)
    pop_level(b);
}

const gchar *
qkv_builder_get_scope(const QkvBuilder *b)
{
  g_return_val_if_fail(b != NULL, NULL);
  const ScopeLevel *top = top_level(b);
  return top ? top->path : NULL;
}

guint
qkv_builder_get_scope_depth(const QkvBuilder *b)
{
  g_return_val_if_fail(b != NULL, 0);
  return b->scopes ? b->scopes->levels->len : 0;
}

gchar *
qkv_builder_scoped_name(const QkvBuilder *b, const gchar *name)
{
  g_return_val_if_fail(b != NULL && name != NULL, NULL);
  const gchar *scope = qkv_builder_get_scope(b);
  /* an empty name stays empty without a scope, as a store may hold "" */
  return scope != NULL ? join_names(scope, name) : g_strdup(name);
}

gboolean
builder_scope_accepts(const QkvBuilder *b, const gchar *name, GError **error)
{
  const ScopeLevel *top = top_level(b);
  if (top == NULL || !top->refused)
    return TRUE;
  g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
              "parameter '%s': a scope it would be under was refused by qkv_builder_push()", name);
  return FALSE;
}

void
qkv_builder_begin(QkvBuilder *b, QkvBuilderMark *mark)
{
  g_return_if_fail(b != NULL && b->graph != NULL && b->params != NULL && mark != NULL);
  *mark = (QkvBuilderMark){.scope = g_strdup(qkv_graph_get_scope(b->graph)),
                           .scope_depth = qkv_builder_get_scope_depth(b)};
  qkv_graph_mark(b->graph, &mark->graph);
  qkv_params_mark(b->params, &mark->params);
}

QkvValue *
qkv_builder_end(QkvBuilder *b, QkvBuilderMark *mark, QkvValue *result)
{
  g_return_val_if_fail(b != NULL && b->graph != NULL && b->params != NULL && mark != NULL, NULL);
  if (result == NULL) {
    /* The graph first: its parameter values point into the store. */
    qkv_graph_rollback(b->graph, &mark->graph);
    qkv_params_rollback(b->params, &mark->params);
  }
  /* levels an early return left pushed; only the owner can have pushed them */
  while (qkv_builder_get_scope_depth(b) > mark->scope_depth)
    pop_level(b);
  if (qkv_builder_get_scope_depth(b) < mark->scope_depth)
    g_critical("qkv_builder_end: the step popped %u scope levels it did not push",
               mark->scope_depth - qkv_builder_get_scope_depth(b));
  qkv_graph_set_scope(b->graph, mark->scope);
  g_clear_pointer(&mark->scope, g_free);
  return result;
}
