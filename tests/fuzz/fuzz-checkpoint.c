/* fuzz-checkpoint.c: qkv_checkpoint_load() of arbitrary bytes into a store
 * with an Adam optimizer and a schedule, strict and lenient. A refused file
 * leaves the store unchanged; an accepted one gives state the optimizer can
 * step from without tripping a sanitizer, and saves into a file that loads
 * back to the same values.
 *
 * QKV_FUZZ_SEEDS: checkpoints (run.sh seeds it with files qkv saves) */
#include "fuzz-common.h"

#include <glib/gstdio.h>
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

/* Every value and state of the store, as bytes. */
static GBytes *
snapshot(QkvParams *params)
{
  GByteArray *out = g_byte_array_new();
  for (guint i = 0; i < qkv_params_size(params); i++) {
    QkvParam *p = qkv_params_nth(params, i);
    QkvTensor *v = qkv_param_value(p);
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
