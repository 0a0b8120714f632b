/* qkv-info: list the registered ops (built-in and plugin) and the loaded
 * plugins; with --plugin FILE, load a plugin and report what it registered or
 * exactly why it failed. */
#include <qkv/qkv.h>

#include <locale.h>
#include <stdio.h>
#include <stdlib.h>

#include "../examples/common/program-version.h"

static gchar **plugin_files = NULL;
static gchar *only_op = NULL;
static gboolean brief = FALSE;
static gboolean show_version = FALSE;

static const GOptionEntry entries[] = {
    {"plugin", 'p', 0, G_OPTION_ARG_FILENAME_ARRAY, &plugin_files,
     "Load the plugin module FILE and report the ops it registered (repeatable)", "FILE"},
    {"op", 'o', 0, G_OPTION_ARG_STRING, &only_op, "Describe only the op NAME", "NAME"},
    {"brief", 'b', 0, G_OPTION_ARG_NONE, &brief, "One line per op and plugin", NULL},
    {"version", 'V', 0, G_OPTION_ARG_NONE, &show_version, "Print the version and exit", NULL},
    G_OPTION_ENTRY_NULL,
};

/* Docs are UTF-8 and go out as such (g_print() would turn every non-ASCII
 * character into '?' under the C locale). */
static void say(const gchar *format, ...) G_GNUC_PRINTF(1, 2);
static void complain(const gchar *format, ...) G_GNUC_PRINTF(1, 2);

static void
say(const gchar *format, ...)
{
  va_list args;
  va_start(args, format);
  vprintf(format, args);
  va_end(args);
}

static void
complain(const gchar *format, ...)
{
  va_list args;
  va_start(args, format);
  vfprintf(stderr, format, args);
  va_end(args);
}

static const gchar *
attr_type_name(QkvAttrType type)
{
  switch (type) {
  case QKV_ATTR_INT:
    return "int";
  case QKV_ATTR_FLOAT:
    return "float";
  case QKV_ATTR_BOOL:
    return "bool";
  case QKV_ATTR_INTS:
    return "ints";
  case QKV_ATTR_STRING:
    return "string";
  }
  return "?";
}

static gchar *
attr_default(const QkvAttrSpec *spec)
{
  if (spec->required)
    return g_strdup("required");
  switch (spec->type) {
  case QKV_ATTR_INT:
    return g_strdup_printf("default %" G_GINT64_FORMAT, spec->default_int);
  case QKV_ATTR_FLOAT:
    return g_strdup_printf("default %g", spec->default_float);
  case QKV_ATTR_BOOL:
    return g_strdup_printf("default %s", spec->default_int ? "true" : "false");
  case QKV_ATTR_INTS:
    return g_strdup("default []");
  case QKV_ATTR_STRING:
    return spec->default_string ? g_strdup_printf("default \"%s\"", spec->default_string)
                                : g_strdup("default none");
  }
  return g_strdup("");
}

static gchar *
join_names(const gchar *const *names)
{
  if (names == NULL || names[0] == NULL)
    return g_strdup("(unnamed)");
  return g_strjoinv(", ", (gchar **)names);
}

static gchar *
arity(const QkvOpDef *op)
{
  if (op->max_inputs < 0)
    return g_strdup_printf("%u or more", op->min_inputs);
  if ((guint)op->max_inputs == op->min_inputs)
    return g_strdup_printf("%u", op->min_inputs);
  return g_strdup_printf("%u to %d", op->min_inputs, op->max_inputs);
}

static void
print_op(const gchar *name, const gchar *in)
{
  const QkvOpDef *op = qkv_op_lookup(name);
  if (op == NULL)
    return;
  const gchar *origin = qkv_op_origin(name);
  if (brief) {
    say("%s%-28s %s\n", in, name, origin);
    return;
  }
  say("%s%s  [%s]\n", in, name, origin);
  if (op->doc != NULL)
    say("%s    %s\n", in, op->doc);
  g_autofree gchar *n_in = arity(op);
  g_autofree gchar *in_names = join_names(op->input_names);
  g_autofree gchar *out_names = join_names(op->output_names);
  say("%s    inputs (%s): %s\n", in, n_in, in_names);
  say("%s    outputs: %s\n", in, out_names);
  if (op->n_attrs == 0)
    say("%s    attributes: none\n", in);
  else
    say("%s    attributes:\n", in);
  for (guint i = 0; i < op->n_attrs; i++) {
    const QkvAttrSpec *spec = &op->attrs[i];
    g_autofree gchar *def = attr_default(spec);
    say("%s      %s: %s, %s%s%s\n", in, spec->name, attr_type_name(spec->type), def,
        spec->doc ? " — " : "", spec->doc ? spec->doc : "");
  }
  const gchar *grad = op->gradient    ? "gradient rule"
                      : op->decompose ? "decomposition into existing ops"
                                      : "none (not differentiable)";
  say("%s    gradient: %s\n", in, grad);
  if (op->flags & (QKV_OP_INPLACE | QKV_OP_RANDOM))
    say("%s    flags:%s%s\n", in, (op->flags & QKV_OP_INPLACE) ? " in-place" : "",
        (op->flags & QKV_OP_RANDOM) ? " random" : "");
}

