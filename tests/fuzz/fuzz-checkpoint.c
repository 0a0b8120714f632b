/* fuzz-checkpoint.c: qkv_checkpoint_load() of arbitrary bytes into a store
 * with an Adam optimizer and a schedule, strict and lenient. A refused file
 * leaves the store unchanged; an accepted one gives state the optimizer can
 * step from without tripping a sanitizer, and saves into a file that loads
 * back to the same values, and into a BF16 file that loads back to the same
 * state and values rounded to bfloat16.
 *
 * QKV_FUZZ_SEEDS: checkpoints (run.sh seeds it with files qkv saves) */
#include "fuzz-common.h"

#include <glib/gstdio.h>
#include <math.h>
#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const guint8 *data, size_t size);

static gchar *save_dir;

static void
remove_save_dir(void)
{
  g_autofree gchar *out = g_build_filename(save_dir, "c.safetensors", NULL);
  g_remove(out);
  g_rmdir(save_dir);
}

int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
  fuzz_environment();
  const gchar *base = g_file_test("/dev/shm", G_FILE_TEST_IS_DIR) ? "/dev/shm" : g_get_tmp_dir();
  g_autofree gchar *tmpl = g_build_filename(base, "qkv-fuzz-XXXXXX", NULL);
  save_dir = g_mkdtemp(g_steal_pointer(&tmpl));
  if (save_dir == NULL)
    abort();
  atexit(remove_save_dir);
  return 0;
}

/* The store make-seeds.c saves: the fuzzer mutates files that match it. */
static QkvParams *
make_store(void)
{
  QkvParams *params = qkv_params_new();
  QkvShape w = QKV_SHAPE(3, 4), b = QKV_SHAPE(4), s = qkv_shape_scalar(), e = QKV_SHAPE(5, 2);
  qkv_tensor_fill(qkv_param_value(qkv_params_add(params, "layer.weight", &w, NULL)), 0.25);
  qkv_tensor_fill(qkv_param_value(qkv_params_add(params, "layer.bias", &b, NULL)), -0.5);
  qkv_tensor_fill(qkv_param_value(qkv_params_add(params, "scale", &s, NULL)), 1.0);
  qkv_tensor_fill(qkv_param_value(qkv_params_add(params, "emb", &e, NULL)), 2.0);
  return params;
}

/* Every value (if with_values) and state of the store, as bytes. */
static GBytes *
snapshot_full(QkvParams *params, gboolean with_values)
{
  GByteArray *out = g_byte_array_new();
  for (guint i = 0; i < qkv_params_size(params); i++) {
    QkvParam *p = qkv_params_nth(params, i);
    QkvTensor *v = qkv_param_value(p);
    if (with_values)
      g_byte_array_append(out, qkv_tensor_const_data(v), qkv_tensor_nbytes(v));
    for (guint s = 0; s < qkv_param_n_states(p); s++) {
      QkvTensor *t;
      const gchar *name = qkv_param_nth_state(p, s, &t);
      g_byte_array_append(out, (const guint8 *)name, strlen(name) + 1);
      g_byte_array_append(out, qkv_tensor_const_data(t), qkv_tensor_nbytes(t));
    }
  }
  return g_byte_array_free_to_bytes(out);
}

static GBytes *
snapshot(QkvParams *params)
{
  return snapshot_full(params, TRUE);
}

/* b is a rounded to bfloat16: a NaN for a NaN; otherwise the low half of
 * its bits zero, the same sign, within half an ulp (2^-8 relative, 2^-134
 * among the subnormals), or an infinity where a is past the largest
 * bfloat16 by half an ulp or more. */
static gboolean
is_bf16_of(float a, float b)
{
  guint32 bits;
  memcpy(&bits, &b, 4);
  if (isnan(a))
    return isnan(b);
  if ((bits & 0xffff) != 0 || !signbit(a) != !signbit(b))
    return FALSE;
  if (isinf(b))
    return fabsf(a) >= 0x1.ffp127f;
  return fabsf(b - a) <= fmaxf(ldexpf(fabsf(a), -8), 0x1p-134f);
}

/* Saved with BF16 params, loaded into a fresh store: the same state, the
 * values rounded. */
