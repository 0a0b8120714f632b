/* test-plugin-errors.c: every way a plugin can fail to load gives a
 * QKV_ERROR_PLUGIN error naming the file and the reason, registers nothing
 * (ops a plugin registered before failing are rolled back) and leaves the
 * library working. Also: an ABI 1.0 plugin still loads, a second plugin of
 * the same name is refused, and at initialisation failures are warnings. */
#include "test-util.h"

#include <glib/gstdio.h>
#include <string.h>
#include <sys/stat.h>

/* A small graph still builds and runs. */
static void
assert_library_works(void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvShape s = QKV_SHAPE(2);
  QkvValue *x = qkv_graph_input(g, "x", QKV_F32, &s, &error);
  QkvValue *y = qkv_add(x, x, &error);
  g_assert_no_error(error);
  g_autoptr(QkvPlan) plan = qkv_graph_compile(g, &y, 1, NULL, &error);
  g_assert_no_error(error);
  float xv[] = {1, 2};
  g_autoptr(QkvTensor) xt = qkv_tensor_new_f32(&s, xv);
  g_assert_true(qkv_plan_bind(plan, "x", xt, &error));
  g_assert_true(qkv_plan_run(plan, &error));
  g_assert_no_error(error);
  float want[] = {2, 4};
  qkv_assert_values(qkv_plan_output(plan, 0), want, 2, 0);
}

/* Loading path fails with a message that names the file and matches
 * reason (a g_pattern_match_simple() pattern), and changes nothing. */
static void
assert_load_fails(const gchar *path, const gchar *reason)
{
  g_auto(GStrv) before = qkv_op_list();
  guint n_plugins = qkv_plugin_count();
  g_autofree gchar *abs_path = g_canonicalize_filename(path, NULL);

  /* Twice: a failed load leaves nothing behind that changes the second. */
  for (gint attempt = 0; attempt < 2; attempt++) {
    g_autoptr(GError) error = NULL;
    g_assert_null(qkv_plugin_load(path, &error));
    g_assert_error(error, QKV_ERROR, QKV_ERROR_PLUGIN);
    g_test_message("%s", error->message);
    g_autofree gchar *prefix = g_strdup_printf("plugin '%s': ", abs_path);
    g_assert_true(g_str_has_prefix(error->message, prefix));
    if (!g_pattern_match_simple(reason, error->message + strlen(prefix)))
      g_error("the error '%s' does not match '%s'", error->message, reason);
  }

  g_auto(GStrv) after = qkv_op_list();
  g_assert_true(g_strv_equal((const gchar *const *)before, (const gchar *const *)after));
  g_assert_cmpuint(qkv_plugin_count(), ==, n_plugins);
  g_assert_cmpstr(qkv_op_origin("matmul"), ==, "built-in");
  assert_library_works();
}

static void
test_missing_file(void)
{
  g_autofree gchar *path = g_build_filename(TEST_PLUGINS_DIR, "does-not-exist.so", NULL);
  assert_load_fails(path, "no such file");
}

static void
test_directory(void)
{
  assert_load_fails(TEST_PLUGINS_DIR, "is a directory, not a module");
}

static void
test_not_a_module(void)
{
  g_autofree gchar *path = g_build_filename(TEST_PLUGINS_DIR, "not-a-module.so", NULL);
  assert_load_fails(path, "not a loadable module: *");
}

static void
test_unresolved_symbol(void)
{
  assert_load_fails(PLUGIN_UNRESOLVED,
                    "not a loadable module: *undefined symbol*qkv_function_that_does_not_exist*");
}

static void
test_no_descriptor(void)
{
  assert_load_fails(PLUGIN_NO_DESCRIPTOR,
                    "no plugin descriptor: the module does not export qkv_plugin_describe()*");
}

static void
test_null_descriptor(void)
{
  assert_load_fails(PLUGIN_NULL_DESCRIPTOR, "qkv_plugin_describe() returned NULL");
}

