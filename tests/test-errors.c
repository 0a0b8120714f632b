/* test-errors.c: bad input gives a GError naming the op, never a crash, and
 * leaves the graph unchanged and usable. */
#include "test-util.h"

#include <string.h>
#include <qkv/qkv-builders.h>
#include <qkv/qkv-dist.h>

typedef struct {
  QkvGraph *graph;
  QkvValue *a;   /* f32 (2, 3) */
  QkvValue *b;   /* f32 (4, 5) */
  QkvValue *ids; /* i32 (2, 3) */
} Fixture;

static void
fixture_setup(Fixture *f, gconstpointer data)
{
  f->graph = qkv_graph_new();
  QkvShape s23 = QKV_SHAPE(2, 3), s45 = QKV_SHAPE(4, 5);
  f->a = qkv_graph_input(f->graph, "a", QKV_F32, &s23, NULL);
  f->b = qkv_graph_input(f->graph, "b", QKV_F32, &s45, NULL);
  f->ids = qkv_graph_input(f->graph, "ids", QKV_I32, &s23, NULL);
}

static void
fixture_teardown(Fixture *f, gconstpointer data)
{
  qkv_graph_free(f->graph);
}

/* After a failure: same node count, and a plan still compiles and runs. */
static void
assert_graph_usable(Fixture *f, guint nodes_before)
{
  g_assert_cmpuint(qkv_graph_n_nodes(f->graph), ==, nodes_before);
  g_autoptr(GError) error = NULL;
  QkvValue *y = qkv_exp(f->a, &error);
  g_assert_no_error(error);
  g_autoptr(QkvPlan) plan = qkv_graph_compile(f->graph, &y, 1, NULL, &error);
  g_assert_no_error(error);
  QkvShape s = QKV_SHAPE(2, 3);
  g_autoptr(QkvTensor) t = qkv_tensor_new(QKV_F32, &s);
  g_assert_true(qkv_plan_bind(plan, "a", t, &error));
  g_assert_true(qkv_plan_run(plan, &error));
  g_assert_cmpfloat(qkv_tensor_get(qkv_plan_output(plan, 0), 0), ==, 1.0);
}

static void
assert_error_names(GError *error, gint code, const gchar *needle)
{
  g_assert_nonnull(error);
  g_test_message("%s", error->message);
  g_assert_true(error->domain == QKV_ERROR);
  g_assert_cmpint(error->code, ==, code);
  if (strstr(error->message, needle) == NULL)
    g_error("message '%s' does not mention '%s'", error->message, needle);
}

static void
test_unknown_op(Fixture *f, gconstpointer data)
{
  guint n = qkv_graph_n_nodes(f->graph);
  g_autoptr(GError) error = NULL;
  g_assert_null(qkv_graph_op(f->graph, "frobnicate", &f->a, 1, NULL, &error));
  assert_error_names(error, QKV_ERROR_UNKNOWN_OP, "frobnicate");
  /* where a plugin defining it would have been found: the variables and the
   * default directory of the loader's search path (the suite runs with
   * QKV_PLUGIN_SYSTEM_PATH set empty) */
  assert_error_names(error, QKV_ERROR_UNKNOWN_OP, "QKV_PLUGIN_PATH");
  assert_error_names(error, QKV_ERROR_UNKNOWN_OP, "QKV_PLUGIN_SYSTEM_PATH (\"\")");
  assert_error_names(error, QKV_ERROR_UNKNOWN_OP, "default plugin directory " QKV_PLUGIN_DIR);
  assert_graph_usable(f, n);
}

static void
test_wrong_arity(Fixture *f, gconstpointer data)
{
  guint n = qkv_graph_n_nodes(f->graph);
  g_autoptr(GError) error = NULL;
  QkvValue *three[] = {f->a, f->a, f->a};
  g_assert_null(qkv_graph_op(f->graph, "add", three, 3, NULL, &error));
  assert_error_names(error, QKV_ERROR_ARITY, "add");
  g_assert_nonnull(strstr(error->message, "got 3"));
  assert_graph_usable(f, n);
}

static void
test_wrong_dtype(Fixture *f, gconstpointer data)
{
  guint n = qkv_graph_n_nodes(f->graph);
  g_autoptr(GError) error = NULL;
  g_assert_null(qkv_exp(f->ids, &error));
  assert_error_names(error, QKV_ERROR_DTYPE, "exp");
  g_assert_nonnull(strstr(error->message, "i32(2, 3)"));
  assert_graph_usable(f, n);
}

