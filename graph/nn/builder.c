/* builder.c: all-or-nothing steps for builders, from the graph's and the
 * store's public marks. */
#include <qkv/qkv.h>

void
qkv_builder_begin(QkvBuilder *b, QkvBuilderMark *mark)
{
  g_return_if_fail(b != NULL && b->graph != NULL && b->params != NULL && mark != NULL);
  *mark = (QkvBuilderMark){.scope = g_strdup(qkv_graph_get_scope(b->graph))};
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
  qkv_graph_set_scope(b->graph, mark->scope);
  g_clear_pointer(&mark->scope, g_free);
  return result;
}
