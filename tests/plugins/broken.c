/* broken.c: plugins that must fail to load, one per BROKEN_* define. Each
 * failure must leave the registry as it was. */
#include <qkv/qkv.h>

#include <stddef.h>

static gboolean
noop_shape(QkvShapeCtx *ctx, GError **error)
{
  ctx->out_shapes[0] = ctx->in_shapes[0];
  return TRUE;
}

static void
noop_forward(const QkvKernelCtx *ctx)
{
}

/* A valid op, registered first so that the failure after it must roll it back. */
static gboolean
register_first(const gchar *name, GError **error)
{
  const QkvOpDef def = {
      QKV_OP_DEF_INIT, .name = name,        .min_inputs = 1,
      .max_inputs = 1, .shape = noop_shape, .forward = noop_forward,
  };
  return qkv_op_register(&def, error);
}

/* Unused by the cases that fail before registering. */
G_GNUC_UNUSED static gboolean
register_broken(GError **error)
{
#if defined(BROKEN_DUPLICATE_OP)
  /* A new op, then a name the library already has. */
  return register_first("broken.first", error) && register_first("matmul", error);
#elif defined(BROKEN_FAILING_REGISTER)
  if (!register_first("broken.second", error))
    return FALSE;
  g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT, "the accelerator it needs is absent");
  return FALSE;
#elif defined(BROKEN_SILENT_FAILURE)
  return register_first("broken.third", error) && FALSE;
#elif defined(BROKEN_REENTRANT)
  /* Loads its own file from its register function, before registering
   * anything: the loader must refuse the inner load instead of calling this
   * function again without end. */
  GError *inner = NULL;
  if (qkv_plugin_load(SELF_PATH, &inner) != NULL) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT, "loading itself again succeeded");
    return FALSE;
  }
  g_propagate_error(error, inner);
  return register_first("broken.fourth", NULL) && FALSE;
#else
  return register_first("broken.never", error);
#endif
}

#if defined(BROKEN_NO_DESCRIPTOR)

G_MODULE_EXPORT int not_a_qkv_plugin(void);

G_MODULE_EXPORT int
not_a_qkv_plugin(void)
{
  return register_broken(NULL);
}

#elif defined(BROKEN_UNRESOLVED)

/* Defined nowhere: the module cannot be bound. */
void qkv_function_that_does_not_exist(void);

static gboolean
register_unresolved(GError **error)
{
  qkv_function_that_does_not_exist();
  return register_broken(error);
}

QKV_PLUGIN_DEFINE("broken-unresolved", "0", "MIT", "calls a missing function", register_unresolved);

#elif defined(BROKEN_NULL_DESCRIPTOR)

G_MODULE_EXPORT const QkvPluginInfo *qkv_plugin_describe(void);

G_MODULE_EXPORT const QkvPluginInfo *
qkv_plugin_describe(void)
{
  return NULL;
}

#elif defined(BROKEN_WRONG_MAJOR) || defined(BROKEN_NEWER_MINOR) || defined(BROKEN_SMALL_STRUCT)

G_MODULE_EXPORT const QkvPluginInfo *qkv_plugin_describe(void);

G_MODULE_EXPORT const QkvPluginInfo *
qkv_plugin_describe(void)
{
  static const QkvPluginInfo info = {
#if defined(BROKEN_SMALL_STRUCT)
    .struct_size = offsetof(QkvPluginInfo, register_ops),
#else
    .struct_size = sizeof(QkvPluginInfo),
#endif
#if defined(BROKEN_WRONG_MAJOR)
    .abi_major = QKV_OP_ABI_MAJOR + 1,
#else
    .abi_major = QKV_OP_ABI_MAJOR,
#endif
#if defined(BROKEN_NEWER_MINOR)
    .abi_minor = QKV_OP_ABI_MINOR + 1,
#else
    .abi_minor = QKV_OP_ABI_MINOR,
#endif
    .name = "broken-abi",
    .version = "0",
    .license = "MIT",
    .description = "a descriptor this qkv cannot read",
    .register_ops = register_broken,
  };
  return &info;
}

#else

QKV_PLUGIN_DEFINE("broken", "0", "MIT", "registers an op, then fails", register_broken);

#endif
