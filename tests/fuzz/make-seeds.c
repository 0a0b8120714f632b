/* make-seeds.c: writes the seed corpus for the checkpoint fuzz targets into
 * the directory given: checkpoints as qkv saves them, for the store that
 * fuzz-checkpoint.c loads into. (Not a fuzz target: run.sh builds it apart.) */
#include <qkv/qkv.h>

#include <stdio.h>
#include <stdlib.h>

static QkvParams *
make_store(float shift)
{
  QkvParams *params = qkv_params_new();
  QkvShape w = QKV_SHAPE(3, 4), b = QKV_SHAPE(4), s = qkv_shape_scalar(), e = QKV_SHAPE(5, 2);
  QkvShape *shapes[] = {&w, &b, &s, &e};
  const gchar *names[] = {"layer.weight", "layer.bias", "scale", "emb"};
  for (guint i = 0; i < G_N_ELEMENTS(names); i++) {
    QkvTensor *t = qkv_param_value(qkv_params_add(params, names[i], shapes[i], NULL));
    float *d = qkv_tensor_f32(t);
    for (gint64 k = 0; k < qkv_tensor_numel(t); k++)
      d[k] = shift + (float)((k * 37 + i) % 11) / 8.0f;
  }
  return params;
}

static void
save(const gchar *dir, const gchar *name, QkvParams *params, QkvOptimizer *opt, QkvSchedule *sched,
     GHashTable *meta)
{
  g_autofree gchar *path = g_build_filename(dir, name, NULL);
  g_autoptr(GError) error = NULL;
  if (!qkv_checkpoint_save(path, params, opt, sched, meta, &error)) {
    fprintf(stderr, "make-seeds: %s\n", error->message);
    exit(1);
  }
}

/* Params in BF16 (tests/data/half_*.safetensors add F16 and F64 seeds). */
static void
save_bf16(const gchar *dir, const gchar *name, QkvParams *params, QkvOptimizer *opt,
          QkvSchedule *sched)
{
  g_autofree gchar *path = g_build_filename(dir, name, NULL);
  g_autoptr(GError) error = NULL;
  if (!qkv_checkpoint_save_full(path, params, opt, sched, NULL, QKV_CHECKPOINT_DTYPE_BF16,
                                &error)) {
    fprintf(stderr, "make-seeds: %s\n", error->message);
    exit(1);
  }
}

/* Two optimizer steps with gradients, so every state exists. */
static void
train(QkvParams *params, QkvOptimizer *opt, QkvSchedule *sched)
{
  for (int step = 0; step < 2; step++) {
    for (guint i = 0; i < qkv_params_size(params); i++)
      qkv_tensor_fill(qkv_param_grad(qkv_params_nth(params, i)), 0.1 * (step + 1));
    if (sched != NULL)
      qkv_schedule_step(sched, opt);
    g_autoptr(GError) error = NULL;
    if (!qkv_optimizer_step(opt, &error)) {
      fprintf(stderr, "make-seeds: %s\n", error->message);
      exit(1);
    }
  }
}

int
main(int argc, char **argv)
{
  if (argc != 2) {
    fprintf(stderr, "usage: make-seeds DIR\n");
    return 2;
  }
  const gchar *dir = argv[1];
  g_autoptr(QkvParams) plain = make_store(0);
  save(dir, "params.safetensors", plain, NULL, NULL, NULL);

  g_autoptr(QkvParams) with_adam = make_store(1);
  QkvOptimConfig c = qkv_optim_config_adam(0.01);
  g_autoptr(QkvOptimizer) adam = qkv_optimizer_new_adam(with_adam, &c, NULL);
  g_autoptr(QkvSchedule) sched = qkv_schedule_new_step(0.01, 10, 0.5);
  train(with_adam, adam, sched);
  g_autoptr(GHashTable) meta = g_hash_table_new(g_str_hash, g_str_equal);
  g_hash_table_insert(meta, "epoch", "3");
  g_hash_table_insert(meta, "note", "seed \xc3\xa9\\\"quoted\"");
  save(dir, "adam.safetensors", with_adam, adam, sched, meta);
  save_bf16(dir, "adam-bf16.safetensors", with_adam, adam, sched);

  g_autoptr(QkvParams) with_sgd = make_store(2);
  QkvOptimConfig s = qkv_optim_config_sgd(0.1);
  s.momentum = 0.9;
  g_autoptr(QkvOptimizer) sgd = qkv_optimizer_new_sgd(with_sgd, &s, NULL);
  train(with_sgd, sgd, NULL);
  save(dir, "sgd.safetensors", with_sgd, sgd, NULL, NULL);

  g_autoptr(QkvParams) empty = qkv_params_new();
  save(dir, "empty.safetensors", empty, NULL, NULL, NULL);
  return 0;
}