static void
test_bad_shapes(Fixture *f, gconstpointer data)
{
  guint n = qkv_graph_n_nodes(f->graph);
  g_autoptr(GError) error = NULL;
  g_assert_null(qkv_add(f->a, f->b, &error));
  assert_error_names(error, QKV_ERROR_SHAPE, "add");
  g_assert_nonnull(strstr(error->message, "(2, 3)"));
  g_assert_nonnull(strstr(error->message, "(4, 5)"));
  g_clear_error(&error);
  g_assert_null(qkv_matmul(f->a, f->b, FALSE, FALSE, &error));
  assert_error_names(error, QKV_ERROR_SHAPE, "matmul");
  assert_graph_usable(f, n);
}

static void
test_attributes(Fixture *f, gconstpointer data)
{
  guint n = qkv_graph_n_nodes(f->graph);
  g_autoptr(GError) error = NULL;
  /* missing required attribute */
  g_assert_null(qkv_graph_op(f->graph, "reshape", &f->a, 1, NULL, &error));
  assert_error_names(error, QKV_ERROR_ATTRIBUTE, "reshape");
  g_assert_nonnull(strstr(error->message, "shape"));
  g_clear_error(&error);
  /* mistyped attribute */
  GVariant *bad = g_variant_new_parsed("{'factor': <'two'>}");
  g_assert_null(qkv_graph_op(f->graph, "scale", &f->a, 1, bad, &error));
  assert_error_names(error, QKV_ERROR_ATTRIBUTE, "scale");
  g_assert_nonnull(strstr(error->message, "factor"));
  g_clear_error(&error);
  /* unknown attribute */
  GVariant *unknown = g_variant_new_parsed("{'colour': <'red'>}");
  g_assert_null(qkv_graph_op(f->graph, "exp", &f->a, 1, unknown, &error));
  assert_error_names(error, QKV_ERROR_ATTRIBUTE, "colour");
  g_clear_error(&error);
  /* attributes that are not a dictionary */
  g_assert_null(qkv_graph_op(f->graph, "exp", &f->a, 1, g_variant_new_int32(3), &error));
  assert_error_names(error, QKV_ERROR_ATTRIBUTE, "exp");
  assert_graph_usable(f, n);
}

static void
test_value_from_another_graph(Fixture *f, gconstpointer data)
{
  guint n = qkv_graph_n_nodes(f->graph);
  g_autoptr(QkvGraph) other = qkv_graph_new();
  QkvShape s = QKV_SHAPE(2, 3);
  QkvValue *foreign = qkv_graph_input(other, "z", QKV_F32, &s, NULL);
  g_autoptr(GError) error = NULL;
  g_assert_null(qkv_add(f->a, foreign, &error));
  assert_error_names(error, QKV_ERROR_GRAPH_MISMATCH, "add");
  g_clear_error(&error);
  g_assert_null(qkv_graph_compile(f->graph, &foreign, 1, NULL, &error));
  assert_error_names(error, QKV_ERROR_GRAPH_MISMATCH, "another graph");
  assert_graph_usable(f, n);
}

static void
test_null_input(Fixture *f, gconstpointer data)
{
  guint n = qkv_graph_n_nodes(f->graph);
  g_autoptr(GError) error = NULL;
  QkvValue *ins[] = {f->a, NULL};
  g_assert_null(qkv_graph_op(f->graph, "add", ins, 2, NULL, &error));
  assert_error_names(error, QKV_ERROR_INVALID_ARGUMENT, "add");
  assert_graph_usable(f, n);
}

static guint chain_log_count;
static gboolean chain_counting;

/* Installed once for the whole program (GLib allows one writer): counts what
 * is logged while chain_counting is set, else logs as usual. */
static GLogWriterOutput
count_log_writer(GLogLevelFlags level, const GLogField *fields, gsize n_fields, gpointer data)
{
  if (chain_counting) {
    chain_log_count++;
    return G_LOG_WRITER_HANDLED;
  }
  return g_log_writer_default(level, fields, n_fields, data);
}

/* Errors chain: ten ops in a row, the third of which fails (a shape
 * mismatch); every later call gets a NULL input and must return NULL quietly,
 * leaving the third call's error as the one the caller sees, and the loss,
 * backward and compile at the end must do the same. */