static void
test_wrong_major(void)
{
  g_autofree gchar *reason = g_strdup_printf(
      "built for op ABI %d.%d, but this qkv has ABI %d.%d: the major version differs*",
      QKV_OP_ABI_MAJOR + 1, QKV_OP_ABI_MINOR, QKV_OP_ABI_MAJOR, QKV_OP_ABI_MINOR);
  assert_load_fails(PLUGIN_WRONG_MAJOR, reason);
}

static void
test_newer_minor(void)
{
  g_autofree gchar *reason =
      g_strdup_printf("built for op ABI %d.%d, newer than this qkv's %d.%d*", QKV_OP_ABI_MAJOR,
                      QKV_OP_ABI_MINOR + 1, QKV_OP_ABI_MAJOR, QKV_OP_ABI_MINOR);
  assert_load_fails(PLUGIN_NEWER_MINOR, reason);
}

static void
test_small_struct(void)
{
  g_autofree gchar *reason =
      g_strdup_printf("the descriptor's struct_size %u is smaller than the minimum *",
                      (guint)offsetof(QkvPluginInfo, register_ops));
  assert_load_fails(PLUGIN_SMALL_STRUCT, reason);
}

static void
test_duplicate_op(void)
{
  /* It registers broken.first, then matmul: broken.first is rolled back. */
  assert_load_fails(PLUGIN_DUPLICATE_OP, "registering its ops failed: op 'matmul' is already "
                                         "registered (by built-in)");
  g_assert_null(qkv_op_lookup("broken.first"));
}

static void
test_failing_register(void)
{
  assert_load_fails(PLUGIN_FAILING_REGISTER,
                    "registering its ops failed: the accelerator it needs is absent");
  g_assert_null(qkv_op_lookup("broken.second"));
}

static void
test_silent_failure(void)
{
  assert_load_fails(PLUGIN_SILENT_FAILURE,
                    "registering its ops failed: the register function of plugin 'broken' "
                    "returned FALSE without an error");
  g_assert_null(qkv_op_lookup("broken.third"));
}

static void
test_same_name(void)
{
  g_autoptr(GError) error = NULL;
  const QkvPlugin *a = qkv_plugin_load(PLUGIN_GOOD_A, &error);
  g_assert_no_error(error);
  g_assert_nonnull(a);
  g_autofree gchar *a_path = g_canonicalize_filename(PLUGIN_GOOD_A, NULL);
  g_assert_cmpstr(qkv_op_origin("test.good_a"), ==, a_path);
  /* Another file that calls itself test-good as well. */
  g_autofree gchar *reason =
      g_strdup_printf("a plugin named 'test-good' is already loaded from %s", a_path);
  assert_load_fails(PLUGIN_GOOD_B, reason);
  g_assert_null(qkv_op_lookup("test.good_b"));
  /* The first one again is fine. */
  g_assert_true(qkv_plugin_load(PLUGIN_GOOD_A, &error) == a);
  g_assert_no_error(error);
}

/* A register function that loads its own module gets an error for that
 * inner load instead of being called again until the stack overflows; the
 * module is no longer marked as loading afterwards (the second attempt in
 * assert_load_fails() fails the same way). */
static void
test_reentrant(void)
{
  g_autofree gchar *abs_path = g_canonicalize_filename(PLUGIN_REENTRANT, NULL);
  g_autofree gchar *reason = g_strdup_printf(
      "registering its ops failed: plugin '%s': is being loaded already*", abs_path);
  assert_load_fails(PLUGIN_REENTRANT, reason);
  g_assert_null(qkv_op_lookup("broken.fourth"));
}

/* Lengths at which to cut a plugin: every 1/16 of it and around the ELF
 * header and the first program headers. */
static GArray *
cut_lengths(gsize size)
{
  GArray *lengths = g_array_new(FALSE, FALSE, sizeof(gsize));
  const gsize fixed[] = {0, 1, 3, 4, 16, 63, 64, 65, 64 + 56, 64 + 3 * 56, 1000, size - 1};
  for (guint i = 0; i < G_N_ELEMENTS(fixed); i++)
    g_array_append_val(lengths, fixed[i]);
  for (gsize k = 1; k < 16; k++) {
    gsize n = size * k / 16;
    g_array_append_val(lengths, n);
  }
  return lengths;
}

