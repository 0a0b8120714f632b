/* test-plugins.c: the example plugins (gelu, alibi, activations), found
 * through QKV_PLUGIN_PATH at initialisation: their values, their gradients
 * (rules and decompositions, checked by finite differences), a model that
 * trains through a plugin op, and the qkv-info tool. */
#include "test-util.h"

#include <math.h>
#include <string.h>
#include <sys/wait.h>

/* ------------------------------------------------------------------------- */
/* Helpers                                                                   */
/* ------------------------------------------------------------------------- */

typedef struct {
  const gchar *op;
  GVariant *attrs; /* a{sv}, or NULL; not consumed */
} OpCall;

/* Build: op(inputs...). */
static QkvValue *
build_op(QkvGraph *graph, QkvValue *const *inputs, gpointer user_data, GError **error)
{
  const OpCall *call = user_data;
  const QkvOpDef *def = qkv_op_lookup(call->op);
  g_assert_nonnull(def);
  return qkv_graph_op(graph, call->op, inputs, def->min_inputs,
                      call->attrs ? g_variant_ref(call->attrs) : NULL, error);
}

/* Build: softmax(op(x)), so masked entries (-1e6) do not swamp the check. */
static QkvValue *
build_op_softmax(QkvGraph *graph, QkvValue *const *inputs, gpointer user_data, GError **error)
{
  QkvValue *y = build_op(graph, inputs, user_data, error);
  return y ? qkv_softmax(y, error) : NULL;
}

/* Build: the op's decomposition, next to a node of the op. */
static QkvValue *
build_decomposition(QkvGraph *graph, QkvValue *const *inputs, gpointer user_data, GError **error)
{
  const OpCall *call = user_data;
  const QkvOpDef *def = qkv_op_lookup(call->op);
  g_assert_nonnull(def);
  g_assert_nonnull(def->decompose);
  QkvNode *node = qkv_graph_add_node(graph, call->op, inputs, def->min_inputs, NULL, error);
  if (node == NULL)
    return NULL;
  QkvValue *outputs[QKV_MAX_OUTPUTS] = {NULL};
  QkvDecomposeCtx ctx = {
      .graph = graph,
      .node = node,
      .n_inputs = def->min_inputs,
      .n_outputs = qkv_node_n_outputs(node),
      .inputs = inputs,
      .outputs = outputs,
  };
  if (!def->decompose(&ctx, error))
    return NULL;
  return outputs[0];
}

static GVariant *
alibi_attrs(gboolean causal, gint64 window)
{
  GVariantBuilder b;
  g_variant_builder_init(&b, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&b, "{sv}", "causal", g_variant_new_boolean(causal));
  g_variant_builder_add(&b, "{sv}", "window", g_variant_new_int64(window));
  return g_variant_ref_sink(g_variant_builder_end(&b));
}

static double
gelu_ref(double x)
{
  return 0.5 * x * (1 + tanh(sqrt(2 / G_PI) * (x + 0.044715 * x * x * x)));
}