static void
check_bf16_save(const gchar *out, QkvParams *params, QkvOptimizer *opt, QkvSchedule *sched,
                QkvCheckpointFlags flags)
{
  GError *error = NULL;
  if (!qkv_checkpoint_save_full(out, params, opt, sched, NULL, QKV_CHECKPOINT_DTYPE_BF16, &error))
    abort();
  QkvParams *again = make_store();
  QkvOptimConfig c = qkv_optim_config_adam(0.01);
  QkvOptimizer *opt2 = opt != NULL ? qkv_optimizer_new_adam(again, &c, NULL) : NULL;
  QkvSchedule *sched2 = sched != NULL ? qkv_schedule_new_step(0.01, 10, 0.5) : NULL;
  if (!qkv_checkpoint_load(out, again, opt2, sched2, flags, NULL, NULL, &error))
    abort();
  GBytes *states = snapshot_full(params, FALSE), *states2 = snapshot_full(again, FALSE);
  if (!g_bytes_equal(states, states2))
    abort();
  for (guint i = 0; i < qkv_params_size(params); i++) {
    const float *a = qkv_tensor_const_data(qkv_param_value(qkv_params_nth(params, i)));
    const float *b = qkv_tensor_const_data(qkv_param_value(qkv_params_nth(again, i)));
    for (gint64 k = 0; k < qkv_tensor_numel(qkv_param_value(qkv_params_nth(params, i))); k++)
      if (!is_bf16_of(a[k], b[k]))
        abort();
  }
  g_bytes_unref(states);
  g_bytes_unref(states2);
  qkv_schedule_free(sched2);
  qkv_optimizer_free(opt2);
  qkv_params_free(again);
}

/* with_optimizer FALSE: parameters only (a file without optimizer state
 * then loads too) */
static void
load_one(const gchar *path, QkvCheckpointFlags flags, gboolean with_optimizer)
{
  QkvParams *params = make_store();
  QkvOptimConfig c = qkv_optim_config_adam(0.01);
  QkvOptimizer *opt = with_optimizer ? qkv_optimizer_new_adam(params, &c, NULL) : NULL;
  QkvSchedule *sched = with_optimizer ? qkv_schedule_new_step(0.01, 10, 0.5) : NULL;
  GBytes *before = snapshot(params);
  GError *error = NULL;
  GPtrArray *missing = NULL, *unexpected = NULL;
  if (!qkv_checkpoint_load(path, params, opt, sched, flags, &missing, &unexpected, &error)) {
    if (error == NULL || error->domain != QKV_ERROR || !g_utf8_validate(error->message, -1, NULL))
      abort();
    GBytes *after = snapshot(params);
    if (!g_bytes_equal(before, after))
      abort(); /* a refused load changed the store */
    g_bytes_unref(after);
    g_clear_error(&error);
  } else {
    g_ptr_array_unref(missing);
    g_ptr_array_unref(unexpected);
    /* whatever was accepted can be stepped from */
    if (with_optimizer) {
      for (guint i = 0; i < qkv_params_size(params); i++)
        qkv_tensor_fill(qkv_param_grad(qkv_params_nth(params, i)), 0.125);
      qkv_schedule_step(sched, opt);
      if (!qkv_optimizer_step(opt, &error))
        g_clear_error(&error);
    }
    /* and saved, and loaded back to the same bytes */
    g_autofree gchar *out = g_build_filename(save_dir, "c.safetensors", NULL);
    if (!qkv_checkpoint_save(out, params, opt, sched, NULL, &error))
      abort();
    GBytes *saved = snapshot(params);
    QkvParams *again = make_store();
    QkvOptimizer *opt2 = with_optimizer ? qkv_optimizer_new_adam(again, &c, NULL) : NULL;
    QkvSchedule *sched2 = with_optimizer ? qkv_schedule_new_step(0.01, 10, 0.5) : NULL;
    if (!qkv_checkpoint_load(out, again, opt2, sched2, flags, NULL, NULL, &error))
      abort();
    GBytes *reloaded = snapshot(again);
    if (!g_bytes_equal(saved, reloaded))
      abort();
    if (with_optimizer && (qkv_optimizer_get_step(opt2) != qkv_optimizer_get_step(opt) ||
                           qkv_schedule_get_position(sched2) != qkv_schedule_get_position(sched)))
      abort();
    g_bytes_unref(saved);
    g_bytes_unref(reloaded);
    qkv_schedule_free(sched2);
    qkv_optimizer_free(opt2);
    qkv_params_free(again);
    check_bf16_save(out, params, opt, sched, flags);
  }
  g_bytes_unref(before);
  qkv_schedule_free(sched);
  qkv_optimizer_free(opt);
  qkv_params_free(params);
}

int
LLVMFuzzerTestOneInput(const guint8 *data, size_t size)
{
  const gchar *path = fuzz_write_input(data, size);
  load_one(path, QKV_CHECKPOINT_STRICT, TRUE);
  load_one(path, QKV_CHECKPOINT_ALLOW_MISSING | QKV_CHECKPOINT_ALLOW_UNEXPECTED, TRUE);
  load_one(path, QKV_CHECKPOINT_ALLOW_MISSING | QKV_CHECKPOINT_ALLOW_UNEXPECTED, FALSE);
  return 0;
}