/* What the error says about a plugin cut to n bytes. */
static const gchar *
cut_reason(gsize n)
{
  if (n == 0)
    return "not a loadable module: the file is empty";
  if (n < 4)
    return "not a loadable module: not an ELF file*";
  return "not a loadable module: truncated: *";
}

/* Copies of PLUGIN_GELU cut to each length, in a new directory. */
static gchar *
write_cut_copies(GArray *lengths)
{
  g_autofree gchar *contents = NULL;
  gsize size = 0;
  g_autoptr(GError) error = NULL;
  g_assert_true(g_file_get_contents(PLUGIN_GELU, &contents, &size, &error));
  gchar *dir = g_dir_make_tmp("qkv-cut-plugins-XXXXXX", &error);
  g_assert_no_error(error);
  for (guint i = 0; i < lengths->len; i++) {
    gsize n = g_array_index(lengths, gsize, i);
    g_assert_cmpuint(n, <, size);
    g_autofree gchar *name = g_strdup_printf("gelu-%" G_GSIZE_FORMAT ".so", n);
    g_autofree gchar *path = g_build_filename(dir, name, NULL);
    g_assert_true(g_file_set_contents(path, contents, (gssize)n, &error));
  }
  return dir;
}

static void
remove_dir(const gchar *dir_path)
{
  g_autoptr(GDir) dir = g_dir_open(dir_path, 0, NULL);
  const gchar *entry;
  while (dir != NULL && (entry = g_dir_read_name(dir)) != NULL) {
    g_autofree gchar *path = g_build_filename(dir_path, entry, NULL);
    g_remove(path);
  }
  g_rmdir(dir_path);
}

static gsize
file_size(const gchar *path)
{
  g_autofree gchar *contents = NULL;
  gsize size = 0;
  g_assert_true(g_file_get_contents(path, &contents, &size, NULL));
  return size;
}

/* A truncated plugin is refused with an error before dlopen() maps it
 * (mapping it raised SIGBUS in the dynamic loader). */
static void
test_truncated(void)
{
  g_autoptr(GArray) lengths = cut_lengths(file_size(PLUGIN_GELU));
  g_autofree gchar *dir = write_cut_copies(lengths);
  for (guint i = 0; i < lengths->len; i++) {
    gsize n = g_array_index(lengths, gsize, i);
    g_autofree gchar *name = g_strdup_printf("gelu-%" G_GSIZE_FORMAT ".so", n);
    g_autofree gchar *path = g_build_filename(dir, name, NULL);
    assert_load_fails(path, cut_reason(n));
  }
  g_assert_null(qkv_op_lookup("example.gelu"));
  remove_dir(dir);
}

/* A complete file, but not for this machine or not a shared object. */
static void
test_wrong_elf(void)
{
  g_autofree gchar *contents = NULL;
  gsize size = 0;
  g_autoptr(GError) error = NULL;
  g_assert_true(g_file_get_contents(PLUGIN_GELU, &contents, &size, &error));
  g_autofree gchar *dir = g_dir_make_tmp("qkv-wrong-elf-XXXXXX", &error);
  g_assert_no_error(error);
  const struct {
    guint offset;
    guint8 value;
    const gchar *reason;
  } cases[] = {
      {4, 1, "not a loadable module: ELF class 1, not 64-bit*"},
      {5, 2, "not a loadable module: ELF data encoding 2, not little-endian*"},
      {16, 2, "not a loadable module: ELF type 2, not a shared object*"},
      {18, 2, "not a loadable module: built for ELF machine 2, not this machine's*"},
  };
  for (guint i = 0; i < G_N_ELEMENTS(cases); i++) {
    g_autofree gchar *copy = g_memdup2(contents, size);
    copy[cases[i].offset] = (gchar)cases[i].value;
    g_autofree gchar *name = g_strdup_printf("gelu-%u.so", i);
    g_autofree gchar *path = g_build_filename(dir, name, NULL);
    g_assert_true(g_file_set_contents(path, copy, (gssize)size, &error));
    assert_load_fails(path, cases[i].reason);
  }
  remove_dir(dir);
}