static void
test_error_chain(Fixture *f, gconstpointer data)
{
  guint n = qkv_graph_n_nodes(f->graph);
  GError *error = NULL;
  QkvShape s5 = QKV_SHAPE(5);
  QkvValue *wrong = qkv_graph_input(f->graph, "wrong", QKV_F32, &s5, &error);
  g_assert_no_error(error);
  chain_log_count = 0;
  chain_counting = TRUE;
  QkvValue *x = f->a;
  x = qkv_relu(x, &error);                             /* 1 */
  x = qkv_tanh(x, &error);                             /* 2 */
  x = qkv_add(x, wrong, &error);                       /* 3: (2, 3) + (5) does not broadcast */
  x = qkv_sigmoid(x, &error);                          /* 4 */
  x = qkv_mul(x, f->a, &error);                        /* 5 */
  x = qkv_softmax(x, &error);                          /* 6 */
  x = qkv_scale(x, 2.0, &error);                       /* 7 */
  x = qkv_transpose(x, 0, 1, &error);                  /* 8 */
  x = qkv_exp(x, &error);                              /* 9 */
  QkvValue *loss = qkv_sum(x, NULL, 0, FALSE, &error); /* 10 */
  g_assert_null(loss);
  g_assert_false(qkv_graph_backward(f->graph, loss, &error));
  QkvPlanOptions opts = qkv_plan_options_default();
  g_assert_null(qkv_graph_compile(f->graph, &loss, 1, &opts, &error));
  chain_counting = FALSE;
  g_assert_cmpuint(chain_log_count, ==, 0);
  assert_error_names(error, QKV_ERROR_SHAPE, "add");
  g_clear_error(&error);
  /* the two ops before the failure stay; nothing after it was added */
  g_assert_cmpuint(qkv_graph_n_nodes(f->graph), ==, n + 2);

  /* a NULL passed with no earlier error is reported as such */
  g_assert_null(qkv_relu(NULL, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_assert_nonnull(strstr(error->message, "relu"));
  g_clear_error(&error);
}

/* Builders chain too: after an earlier failure a builder given valid inputs
 * (and even a bad config, which would otherwise be an error of its own)
 * returns NULL, adds no node and no parameter, logs nothing, and leaves the
 * first error in place. */
static void
test_builder_chain(Fixture *f, gconstpointer data)
{
  guint n = qkv_graph_n_nodes(f->graph);
  GError *error = NULL;
  g_autoptr(QkvParams) params = qkv_params_new();
  QkvBuilder b = {.graph = f->graph, .params = params, .seed = 1};
  QkvShape s5 = QKV_SHAPE(5);
  QkvValue *wrong = qkv_graph_input(f->graph, "wrong", QKV_F32, &s5, &error);
  g_assert_no_error(error);
  n = qkv_graph_n_nodes(f->graph);
  chain_log_count = 0;
  chain_counting = TRUE;
  QkvValue *x = qkv_add(f->a, wrong, &error); /* fails: (2, 3) + (5) */
  QkvValue *h = qkv_build_linear(&b, "hidden", f->a, 4, TRUE, &error);
  QkvValue *bad = qkv_build_linear(&b, "bad", f->a, -1, TRUE, &error);
  QkvValue *p = qkv_build_param(&b, "w", &s5, "no-such-initialiser", 0, &error);
  QkvValue *y = qkv_build_addnorm(&b, "addnorm", f->a, f->a, 2.0, &error);
  chain_counting = FALSE;
  g_assert_null(x);
  g_assert_null(h);
  g_assert_null(bad);
  g_assert_null(p);
  g_assert_null(y);
  g_assert_cmpuint(chain_log_count, ==, 0);
  assert_error_names(error, QKV_ERROR_SHAPE, "add");
  g_clear_error(&error);
  g_assert_cmpuint(qkv_graph_n_nodes(f->graph), ==, n);
  g_assert_cmpuint(qkv_params_size(params), ==, 0);
}

/* Attributes whose arithmetic would overflow: the shape rule must refuse
 * them, since kernels trust the shapes it lets through. */
static void
test_overflowing_attributes(Fixture *f, gconstpointer data)
{
  guint n = qkv_graph_n_nodes(f->graph);
  g_autoptr(GError) error = NULL;
  /* slice_backward with start + length past G_MAXINT64 */
  GVariantBuilder b;
  g_variant_builder_init(&b, G_VARIANT_TYPE_VARDICT);
  const gint64 shape23[] = {2, 3};
  g_variant_builder_add(
      &b, "{sv}", "shape",
      g_variant_new_fixed_array(G_VARIANT_TYPE_INT64, shape23, 2, sizeof(gint64)));
  g_variant_builder_add(&b, "{sv}", "axis", g_variant_new_int64(1));
  g_variant_builder_add(&b, "{sv}", "start", g_variant_new_int64(G_MAXINT64 - 1));
  g_assert_null(
      qkv_graph_op(f->graph, "slice_backward", &f->a, 1, g_variant_builder_end(&b), &error));
  assert_error_names(error, QKV_ERROR_SHAPE, "slice_backward");
  g_clear_error(&error);
  /* reshape to a shape whose element count wraps around to the input's */
  QkvShape huge = QKV_SHAPE((G_GINT64_CONSTANT(1) << 62) + 1, 6);
  g_assert_null(qkv_reshape(f->a, &huge, &error));
  assert_error_names(error, QKV_ERROR_ATTRIBUTE, "reshape");
  g_clear_error(&error);
  /* broadcast_to a shape too large to address */
  QkvShape big = QKV_SHAPE(G_GINT64_CONSTANT(1) << 40, G_GINT64_CONSTANT(1) << 30, 3);
  g_assert_null(qkv_broadcast_to(f->a, &big, &error));
  g_assert_nonnull(error);
  g_clear_error(&error);
  /* a graph input that large */
  QkvShape bigger = QKV_SHAPE(G_GINT64_CONSTANT(1) << 62, 4);
  g_assert_null(qkv_graph_input(f->graph, "huge", QKV_F32, &bigger, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_SHAPE);
  g_clear_error(&error);
  /* a key given twice in the attribute dictionary */
  g_variant_builder_init(&b, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&b, "{sv}", "factor", g_variant_new_double(2.0));
  g_variant_builder_add(&b, "{sv}", "factor", g_variant_new_double(3.0));
  g_assert_null(qkv_graph_op(f->graph, "scale", &f->a, 1, g_variant_builder_end(&b), &error));
  assert_error_names(error, QKV_ERROR_ATTRIBUTE, "twice");
  assert_graph_usable(f, n);
}

static void
test_bad_registration(void)
{
  g_autoptr(GError) error = NULL;
  QkvOpDef def = *qkv_op_lookup("exp");
  def.name = "test.wrong_major";
  def.abi_major = QKV_OP_ABI_MAJOR + 1;
  g_assert_false(qkv_op_register(&def, &error));
  assert_error_names(error, QKV_ERROR_INVALID_ARGUMENT, "ABI");
  g_clear_error(&error);
  def.abi_major = QKV_OP_ABI_MAJOR;
  def.forward = NULL;
  g_assert_false(qkv_op_register(&def, &error));
  assert_error_names(error, QKV_ERROR_INVALID_ARGUMENT, "test.wrong_major");
  g_assert_null(qkv_op_lookup("test.wrong_major"));
}

/* Bindings and log readers see the domain's string: it must be the GLib
 * spelling, with no spaces (clang-format once put some in). */
static void
test_error_domain_names(void)
{
  g_assert_cmpstr(g_quark_to_string(QKV_ERROR), ==, "qkv-error-quark");
  g_assert_cmpstr(g_quark_to_string(QKV_DIST_ERROR), ==, "qkv-dist-error-quark");
}

/* The headers' version macros agree with the library a program runs with
 * (one build here, so they must be equal), and QKV_CHECK_VERSION orders
 * versions by major, then minor, then micro. */
static void
test_version_macros(void)
{
  g_autofree gchar *headers =
      g_strdup_printf("%d.%d.%d", QKV_MAJOR_VERSION, QKV_MINOR_VERSION, QKV_MICRO_VERSION);
  g_assert_cmpstr(headers, ==, qkv_version());
  g_assert_cmpstr(QKV_VERSION_STRING, ==, qkv_version());
  g_assert_true(QKV_CHECK_VERSION(QKV_MAJOR_VERSION, QKV_MINOR_VERSION, QKV_MICRO_VERSION));
  g_assert_true(QKV_CHECK_VERSION(QKV_MAJOR_VERSION, QKV_MINOR_VERSION, 0));
  g_assert_true(QKV_CHECK_VERSION(QKV_MAJOR_VERSION - 1, 99, 99));
  g_assert_false(QKV_CHECK_VERSION(QKV_MAJOR_VERSION, QKV_MINOR_VERSION, QKV_MICRO_VERSION + 1));
  g_assert_false(QKV_CHECK_VERSION(QKV_MAJOR_VERSION, QKV_MINOR_VERSION + 1, 0));
  g_assert_false(QKV_CHECK_VERSION(QKV_MAJOR_VERSION + 1, 0, 0));
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  g_log_set_writer_func(count_log_writer, NULL, NULL);
#define ADD(path, fn) g_test_add(path, Fixture, NULL, fixture_setup, fn, fixture_teardown)
  ADD("/errors/unknown-op", test_unknown_op);
  ADD("/errors/wrong-arity", test_wrong_arity);
  ADD("/errors/wrong-dtype", test_wrong_dtype);
  ADD("/errors/bad-shapes", test_bad_shapes);
  ADD("/errors/attributes", test_attributes);
  ADD("/errors/value-from-another-graph", test_value_from_another_graph);
  ADD("/errors/null-input", test_null_input);
  ADD("/errors/error-chain", test_error_chain);
  ADD("/errors/builder-chain", test_builder_chain);
  ADD("/errors/overflowing-attributes", test_overflowing_attributes);
  g_test_add_func("/errors/bad-registration", test_bad_registration);
  g_test_add_func("/errors/domain-names", test_error_domain_names);
  g_test_add_func("/errors/version-macros", test_version_macros);
  return g_test_run();
}