static void
print_plugin(const QkvPlugin *plugin, const gchar *in)
{
  const gchar *const *ops = qkv_plugin_get_ops(plugin);
  g_autofree gchar *op_names = g_strjoinv(", ", (gchar **)ops);
  if (brief) {
    say("%s%-16s %-10s %s\n", in, qkv_plugin_get_name(plugin), qkv_plugin_get_version(plugin),
        qkv_plugin_get_path(plugin));
    return;
  }
  say("%s%s %s (%s)\n", in, qkv_plugin_get_name(plugin), qkv_plugin_get_version(plugin),
      qkv_plugin_get_license(plugin));
  say("%s    %s\n", in, qkv_plugin_get_description(plugin));
  say("%s    file: %s\n", in, qkv_plugin_get_path(plugin));
  say("%s    ops (%u): %s\n", in, g_strv_length((gchar **)ops), ops[0] ? op_names : "none");
}

int
main(int argc, char **argv)
{
  setlocale(LC_ALL, "");
  g_autoptr(GOptionContext) context = g_option_context_new("- describe qkv's ops and plugins");
  g_option_context_add_main_entries(context, entries, NULL);
  g_option_context_set_description(
      context, "Plugins are loaded at start from the directories in QKV_PLUGIN_PATH\n"
               "(colon-separated) and from the installed plugin directory\n"
               "(QKV_PLUGIN_SYSTEM_PATH replaces it). With --plugin, the exit status is 1\n"
               "if a plugin fails to load, and the message says why.\n");
  g_autoptr(GError) error = NULL;
  if (!g_option_context_parse(context, &argc, &argv, &error)) {
    complain("qkv-info: %s\n", error->message);
    return 2;
  }
  if (argc > 1) {
    complain("qkv-info: unexpected argument '%s' (see --help)\n", argv[1]);
    return 2;
  }
  if (show_version) {
    program_print_version("qkv-info");
    return 0;
  }

  qkv_init();
  int status = 0;

  if (plugin_files != NULL) {
    for (guint i = 0; plugin_files[i] != NULL; i++) {
      g_clear_error(&error);
      const QkvPlugin *plugin = qkv_plugin_load(plugin_files[i], &error);
      if (plugin == NULL) {
        complain("qkv-info: error: %s\n", error->message);
        status = 1;
        continue;
      }
      say("Loaded plugin:\n");
      print_plugin(plugin, "  ");
      say("\nIts ops:\n");
      for (const gchar *const *op = qkv_plugin_get_ops(plugin); *op != NULL; op++)
        print_op(*op, "  ");
      if (plugin_files[i + 1] != NULL)
        say("\n");
    }
    g_strfreev(plugin_files);
    return status;
  }

  if (only_op != NULL) {
    if (qkv_op_lookup(only_op) == NULL) {
      complain("qkv-info: error: no op named '%s' is registered\n", only_op);
      g_free(only_op);
      return 1;
    }
    print_op(only_op, "");
    g_free(only_op);
    return 0;
  }

  say("qkv %s, op ABI %d.%d, vector math: %s\n", qkv_version(), QKV_OP_ABI_MAJOR, QKV_OP_ABI_MINOR,
      qkv_vec_isa());
  /* which library runs the matrix products, and which of its kernels: the
   * answer to "is this CPU running at its full width" (issue 18) */
  say("GEMM: %s, kernel %s (QKV_GEMM=openblas forces the fallback)\n", qkv_gemm_backend(),
      qkv_gemm_kernel());
  /* whether plans in bf16 precision run on bf16 instructions or emulate them */
  const gchar *bf16_why;
  gboolean bf16_native = qkv_bf16_native(&bf16_why);
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  const gchar *cpu_bf16 = __builtin_cpu_supports("avx512bf16") ? "has" : "has no";
#else
  const gchar *cpu_bf16 = "(not x86) has no";
#endif
  say("bf16 products (precision bf16): %s, %s; the CPU %s AVX512_BF16\n",
      bf16_native ? "native" : "emulated", bf16_why, cpu_bf16);
  const gchar *const *dirs = qkv_plugin_search_path();
  say("plugin search path:%s\n", dirs[0] ? "" : " (empty)");
  for (guint i = 0; dirs[i] != NULL; i++)
    say("    %s\n", dirs[i]);

  g_auto(GStrv) names = qkv_op_list();
  say("\nOps (%u):\n", g_strv_length(names));
  for (guint i = 0; names[i] != NULL; i++)
    print_op(names[i], "  ");

  guint n_plugins = qkv_plugin_count();
  say("\nPlugins (%u):\n", n_plugins);
  for (guint i = 0; i < n_plugins; i++)
    print_plugin(qkv_plugin_nth(i), "  ");
  return status;
}