/* Files that are not regular files are refused without being read: a FIFO
 * (reading it, or dlopen() opening it, would wait for a writer forever) and
 * a device. */
static void
test_not_regular(void)
{
  g_autoptr(GError) error = NULL;
  g_autofree gchar *dir = g_dir_make_tmp("qkv-fifo-XXXXXX", &error);
  g_assert_no_error(error);
  g_autofree gchar *fifo = g_build_filename(dir, "fifo.so", NULL);
  g_assert_cmpint(mkfifo(fifo, 0600), ==, 0);
  assert_load_fails(fifo, "not a loadable module: not a regular file");
  assert_load_fails("/dev/null", "not a loadable module: not a regular file");
  remove_dir(dir);
}

/* The same at initialisation, through QKV_PLUGIN_PATH: each cut copy is a
 * warning, and a good plugin beside them still loads. */
static void
test_truncated_autoload(void)
{
  if (g_test_subprocess()) {
    g_autoptr(GArray) lengths = cut_lengths(file_size(PLUGIN_GELU));
    g_autofree gchar *dir = write_cut_copies(lengths);
    g_autofree gchar *good = NULL;
    gsize good_size = 0;
    g_assert_true(g_file_get_contents(PLUGIN_GOOD_A, &good, &good_size, NULL));
    g_autofree gchar *good_path = g_build_filename(dir, "good.so", NULL);
    g_assert_true(g_file_set_contents(good_path, good, (gssize)good_size, NULL));
    /* The first qkv call: initialisation reads the variable. */
    g_setenv("QKV_PLUGIN_PATH", dir, TRUE);
    g_log_set_always_fatal(G_LOG_FATAL_MASK);
    g_log_set_fatal_mask("qkv", G_LOG_FATAL_MASK);
    g_assert_cmpuint(qkv_plugin_count(), ==, 1);
    g_assert_nonnull(qkv_op_lookup("test.good_a"));
    g_assert_null(qkv_op_lookup("example.gelu"));
    assert_library_works();
    remove_dir(dir);
    return;
  }
  g_test_trap_subprocess(NULL, 0, G_TEST_SUBPROCESS_DEFAULT);
  g_test_trap_assert_passed();
  g_test_trap_assert_stderr("*WARNING*gelu-0.so': not a loadable module: the file is empty*");
  g_test_trap_assert_stderr("*WARNING*gelu-1000.so': not a loadable module: truncated: *");
  g_test_trap_assert_stderr_unmatched("*good.so*");
}

/* An op built against ABI 1.0 (no decompose field; garbage in the reserved
 * space where 1.1 keeps it) registers and runs, and autodiff reports that it
 * has no gradient instead of calling the garbage. */
