/* old-abi.c: a plugin as built against op ABI 1.0, before QkvOpDef had
 * decompose: its descriptor and op definition say 1.0, and the op struct has
 * the 1.0 layout (reserved[12] where 1.1 keeps decompose + reserved[11]). It
 * must still load, and the registry must not read its reserved space as a
 * decomposition. */
#include <qkv/qkv.h>

typedef struct {
  guint32 struct_size;
  guint16 abi_major;
  guint16 abi_minor;
  const gchar *name;
  const gchar *doc;
  guint min_inputs;
  gint max_inputs;
  const gchar *const *input_names;
  const gchar *const *output_names;
  const QkvAttrSpec *attrs;
  guint n_attrs;
  guint64 no_grad_inputs;
  guint32 flags;
  QkvShapeFunc shape;
  QkvKernelFunc forward;
  QkvGradFunc gradient;
  QkvScratchFunc scratch_size;
  gpointer reserved[12];
} OpDef10;

G_STATIC_ASSERT(sizeof(OpDef10) == sizeof(QkvOpDef));

static gboolean
old_shape(QkvShapeCtx *ctx, GError **error)
{
  ctx->out_shapes[0] = ctx->in_shapes[0];
  return TRUE;
}

/* y = 3x */
static void
old_forward(const QkvKernelCtx *ctx)
{
  const float *x = ctx->in[0].data;
  float *y = ctx->out[0].data;
  for (gint64 i = 0; i < qkv_shape_numel(&ctx->out[0].shape); i++)
    y[i] = 3.0f * x[i];
}

static int not_a_function;

static gboolean
register_old(GError **error)
{
  static const OpDef10 def = {
      .struct_size = sizeof(OpDef10),
      .abi_major = 1,
      .abi_minor = 0,
      .name = "old.triple",
      .doc = "3x, from an ABI 1.0 plugin with no gradient rule",
      .min_inputs = 1,
      .max_inputs = 1,
      .shape = old_shape,
      .forward = old_forward,
      /* Garbage in the reserved space (which 1.0 said to leave zero), where
       * 1.1 reads decompose: the registry must ignore it. */
      .reserved = {&not_a_function},
  };
  return qkv_op_register((const QkvOpDef *)&def, error);
}

G_MODULE_EXPORT const QkvPluginInfo *qkv_plugin_describe(void);

G_MODULE_EXPORT const QkvPluginInfo *
qkv_plugin_describe(void)
{
  static const QkvPluginInfo info = {
      .struct_size = sizeof(QkvPluginInfo),
      .abi_major = 1,
      .abi_minor = 0,
      .name = "old-abi",
      .version = "1.0",
      .license = "MIT",
      .description = "built against op ABI 1.0",
      .register_ops = register_old,
  };
  return &info;
}