static double
gelu_grad_ref(double x)
{
  double k = sqrt(2 / G_PI), t = tanh(k * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
}

static double
softplus_ref(double x)
{
  return x > 0 ? x + log1p(exp(-x)) : log1p(exp(x));
}

/* ------------------------------------------------------------------------- */
/* Loading                                                                   */
/* ------------------------------------------------------------------------- */

static void
assert_plugin(const gchar *name, const gchar *path, const gchar *const *ops)
{
  const QkvPlugin *plugin = qkv_plugin_lookup(name);
  g_assert_nonnull(plugin);
  g_autofree gchar *abs_path = g_canonicalize_filename(path, NULL);
  g_assert_cmpstr(qkv_plugin_get_name(plugin), ==, name);
  g_assert_cmpstr(qkv_plugin_get_path(plugin), ==, abs_path);
  g_assert_cmpstr(qkv_plugin_get_version(plugin), ==, "1.0.0");
  g_assert_cmpstr(qkv_plugin_get_license(plugin), ==, "MIT");
  g_assert_true(g_strv_equal((const gchar *const *)qkv_plugin_get_ops(plugin), ops));
  for (guint i = 0; ops[i] != NULL; i++) {
    g_assert_nonnull(qkv_op_lookup(ops[i]));
    g_assert_cmpstr(qkv_op_origin(ops[i]), ==, abs_path);
  }
}

static void
test_autoload(void)
{
  /* The suite runs with QKV_PLUGIN_PATH set to the example plugins' build
   * directory: qkv_init() (here, through qkv_op_lookup()) loaded them. */
  g_assert_nonnull(qkv_op_lookup("example.gelu"));
  const gchar *const gelu_ops[] = {"example.gelu", "example.gelu_backward", NULL};
  const gchar *const alibi_ops[] = {"alibi", "alibi_backward", NULL};
  const gchar *const act_ops[] = {"mish", "softplus", "swish", NULL};
  assert_plugin("gelu", PLUGIN_GELU, gelu_ops);
  assert_plugin("alibi", PLUGIN_ALIBI, alibi_ops);
  assert_plugin("activations", PLUGIN_ACTIVATIONS, act_ops);
  g_assert_cmpuint(qkv_plugin_count(), ==, 3);
  g_assert_cmpstr(qkv_op_origin("matmul"), ==, "built-in");

  const gchar *const *dirs = qkv_plugin_search_path();
  g_assert_nonnull(dirs);
  g_assert_cmpstr(dirs[0], ==, EXAMPLE_PLUGINS_DIR);
  /* QKV_PLUGIN_SYSTEM_PATH is empty in the test environment. */
  g_assert_null(dirs[1]);

  /* Plugin ops are listed with the built-ins. */
  g_auto(GStrv) names = qkv_op_list();
  g_assert_true(g_strv_contains((const gchar *const *)names, "alibi"));
  g_assert_true(g_strv_contains((const gchar *const *)names, "matmul"));
}

static void
test_load_twice(void)
{
  g_autoptr(GError) error = NULL;
  guint n = qkv_plugin_count();
  const QkvPlugin *before = qkv_plugin_lookup("gelu");
  /* The same file again, by its path or through a relative one: a no-op. */
  const QkvPlugin *again = qkv_plugin_load(PLUGIN_GELU, &error);
  g_assert_no_error(error);
  g_assert_true(again == before);
  g_autofree gchar *cwd = g_get_current_dir();
  g_autofree gchar *relative = NULL;
  if (g_str_has_prefix(PLUGIN_GELU, cwd) && PLUGIN_GELU[strlen(cwd)] == '/') {
    relative = g_strdup(PLUGIN_GELU + strlen(cwd) + 1);
    g_assert_true(qkv_plugin_load(relative, &error) == before);
    g_assert_no_error(error);
  }
  g_assert_cmpuint(qkv_plugin_count(), ==, n);
}

/* ------------------------------------------------------------------------- */
/* gelu                                                                      */
/* ------------------------------------------------------------------------- */

static void
test_gelu_values(void)
{
  QkvShape s = QKV_SHAPE(1000);
  g_autoptr(QkvTensor) x = qkv_test_uniform(&s, 7, -12, 12);
  qkv_tensor_f32(x)[0] = 0.0f;
  OpCall call = {"example.gelu", NULL};
  g_autoptr(QkvTensor) y = qkv_test_eval(1, &x, build_op, &call);
  for (gint64 i = 0; i < 1000; i++) {
    double xi = qkv_tensor_get(x, i);
    g_assert_cmpfloat_with_epsilon(qkv_tensor_get(y, i), gelu_ref(xi), 1e-5 * fmax(1, fabs(xi)));
  }

  /* gelu_backward with dy = 1 is gelu'. */
  g_autoptr(QkvTensor) ones = qkv_tensor_new(QKV_F32, &s);
  qkv_tensor_fill(ones, 1.0);
  QkvTensor *inputs[] = {ones, x};
  OpCall back = {"example.gelu_backward", NULL};
  g_autoptr(QkvTensor) d = qkv_test_eval(2, inputs, build_op, &back);
  for (gint64 i = 0; i < 1000; i++)
    g_assert_cmpfloat_with_epsilon(qkv_tensor_get(d, i), gelu_grad_ref(qkv_tensor_get(x, i)), 1e-5);
  /* ... and so is its decomposition. */
  g_autoptr(QkvTensor) dd = qkv_test_eval(2, inputs, build_decomposition, &back);
  qkv_assert_tensor_close(dd, d, 1e-4);
}

static void
test_gelu_gradcheck(void)
{
  QkvShape s = QKV_SHAPE(3, 7);
  g_autoptr(QkvTensor) x = qkv_test_uniform(&s, 11, -3, 3);
  OpCall call = {"example.gelu", NULL};
  qkv_test_gradcheck("example.gelu", 1, &x, NULL, build_op, &call);
}

/* gelu_backward has no gradient rule: its gradient (gelu's second
 * derivative) comes from its decomposition. */
static void
test_gelu_backward_gradcheck(void)
{
  QkvShape s = QKV_SHAPE(4, 5);
  g_autoptr(QkvTensor) dy = qkv_test_uniform(&s, 12, -1, 1);
  g_autoptr(QkvTensor) x = qkv_test_uniform(&s, 13, -3, 3);
  QkvTensor *inputs[] = {dy, x};
  OpCall call = {"example.gelu_backward", NULL};
  g_assert_null(qkv_op_lookup("example.gelu_backward")->gradient);
  qkv_test_gradcheck("example.gelu_backward", 2, inputs, NULL, build_op, &call);
}

/* ------------------------------------------------------------------------- */
/* alibi                                                                     */
/* ------------------------------------------------------------------------- */

/* The expected output for scores x of shape (B, H, n_q, n_k). */
static void
alibi_expected(const QkvTensor *x, gboolean causal, gint64 window, const double *slopes, float *out)
{
  const QkvShape *s = qkv_tensor_shape(x);
  gint64 heads = s->dims[1], n_q = s->dims[2], n_k = s->dims[3];
  for (gint64 i = 0; i < qkv_tensor_numel(x); i++) {
    gint64 j = i % n_k, q = (i / n_k) % n_q, h = (i / (n_k * n_q)) % heads;
    gint64 d = q + n_k - n_q - j;
    gboolean masked = (causal && d < 0) || (window > 0 && ABS(d) >= window);
    out[i] = masked ? -1e6f : (float)(qkv_tensor_get(x, i) - slopes[h] * (double)ABS(d));
  }
}

static void
test_alibi_values(void)
{
  /* 3 heads, not a power of two: 2^-4, 2^-8, then 2^-2 (from the 4-head
   * list, every other slope), as in the ALiBi paper's code. */
  const double slopes3[] = {1.0 / 16, 1.0 / 256, 1.0 / 4};
  QkvShape s = QKV_SHAPE(2, 3, 4, 6);
  g_autoptr(QkvTensor) x = qkv_test_uniform(&s, 21, -2, 2);
  struct {
    gboolean causal;
    gint64 window;
  } cases[] = {{FALSE, 0}, {TRUE, 0}, {FALSE, 2}, {TRUE, 3}};
  for (guint c = 0; c < G_N_ELEMENTS(cases); c++) {
    g_autoptr(GVariant) attrs = alibi_attrs(cases[c].causal, cases[c].window);
    OpCall call = {"alibi", attrs};
    g_autoptr(QkvTensor) y = qkv_test_eval(1, &x, build_op, &call);
    float want[2 * 3 * 4 * 6];
    alibi_expected(x, cases[c].causal, cases[c].window, slopes3, want);
    qkv_assert_values(y, want, G_N_ELEMENTS(want), 1e-5);
  }

  /* 8 heads: m_h = 2^-(h+1). */
  QkvShape s8 = QKV_SHAPE(1, 8, 3, 3);
  g_autoptr(QkvTensor) zeros = qkv_tensor_new(QKV_F32, &s8);
  OpCall call = {"alibi", NULL};
  g_autoptr(QkvTensor) y8 = qkv_test_eval(1, &zeros, build_op, &call);
  for (gint h = 0; h < 8; h++)
    /* query 0, key 2: distance 2 */
    g_assert_cmpfloat_with_epsilon(qkv_tensor_get(y8, h * 9 + 2), -2 * pow(2, -(h + 1)), 1e-7);
}

static void
test_alibi_gradcheck(void)
{
  QkvShape s = QKV_SHAPE(2, 2, 3, 5);
  g_autoptr(QkvTensor) x = qkv_test_uniform(&s, 22, -2, 2);
  /* No mask: a bias, and the gradient is dy. */
  OpCall plain = {"alibi", NULL};
  qkv_test_gradcheck("alibi", 1, &x, NULL, build_op, &plain);
  /* Masks: through alibi_backward; checked after a softmax, as used. */
  g_autoptr(GVariant) causal = alibi_attrs(TRUE, 0);
  g_autoptr(GVariant) local = alibi_attrs(FALSE, 2);
  g_autoptr(GVariant) both = alibi_attrs(TRUE, 2);
  OpCall calls[] = {{"alibi", causal}, {"alibi", local}, {"alibi", both}};
  for (guint i = 0; i < G_N_ELEMENTS(calls); i++)
    qkv_test_gradcheck("softmax(alibi)", 1, &x, NULL, build_op_softmax, &calls[i]);
  OpCall back = {"alibi_backward", causal};
  qkv_test_gradcheck("alibi_backward", 1, &x, NULL, build_op, &back);
}

static void
test_alibi_errors(void)
{
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvShape s = QKV_SHAPE(4, 4);
  QkvValue *x = qkv_graph_input(g, "x", QKV_F32, &s, NULL);
  g_autoptr(GError) error = NULL;
  g_assert_null(qkv_graph_op(g, "alibi", &x, 1, NULL, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_SHAPE);
  g_assert_nonnull(strstr(error->message, "alibi"));
  g_assert_cmpuint(qkv_graph_n_nodes(g), ==, 0);
}

/* ------------------------------------------------------------------------- */
/* Activations: ops without gradient rules, differentiated by decomposition  */
/* ------------------------------------------------------------------------- */

static void
test_activation_values(void)
{
  QkvShape s = QKV_SHAPE(600);
  g_autoptr(QkvTensor) x = qkv_test_uniform(&s, 31, -30, 30);
  qkv_tensor_f32(x)[0] = 0.0f;
  const gchar *ops[] = {"softplus", "swish", "mish"};
  for (guint o = 0; o < G_N_ELEMENTS(ops); o++) {
    g_assert_null(qkv_op_lookup(ops[o])->gradient);
    g_assert_nonnull(qkv_op_lookup(ops[o])->decompose);
    OpCall call = {ops[o], NULL};
    g_autoptr(QkvTensor) y = qkv_test_eval(1, &x, build_op, &call);
    g_autoptr(QkvTensor) yd = qkv_test_eval(1, &x, build_decomposition, &call);
    for (gint64 i = 0; i < 600; i++) {
      double v = qkv_tensor_get(x, i), sp = softplus_ref(v);
      double want = o == 0 ? sp : o == 1 ? v / (1 + exp(-v)) : v * tanh(sp);
      g_assert_cmpfloat_with_epsilon(qkv_tensor_get(y, i), want, 1e-5 * fmax(1, fabs(want)));
      g_assert_cmpfloat_with_epsilon(qkv_tensor_get(yd, i), want, 1e-5 * fmax(1, fabs(want)));
    }
  }
}

static void
test_activation_gradcheck(void)
{
  QkvShape s = QKV_SHAPE(3, 8);
  g_autoptr(QkvTensor) x = qkv_test_uniform(&s, 32, -4, 4);
  /* mish decomposes into the plugin's softplus, which decomposes in turn. */
  const gchar *ops[] = {"softplus", "swish", "mish"};
  for (guint o = 0; o < G_N_ELEMENTS(ops); o++) {
    OpCall call = {ops[o], NULL};
    qkv_test_gradcheck(ops[o], 1, &x, NULL, build_op, &call);
  }
}

/* d softplus / dx at 0 is exactly 1/2, kink of relu and all. */
static void
test_softplus_gradient_at_zero(void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvShape s = QKV_SHAPE(3);
  QkvValue *x = qkv_graph_input(g, "x", QKV_F32, &s, &error);
  qkv_value_set_requires_grad(x, TRUE);
  QkvValue *y = qkv_graph_op(g, "softplus", &x, 1, NULL, &error);
  QkvValue *loss = qkv_sum(y, NULL, 0, FALSE, &error);
  g_assert_no_error(error);
  g_assert_true(qkv_graph_backward(g, loss, &error));
  g_assert_no_error(error);
  QkvValue *gx = qkv_graph_gradient(g, x);
  g_assert_nonnull(gx);
  g_autoptr(QkvPlan) plan = qkv_graph_compile(g, &gx, 1, NULL, &error);
  g_assert_no_error(error);
  float xv[] = {0.0f, 100.0f, -100.0f};
  g_autoptr(QkvTensor) xt = qkv_tensor_new_f32(&s, xv);
  g_assert_true(qkv_plan_bind(plan, "x", xt, &error));
  g_assert_true(qkv_plan_run(plan, &error));
  g_assert_no_error(error);
  float want[] = {0.5f, 1.0f, 0.0f};
  qkv_assert_values(qkv_plan_output(plan, 0), want, 3, 1e-6);
}

/* ------------------------------------------------------------------------- */
/* Decomposition in autodiff, with ops defined here                          */
/* ------------------------------------------------------------------------- */

/* "test.sumprod": (a, b) → (a + b, a · b), two outputs, no gradient rule. */
static gboolean
sumprod_shape(QkvShapeCtx *ctx, GError **error)
{
  if (!qkv_shape_equal(&ctx->in_shapes[0], &ctx->in_shapes[1]))
    return qkv_shape_error(ctx, error, QKV_ERROR_SHAPE, "a and b must have the same shape");
  ctx->n_outputs = 2;
  ctx->out_shapes[0] = ctx->out_shapes[1] = ctx->in_shapes[0];
  return TRUE;
}

static void
sumprod_forward(const QkvKernelCtx *ctx)
{
  const float *a = ctx->in[0].data, *b = ctx->in[1].data;
  float *s = ctx->out[0].data, *p = ctx->out[1].data;
  for (gint64 i = 0; i < qkv_shape_numel(&ctx->in[0].shape); i++) {
    s[i] = a[i] + b[i];
    p[i] = a[i] * b[i];
  }
}

static gboolean
sumprod_decompose(QkvDecomposeCtx *d, GError **error)
{
  d->outputs[0] = qkv_add(d->inputs[0], d->inputs[1], error);
  d->outputs[1] = d->outputs[0] ? qkv_mul(d->inputs[0], d->inputs[1], error) : NULL;
  return d->outputs[1] != NULL;
}

/* "test.first": (a, b) → a, decomposed as the input itself. */
static gboolean
first_shape(QkvShapeCtx *ctx, GError **error)
{
  ctx->out_shapes[0] = ctx->in_shapes[0];
  return TRUE;
}

static void
first_forward(const QkvKernelCtx *ctx)
{
  memcpy(ctx->out[0].data, ctx->in[0].data,
         sizeof(float) * (gsize)qkv_shape_numel(&ctx->in[0].shape));
}

static gboolean
first_decompose(QkvDecomposeCtx *d, GError **error)
{
  d->outputs[0] = d->inputs[0];
  return TRUE;
}

/* "test.badshape": x → x, decomposed into a value of the wrong shape. */
static gboolean
badshape_decompose(QkvDecomposeCtx *d, GError **error)
{
  d->outputs[0] = qkv_sum(d->inputs[0], NULL, 0, FALSE, error);
  return d->outputs[0] != NULL;
}

/* "test.nograd": x → x, neither a gradient rule nor a decomposition. */

static void
register_test_ops(void)
{
  static const QkvOpDef defs[] = {
      {QKV_OP_DEF_INIT, .name = "test.sumprod", .min_inputs = 2, .max_inputs = 2,
       .shape = sumprod_shape, .forward = sumprod_forward, .decompose = sumprod_decompose},
      {QKV_OP_DEF_INIT, .name = "test.first", .min_inputs = 2, .max_inputs = 2,
       .shape = first_shape, .forward = first_forward, .decompose = first_decompose},
      {QKV_OP_DEF_INIT, .name = "test.badshape", .min_inputs = 1, .max_inputs = 1,
       .shape = first_shape, .forward = first_forward, .decompose = badshape_decompose},
      {QKV_OP_DEF_INIT, .name = "test.nograd", .min_inputs = 1, .max_inputs = 1,
       .shape = first_shape, .forward = first_forward},
  };
  for (guint i = 0; i < G_N_ELEMENTS(defs); i++) {
    if (qkv_op_lookup(defs[i].name) != NULL)
      continue;
    g_autoptr(GError) error = NULL;
    g_assert_true(qkv_op_register(&defs[i], &error));
    g_assert_no_error(error);
  }
}

/* s, p = sumprod(a, b); q, _ = sumprod(s, a); out = p · q + first(b, a):
 * both outputs used, an input used twice, a decomposition that is an input. */
static QkvValue *
build_sumprod(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  QkvNode *n1 = qkv_graph_add_node(graph, "test.sumprod", in, 2, NULL, error);
  if (n1 == NULL)
    return NULL;
  QkvValue *s = qkv_node_output(n1, 0), *p = qkv_node_output(n1, 1);
  QkvValue *args[] = {s, in[0]};
  QkvValue *q = qkv_graph_op(graph, "test.sumprod", args, 2, NULL, error);
  QkvValue *swapped[] = {in[1], in[0]};
  QkvValue *f = q ? qkv_graph_op(graph, "test.first", swapped, 2, NULL, error) : NULL;
  QkvValue *pq = f ? qkv_mul(p, q, error) : NULL;
  return pq ? qkv_add(pq, f, error) : NULL;
}

/* sumprod(x, x): one value as both inputs. */
static QkvValue *
build_sumprod_same(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  QkvValue *args[] = {in[0], in[0]};
  QkvNode *n = qkv_graph_add_node(graph, "test.sumprod", args, 2, NULL, error);
  return n ? qkv_mul(qkv_node_output(n, 0), qkv_node_output(n, 1), error) : NULL;
}

static void
test_decompose_autodiff(void)
{
  register_test_ops();
  QkvShape s = QKV_SHAPE(2, 3);
  g_autoptr(QkvTensor) a = qkv_test_uniform(&s, 41, -2, 2);
  g_autoptr(QkvTensor) b = qkv_test_uniform(&s, 42, -2, 2);
  QkvTensor *inputs[] = {a, b};
  qkv_test_gradcheck("sumprod", 2, inputs, NULL, build_sumprod, NULL);
  qkv_test_gradcheck("sumprod(x, x)", 1, &a, NULL, build_sumprod_same, NULL);
  /* Only one input needs a gradient. */
  gboolean only_b[] = {FALSE, TRUE};
  qkv_test_gradcheck("sumprod, b only", 2, inputs, only_b, build_sumprod, NULL);
}

static void
test_decompose_errors(void)
{
  register_test_ops();
  const gchar *ops[] = {"test.nograd", "test.badshape"};
  const gint codes[] = {QKV_ERROR_NO_GRADIENT, QKV_ERROR_SHAPE};
  for (guint i = 0; i < G_N_ELEMENTS(ops); i++) {
    g_autoptr(GError) error = NULL;
    g_autoptr(QkvGraph) g = qkv_graph_new();
    QkvShape s = QKV_SHAPE(3);
    QkvValue *x = qkv_graph_input(g, "x", QKV_F32, &s, NULL);
    qkv_value_set_requires_grad(x, TRUE);
    QkvValue *y = qkv_graph_op(g, ops[i], &x, 1, NULL, &error);
    QkvValue *loss = qkv_sum(y, NULL, 0, FALSE, &error);
    g_assert_no_error(error);
    guint n_nodes = qkv_graph_n_nodes(g), n_values = qkv_graph_n_values(g);
    g_assert_false(qkv_graph_backward(g, loss, &error));
    g_assert_error(error, QKV_ERROR, codes[i]);
    g_assert_nonnull(strstr(error->message, ops[i]));
    /* The graph is as it was. */
    g_assert_cmpuint(qkv_graph_n_nodes(g), ==, n_nodes);
    g_assert_cmpuint(qkv_graph_n_values(g), ==, n_values);
  }
}

/* ------------------------------------------------------------------------- */
/* Training through a plugin op                                              */
/* ------------------------------------------------------------------------- */

/* A 1-32-1 MLP with GELU fits y = sin(2x) on [-2, 2] by plain SGD, through
 * one compiled training plan. */
static void
test_gelu_mlp_trains(void)
{
  g_autoptr(GError) error = NULL;
  const gint64 n = 64, hidden = 32;
  g_autoptr(QkvParams) params = qkv_params_new();
  struct {
    const gchar *name;
    QkvShape shape;
    float scale;
  } specs[] = {
      {"l1.weight", QKV_SHAPE(hidden, 1), 1.5f},
      {"l1.bias", QKV_SHAPE(hidden), 1.5f},
      {"l2.weight", QKV_SHAPE(1, hidden), 0.3f},
      {"l2.bias", QKV_SHAPE(1), 0.0f},
  };
  for (guint i = 0; i < G_N_ELEMENTS(specs); i++) {
    QkvParam *p = qkv_params_add(params, specs[i].name, &specs[i].shape, &error);
    g_assert_no_error(error);
    g_autoptr(QkvTensor) init =
        qkv_test_uniform(&specs[i].shape, 50 + i, -specs[i].scale, specs[i].scale);
    g_assert_true(qkv_tensor_copy_from(qkv_param_value(p), init, &error));
  }

  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvShape xs = QKV_SHAPE(n, 1);
  QkvValue *x = qkv_graph_input(g, "x", QKV_F32, &xs, &error);
  QkvValue *y = qkv_graph_input(g, "y", QKV_F32, &xs, &error);
  QkvValue *h = qkv_matmul(x, qkv_graph_param(g, params, "l1.weight", &error), FALSE, TRUE, &error);
  h = qkv_add(h, qkv_graph_param(g, params, "l1.bias", &error), &error);
  h = qkv_graph_op(g, "example.gelu", &h, 1, NULL, &error);
  QkvValue *pred =
      qkv_matmul(h, qkv_graph_param(g, params, "l2.weight", &error), FALSE, TRUE, &error);
  pred = qkv_add(pred, qkv_graph_param(g, params, "l2.bias", &error), &error);
  QkvValue *loss = qkv_mse(pred, y, QKV_REDUCTION_MEAN, &error);
  g_assert_no_error(error);
  g_assert_true(qkv_graph_backward(g, loss, &error));
  g_assert_no_error(error);

  QkvPlanOptions opts = qkv_plan_options_default();
  opts.training = TRUE;
  g_autoptr(QkvPlan) plan = qkv_graph_compile(g, &loss, 1, &opts, &error);
  g_assert_no_error(error);
  g_autoptr(QkvTensor) xt = qkv_tensor_new(QKV_F32, &xs);
  g_autoptr(QkvTensor) yt = qkv_tensor_new(QKV_F32, &xs);
  for (gint64 i = 0; i < n; i++) {
    float xi = -2.0f + 4.0f * (float)i / (float)(n - 1);
    qkv_tensor_f32(xt)[i] = xi;
    qkv_tensor_f32(yt)[i] = sinf(2 * xi);
  }
  g_assert_true(qkv_plan_bind(plan, "x", xt, &error));
  g_assert_true(qkv_plan_bind(plan, "y", yt, &error));

  const float lr = 0.1f;
  float first = 0, last = 0;
  for (gint step = 0; step < 400; step++) {
    g_assert_true(qkv_plan_run(plan, &error));
    g_assert_no_error(error);
    last = qkv_plan_output_scalar(plan, 0);
    g_assert_true(isfinite(last));
    if (step == 0)
      first = last;
    for (guint i = 0; i < qkv_params_size(params); i++) {
      QkvParam *p = qkv_params_nth(params, i);
      float *w = qkv_tensor_f32(qkv_param_value(p));
      const float *gw = qkv_tensor_f32(qkv_param_grad(p));
      for (gint64 k = 0; k < qkv_tensor_numel(qkv_param_value(p)); k++)
        w[k] -= lr * gw[k];
    }
  }
  g_test_message("gelu MLP: loss %.4f -> %.4f", first, last);
  g_assert_cmpfloat(last, <, 0.1f * first);
}

/* ------------------------------------------------------------------------- */
/* qkv-info                                                                  */
/* ------------------------------------------------------------------------- */

static gint
run_qkv_info(const gchar *const *args, gchar **out, gchar **err)
{
  g_autoptr(GPtrArray) argv = g_ptr_array_new();
  g_ptr_array_add(argv, (gpointer)QKV_INFO);
  for (guint i = 0; args[i] != NULL; i++)
    g_ptr_array_add(argv, (gpointer)args[i]);
  g_ptr_array_add(argv, NULL);
  g_autoptr(GError) error = NULL;
  gint status = 0;
  g_assert_true(g_spawn_sync(NULL, (gchar **)argv->pdata, NULL, G_SPAWN_DEFAULT, NULL, NULL, out,
                             err, &status, &error));
  g_assert_no_error(error);
  if (WIFEXITED(status))
    return WEXITSTATUS(status);
  return -1;
}

static void
test_qkv_info(void)
{
  g_autofree gchar *out = NULL, *err = NULL;
  /* The listing: built-in and plugin ops (QKV_PLUGIN_PATH is inherited). */
  const gchar *list[] = {NULL};
  g_assert_cmpint(run_qkv_info(list, &out, &err), ==, 0);
  g_assert_nonnull(strstr(out, "matmul  [built-in]"));
  g_assert_nonnull(strstr(out, "transpose_a: bool, default false"));
  g_autofree gchar *gelu_line = g_strdup_printf("example.gelu  [%s]", PLUGIN_GELU);
  g_assert_nonnull(strstr(out, gelu_line));
  g_assert_nonnull(strstr(out, "window: int, default 0"));
  g_assert_nonnull(strstr(out, "gradient: decomposition into existing ops"));
  g_assert_nonnull(strstr(out, "Plugins (3):"));
  g_clear_pointer(&out, g_free);
  g_clear_pointer(&err, g_free);

  const gchar *help[] = {"--help", NULL};
  g_assert_cmpint(run_qkv_info(help, &out, &err), ==, 0);
  g_assert_nonnull(strstr(out, "--plugin"));
  g_clear_pointer(&out, g_free);
  g_clear_pointer(&err, g_free);

  /* --plugin on a good file reports what it registered. */
  const gchar *good[] = {"--plugin", PLUGIN_GOOD_A, NULL};
  g_assert_cmpint(run_qkv_info(good, &out, &err), ==, 0);
  g_assert_nonnull(strstr(out, "test-good 1.0 (MIT)"));
  g_assert_nonnull(strstr(out, "ops (1): test.good_a"));
  g_clear_pointer(&out, g_free);
  g_clear_pointer(&err, g_free);

  /* ... and on a broken one, exactly why it failed, with a non-zero exit. */
  const gchar *bad[] = {"--plugin", PLUGIN_DUPLICATE_OP, NULL};
  g_assert_cmpint(run_qkv_info(bad, &out, &err), !=, 0);
  g_assert_nonnull(strstr(err, PLUGIN_DUPLICATE_OP));
  g_assert_nonnull(strstr(err, "op 'matmul' is already registered"));
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  g_test_add_func("/plugins/autoload", test_autoload);
  g_test_add_func("/plugins/load-twice", test_load_twice);
  g_test_add_func("/plugins/gelu/values", test_gelu_values);
  g_test_add_func("/plugins/gelu/gradcheck", test_gelu_gradcheck);
  g_test_add_func("/plugins/gelu/backward-gradcheck", test_gelu_backward_gradcheck);
  g_test_add_func("/plugins/gelu/mlp-trains", test_gelu_mlp_trains);
  g_test_add_func("/plugins/alibi/values", test_alibi_values);
  g_test_add_func("/plugins/alibi/gradcheck", test_alibi_gradcheck);
  g_test_add_func("/plugins/alibi/errors", test_alibi_errors);
  g_test_add_func("/plugins/activations/values", test_activation_values);
  g_test_add_func("/plugins/activations/gradcheck", test_activation_gradcheck);
  g_test_add_func("/plugins/activations/softplus-at-zero", test_softplus_gradient_at_zero);
  g_test_add_func("/plugins/decompose/autodiff", test_decompose_autodiff);
  g_test_add_func("/plugins/decompose/errors", test_decompose_errors);
  g_test_add_func("/plugins/qkv-info", test_qkv_info);
  return g_test_run();
}
