/* consumer.c: built out of the tree against the installed qkv only; loads a
 * plugin built the same way and runs its op.
 *   consumer PLUGIN */
#include <qkv/qkv.h>

#include <math.h>
#include <stdio.h>

int
main(int argc, char **argv)
{
  if (argc != 2) {
    fprintf(stderr, "usage: %s PLUGIN\n", argv[0]);
    return 2;
  }
  g_autoptr(GError) error = NULL;
  const QkvPlugin *plugin = qkv_plugin_load(argv[1], &error);
  if (plugin == NULL) {
    fprintf(stderr, "consumer: %s\n", error->message);
    return 1;
  }
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvShape s = QKV_SHAPE(3);
  QkvValue *x = qkv_graph_input(g, "x", QKV_F32, &s, &error);
  QkvValue *y = x ? qkv_graph_op(g, "example.gelu", &x, 1, NULL, &error) : NULL;
  g_autoptr(QkvPlan) plan = y ? qkv_graph_compile(g, &y, 1, NULL, &error) : NULL;
  float xv[] = {-1.0f, 0.0f, 2.0f};
  g_autoptr(QkvTensor) xt = qkv_tensor_new_f32(&s, xv);
  if (plan == NULL || !qkv_plan_bind(plan, "x", xt, &error) || !qkv_plan_run(plan, &error)) {
    fprintf(stderr, "consumer: %s\n", error->message);
    return 1;
  }
  const QkvTensor *out = qkv_plan_output(plan, 0);
  for (int i = 0; i < 3; i++) {
    double v = xv[i];
    double want = 0.5 * v * (1 + tanh(sqrt(2 / G_PI) * (v + 0.044715 * v * v * v)));
    double got = qkv_tensor_get(out, i);
    printf("gelu(%g) = %.6f\n", v, got);
    if (fabs(got - want) > 1e-5) {
      fprintf(stderr, "consumer: gelu(%g) = %g, expected %g\n", v, got, want);
      return 1;
    }
  }
  printf("plugin %s %s from %s: ok\n", qkv_plugin_get_name(plugin), qkv_plugin_get_version(plugin),
         qkv_plugin_get_path(plugin));
  return 0;
}