static void
test_old_abi(void)
{
  g_autoptr(GError) error = NULL;
  const QkvPlugin *p = qkv_plugin_load(PLUGIN_OLD_ABI, &error);
  g_assert_no_error(error);
  g_assert_nonnull(p);
  const QkvOpDef *def = qkv_op_lookup("old.triple");
  g_assert_nonnull(def);
  g_assert_null(def->decompose);
  g_assert_cmpuint(def->abi_minor, ==, 0);

  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvShape s = QKV_SHAPE(2);
  QkvValue *x = qkv_graph_input(g, "x", QKV_F32, &s, &error);
  qkv_value_set_requires_grad(x, TRUE);
  QkvValue *y = qkv_graph_op(g, "old.triple", &x, 1, NULL, &error);
  g_assert_no_error(error);
  g_autoptr(QkvPlan) plan = qkv_graph_compile(g, &y, 1, NULL, &error);
  g_assert_no_error(error);
  float xv[] = {1, -2};
  g_autoptr(QkvTensor) xt = qkv_tensor_new_f32(&s, xv);
  g_assert_true(qkv_plan_bind(plan, "x", xt, &error));
  g_assert_true(qkv_plan_run(plan, &error));
  float want[] = {3, -6};
  qkv_assert_values(qkv_plan_output(plan, 0), want, 2, 0);

  QkvValue *loss = qkv_sum(y, NULL, 0, FALSE, &error);
  g_assert_false(qkv_graph_backward(g, loss, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_NO_GRADIENT);
  g_assert_nonnull(strstr(error->message, "old.triple"));
}

/* At initialisation, every module in the QKV_PLUGIN_PATH directories is
 * loaded; the broken ones are warnings that name the file and do not stop
 * the library. Run in a child, whose first qkv call is after the setenv. */
static void
test_autoload_warnings(void)
{
  if (g_test_subprocess()) {
    g_setenv("QKV_PLUGIN_PATH", TEST_PLUGINS_DIR ":/nonexistent/qkv/plugins", TRUE);
    g_log_set_always_fatal(G_LOG_FATAL_MASK);
    g_log_set_fatal_mask("qkv", G_LOG_FATAL_MASK);
    /* The good plugins load (good-a wins over good-b, by file name). */
    g_assert_nonnull(qkv_op_lookup("test.good_a"));
    g_assert_null(qkv_op_lookup("test.good_b"));
    g_assert_nonnull(qkv_op_lookup("old.triple"));
    /* Nothing of the broken ones. */
    g_auto(GStrv) names = qkv_op_list();
    for (guint i = 0; names[i] != NULL; i++)
      g_assert_false(g_str_has_prefix(names[i], "broken."));
    g_assert_cmpuint(qkv_plugin_count(), ==, 2);
    assert_library_works();
    return;
  }
  g_test_trap_subprocess(NULL, 0, G_TEST_SUBPROCESS_DEFAULT);
  g_test_trap_assert_passed();
  g_test_trap_assert_stderr("*WARNING*plugin '" PLUGIN_DUPLICATE_OP
                            "': registering its ops failed*(skipped)*");
  g_test_trap_assert_stderr("*WARNING*plugin '" PLUGIN_WRONG_MAJOR "': built for op ABI*");
  g_test_trap_assert_stderr("*WARNING*not-a-module.so': not a loadable module*");
  g_test_trap_assert_stderr_unmatched("*good-b*");
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  g_test_add_func("/plugin-errors/missing-file", test_missing_file);
  g_test_add_func("/plugin-errors/directory", test_directory);
  g_test_add_func("/plugin-errors/not-a-module", test_not_a_module);
  g_test_add_func("/plugin-errors/unresolved-symbol", test_unresolved_symbol);
  g_test_add_func("/plugin-errors/no-descriptor", test_no_descriptor);
  g_test_add_func("/plugin-errors/null-descriptor", test_null_descriptor);
  g_test_add_func("/plugin-errors/wrong-abi-major", test_wrong_major);
  g_test_add_func("/plugin-errors/newer-abi-minor", test_newer_minor);
  g_test_add_func("/plugin-errors/struct-size-too-small", test_small_struct);
  g_test_add_func("/plugin-errors/duplicate-op-rolled-back", test_duplicate_op);
  g_test_add_func("/plugin-errors/failing-register-rolled-back", test_failing_register);
  g_test_add_func("/plugin-errors/register-fails-silently", test_silent_failure);
  g_test_add_func("/plugin-errors/same-plugin-name", test_same_name);
  g_test_add_func("/plugin-errors/old-abi-loads", test_old_abi);
  g_test_add_func("/plugin-errors/autoload-warnings", test_autoload_warnings);
  g_test_add_func("/plugin-errors/loads-itself", test_reentrant);
  g_test_add_func("/plugin-errors/truncated", test_truncated);
  g_test_add_func("/plugin-errors/wrong-elf", test_wrong_elf);
  g_test_add_func("/plugin-errors/not-a-regular-file", test_not_regular);
  g_test_add_func("/plugin-errors/truncated-autoload", test_truncated_autoload);
  return g_test_run();
}
