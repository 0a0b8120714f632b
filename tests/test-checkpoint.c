/* test-checkpoint.c: safetensors checkpoints — round trips, files PyTorch
 * wrote, bit-identical resumed training, corrupt and hostile files, failed
 * saves.
 *
 * QKV_TEST_KEEP_CHECKPOINT=PATH keeps a copy of the round-trip file at PATH
 * for tests/reference/safetensors_ref.py --check. */
#include "test-util.h"

#include <errno.h>
#include <fcntl.h>
#include <glib/gstdio.h>
#include <math.h>
#include <signal.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <utime.h>
#include <unistd.h>

/* ---- helpers ---- */

static gchar *
make_tmpdir(void)
{
  g_autoptr(GError) error = NULL;
  gchar *dir = g_dir_make_tmp("qkv-checkpoint-XXXXXX", &error);
  g_assert_no_error(error);
  return dir;
}

static void
remove_tmpdir(const gchar *dir)
{
  GDir *d = g_dir_open(dir, 0, NULL);
  if (d == NULL)
    return;
  const gchar *name;
  while ((name = g_dir_read_name(d)) != NULL) {
    g_autofree gchar *p = g_build_filename(dir, name, NULL);
    g_assert_cmpint(g_remove(p), ==, 0);
  }
  g_dir_close(d);
  g_assert_cmpint(g_rmdir(dir), ==, 0);
}

static guint
count_files(const gchar *dir)
{
  GDir *d = g_dir_open(dir, 0, NULL);
  guint n = 0;
  while (g_dir_read_name(d) != NULL)
    n++;
  g_dir_close(d);
  return n;
}

static void
fill_pattern(QkvTensor *t, float scale, float shift)
{
  float *d = qkv_tensor_f32(t);
  for (gint64 i = 0; i < qkv_tensor_numel(t); i++)
    d[i] = scale * (float)((i * 37) % 101) / 101.0f + shift;
}

/* A store: "layer.weight" (3, 4), "layer.bias" (4), "scale" (). */
static QkvParams *
small_store(float shift)
{
  QkvParams *params = qkv_params_new();
  QkvShape ws = QKV_SHAPE(3, 4), bs = QKV_SHAPE(4), ss = qkv_shape_scalar();
  fill_pattern(qkv_param_value(qkv_params_add(params, "layer.weight", &ws, NULL)), 2.0f, shift);
  fill_pattern(qkv_param_value(qkv_params_add(params, "layer.bias", &bs, NULL)), -1.0f, shift);
  fill_pattern(qkv_param_value(qkv_params_add(params, "scale", &ss, NULL)), 1.0f, 0.5f + shift);
  return params;
}

/* Every param value (and state) of the store, as one byte string. */
static GBytes *
snapshot(QkvParams *params)
{
  GByteArray *b = g_byte_array_new();
  for (guint i = 0; i < qkv_params_size(params); i++) {
    QkvParam *p = qkv_params_nth(params, i);
    g_byte_array_append(b, (const guint8 *)qkv_param_name(p), strlen(qkv_param_name(p)) + 1);
    QkvTensor *v = qkv_param_value(p);
    g_byte_array_append(b, qkv_tensor_const_data(v), qkv_tensor_nbytes(v));
    for (guint s = 0; s < qkv_param_n_states(p); s++) {
      QkvTensor *t;
      const gchar *name = qkv_param_nth_state(p, s, &t);
      g_byte_array_append(b, (const guint8 *)name, strlen(name) + 1);
      g_byte_array_append(b, qkv_tensor_const_data(t), qkv_tensor_nbytes(t));
    }
  }
  return g_byte_array_free_to_bytes(b);
}

static void
assert_unchanged(QkvParams *params, GBytes *before)
{
  g_autoptr(GBytes) now = snapshot(params);
  g_assert_true(g_bytes_equal(now, before));
}

/* A safetensors file from a JSON header and data; header_len overrides the
 * length field when not G_MAXUINT64. */
static void
write_raw(const gchar *path, const gchar *json, const void *data, gsize data_len,
          guint64 header_len)
{
  gsize n = strlen(json);
  guint64 len = header_len != G_MAXUINT64 ? header_len : n;
  GByteArray *b = g_byte_array_new();
  guint8 le[8];
  for (int i = 0; i < 8; i++)
    le[i] = (guint8)(len >> (8 * i));
  g_byte_array_append(b, le, 8);
  g_byte_array_append(b, (const guint8 *)json, n);
  if (data_len > 0)
    g_byte_array_append(b, data, data_len);
  g_assert_true(g_file_set_contents(path, (const gchar *)b->data, b->len, NULL));
  g_byte_array_unref(b);
}

/* ---- round trips ---- */

static void
test_round_trip(void)
{
  g_autofree gchar *dir = make_tmpdir();
  g_autofree gchar *path = g_build_filename(dir, "model.safetensors", NULL);
  g_autoptr(QkvParams) params = small_store(0.0f);
  g_autoptr(GBytes) saved = snapshot(params);
  g_autoptr(GHashTable) meta = g_hash_table_new(g_str_hash, g_str_equal);
  g_hash_table_insert(meta, "epoch", "3");
  g_hash_table_insert(meta, "note", "round trip \xc3\xa9");
  g_autoptr(GError) error = NULL;
  g_assert_true(qkv_checkpoint_save(path, params, NULL, NULL, meta, &error));
  g_assert_no_error(error);
  if (g_getenv("QKV_TEST_KEEP_CHECKPOINT") != NULL) {
    /* with optimizer state and a schedule, for safetensors_ref.py --check */
    g_autoptr(QkvParams) trained = small_store(0.0f);
    QkvOptimConfig c = qkv_optim_config_adam(0.01);
    g_autoptr(QkvOptimizer) opt = qkv_optimizer_new_adam(trained, &c, NULL);
    g_autoptr(QkvSchedule) sched = qkv_schedule_new_warmup(1.0, 16, 10);
    qkv_schedule_step(sched, opt);
    fill_pattern(qkv_param_grad(qkv_params_nth(trained, 0)), 1.0f, -0.5f);
    g_assert_true(qkv_optimizer_step(opt, NULL));
    g_assert_true(qkv_checkpoint_save(g_getenv("QKV_TEST_KEEP_CHECKPOINT"), trained, opt, sched,
                                      meta, &error));
    g_assert_no_error(error);
  }

  /* change everything, remember where the data lives, load */
  gpointer where[3];
  QkvTensor *tensors[3];
  for (guint i = 0; i < 3; i++) {
    tensors[i] = qkv_param_value(qkv_params_nth(params, i));
    where[i] = qkv_tensor_data(tensors[i]);
    fill_pattern(tensors[i], 5.0f, -9.0f);
  }
  g_autoptr(GPtrArray) missing = NULL;
  g_autoptr(GPtrArray) unexpected = NULL;
  g_assert_true(qkv_checkpoint_load(path, params, NULL, NULL, 0, &missing, &unexpected, &error));
  g_assert_no_error(error);
  assert_unchanged(params, saved);
  g_assert_cmpuint(missing->len, ==, 0);
  g_assert_cmpuint(unexpected->len, ==, 0);
  /* values were copied into the existing buffers */
  for (guint i = 0; i < 3; i++) {
    g_assert_true(qkv_param_value(qkv_params_nth(params, i)) == tensors[i]);
    g_assert_true(qkv_tensor_data(tensors[i]) == where[i]);
  }

  /* metadata: ours, the user's, and "format": "pt" for PyTorch readers */
  g_autoptr(GHashTable) read = qkv_checkpoint_read_metadata(path, &error);
  g_assert_no_error(error);
  g_assert_cmpstr(g_hash_table_lookup(read, "epoch"), ==, "3");
  g_assert_cmpstr(g_hash_table_lookup(read, "note"), ==, "round trip \xc3\xa9");
  g_assert_cmpstr(g_hash_table_lookup(read, "format"), ==, "pt");
  g_assert_cmpstr(g_hash_table_lookup(read, "qkv.version"), ==, qkv_version());

  /* the layout is what safetensors writers produce: aligned, contiguous */
  g_autofree gchar *contents = NULL;
  gsize size = 0;
  g_assert_true(g_file_get_contents(path, &contents, &size, NULL));
  guint64 n = 0;
  for (int i = 7; i >= 0; i--)
    n = (n << 8) | (guchar)contents[i];
  g_assert_cmpuint((8 + n) % 8, ==, 0);
  g_assert_cmpuint(size, ==, 8 + n + (12 + 4 + 1) * 4);
  g_assert_cmpint(contents[8], ==, '{');

  /* the generic reader agrees */
  g_autoptr(GHashTable) all = qkv_safetensors_read(path, NULL, &error);
  g_assert_no_error(error);
  g_assert_cmpuint(g_hash_table_size(all), ==, 3);
  qkv_assert_tensor_close(g_hash_table_lookup(all, "layer.bias"),
                          qkv_param_value(qkv_params_lookup(params, "layer.bias")), 0);

  /* saving again replaces the file, and leaves no temporary files */
  g_assert_true(qkv_checkpoint_save(path, params, NULL, NULL, NULL, &error));
  g_assert_cmpuint(count_files(dir), ==, 1);
  remove_tmpdir(dir);
}

static void
test_reads_torch_file(void)
{
  g_autofree gchar *path = qkv_test_data_path("torch_ref.safetensors");
  g_autoptr(GHashTable) ref = qkv_test_load_reference("torch_ref.txt");
  g_autoptr(GError) error = NULL;

  /* a model with the file's float tensors; the int buffers are unexpected */
  g_autoptr(QkvParams) params = qkv_params_new();
  const gchar *names[] = {"embedding.weight", "encoder.layers.0.linear.weight",
                          "encoder.layers.0.linear.bias", "temperature", "empty"};
  for (guint i = 0; i < G_N_ELEMENTS(names); i++)
    qkv_params_add(params, names[i], qkv_tensor_shape(qkv_test_ref(ref, names[i])), NULL);
  g_autoptr(GBytes) before = snapshot(params);
  g_assert_false(qkv_checkpoint_load(path, params, NULL, NULL, 0, NULL, NULL, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_NOT_FOUND);
  g_assert_nonnull(strstr(error->message, "'position_ids'"));
  g_assert_nonnull(strstr(error->message, "'counts'"));
  g_clear_error(&error);
  assert_unchanged(params, before);

  g_autoptr(GPtrArray) missing = NULL;
  g_autoptr(GPtrArray) unexpected = NULL;
  g_assert_true(qkv_checkpoint_load(path, params, NULL, NULL, QKV_CHECKPOINT_ALLOW_UNEXPECTED,
                                    &missing, &unexpected, &error));
  g_assert_no_error(error);
  g_assert_cmpuint(missing->len, ==, 0);
  g_assert_cmpuint(unexpected->len, ==, 2);
  for (guint i = 0; i < G_N_ELEMENTS(names); i++)
    qkv_assert_tensor_close(qkv_param_value(qkv_params_lookup(params, names[i])),
                            qkv_test_ref(ref, names[i]), 0);

  /* every tensor, I64 and I32 included, through the generic reader */
  g_autoptr(GHashTable) meta = NULL;
  g_autoptr(GHashTable) all = qkv_safetensors_read(path, &meta, &error);
  g_assert_no_error(error);
  g_assert_cmpuint(g_hash_table_size(all), ==, 7);
  GHashTableIter it;
  gpointer key, value;
  g_hash_table_iter_init(&it, all);
  while (g_hash_table_iter_next(&it, &key, &value)) {
    QkvTensor *want = qkv_test_ref(ref, key);
    g_assert_cmpint(qkv_tensor_dtype(value), ==, qkv_tensor_dtype(want));
    g_assert_true(qkv_shape_equal(qkv_tensor_shape(value), qkv_tensor_shape(want)));
    g_assert_cmpmem(qkv_tensor_const_data(value), qkv_tensor_nbytes(value),
                    qkv_tensor_const_data(want), qkv_tensor_nbytes(want));
  }
  g_assert_cmpstr(g_hash_table_lookup(meta, "source"), ==, "safetensors_ref.py");
}

static void
test_missing_and_unexpected(void)
{
  g_autofree gchar *dir = make_tmpdir();
  g_autofree gchar *path = g_build_filename(dir, "model.safetensors", NULL);
  g_autoptr(QkvParams) params = small_store(0.0f);
  g_assert_true(qkv_checkpoint_save(path, params, NULL, NULL, NULL, NULL));
  g_autoptr(GError) error = NULL;

  /* the store has a param the file lacks */
  g_autoptr(QkvParams) bigger = small_store(1.0f);
  QkvShape s = QKV_SHAPE(2);
  fill_pattern(qkv_param_value(qkv_params_add(bigger, "extra.weight", &s, NULL)), 1, 1);
  g_autoptr(GBytes) before = snapshot(bigger);
  g_assert_false(qkv_checkpoint_load(path, bigger, NULL, NULL, 0, NULL, NULL, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_NOT_FOUND);
  g_assert_nonnull(strstr(error->message, "'extra.weight'"));
  g_clear_error(&error);
  assert_unchanged(bigger, before);
  g_autoptr(GPtrArray) missing = NULL;
  g_assert_true(qkv_checkpoint_load(path, bigger, NULL, NULL, QKV_CHECKPOINT_ALLOW_MISSING,
                                    &missing, NULL, &error));
  g_assert_cmpuint(missing->len, ==, 1);
  g_assert_cmpstr(g_ptr_array_index(missing, 0), ==, "extra.weight");
  float extra_before =
      (float)qkv_tensor_get(qkv_param_value(qkv_params_lookup(bigger, "extra.weight")), 0);
  g_assert_cmpfloat(qkv_tensor_get(qkv_param_value(qkv_params_lookup(bigger, "extra.weight")), 0),
                    ==, extra_before);
  qkv_assert_tensor_close(qkv_param_value(qkv_params_lookup(bigger, "layer.weight")),
                          qkv_param_value(qkv_params_lookup(params, "layer.weight")), 0);

  /* the file has a tensor the store lacks */
  g_autoptr(QkvParams) smaller = qkv_params_new();
  QkvShape ws = QKV_SHAPE(3, 4);
  qkv_params_add(smaller, "layer.weight", &ws, NULL);
  g_autoptr(GBytes) before_small = snapshot(smaller);
  g_assert_false(qkv_checkpoint_load(path, smaller, NULL, NULL, 0, NULL, NULL, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_NOT_FOUND);
  g_assert_nonnull(strstr(error->message, "'layer.bias'"));
  g_clear_error(&error);
  assert_unchanged(smaller, before_small);
  g_autoptr(GPtrArray) unexpected = NULL;
  g_assert_true(qkv_checkpoint_load(path, smaller, NULL, NULL, QKV_CHECKPOINT_ALLOW_UNEXPECTED,
                                    NULL, &unexpected, &error));
  g_assert_cmpuint(unexpected->len, ==, 2);
  g_assert_cmpstr(g_ptr_array_index(unexpected, 0), ==, "layer.bias");
  g_assert_cmpstr(g_ptr_array_index(unexpected, 1), ==, "scale");

  /* a shape that does not fit: nothing loaded, the tensor named */
  g_autoptr(QkvParams) wrong = qkv_params_new();
  QkvShape ws2 = QKV_SHAPE(4, 3), bs = QKV_SHAPE(4), ss = qkv_shape_scalar();
  qkv_params_add(wrong, "layer.bias", &bs, NULL);
  qkv_params_add(wrong, "layer.weight", &ws2, NULL);
  qkv_params_add(wrong, "scale", &ss, NULL);
  fill_pattern(qkv_param_value(qkv_params_lookup(wrong, "layer.bias")), 3, 3);
  g_autoptr(GBytes) before_wrong = snapshot(wrong);
  g_assert_false(qkv_checkpoint_load(path, wrong, NULL, NULL,
                                     QKV_CHECKPOINT_ALLOW_MISSING | QKV_CHECKPOINT_ALLOW_UNEXPECTED,
                                     NULL, NULL, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_SHAPE);
  g_assert_nonnull(strstr(error->message, "'layer.weight'"));
  g_assert_nonnull(strstr(error->message, "(3, 4)"));
  g_assert_nonnull(strstr(error->message, "(4, 3)"));
  assert_unchanged(wrong, before_wrong);
  remove_tmpdir(dir);
}

/* ---- resume ---- */

#define BATCH 16
#define IN 8
#define HIDDEN 24
#define CLASSES 4

typedef struct {
  QkvParams *params;
  QkvGraph *graph;
  QkvValue *loss;
  QkvTensor *x, *y;
  QkvPlan *plan;
  QkvOptimizer *opt;
  QkvSchedule *schedule;
  guint clipped;
} Trainer;

/* test_resume's data: an optimizer kind, or with this bit AdamW with
 * parameter groups under a warm-up-cosine schedule. */
#define RESUME_GROUPED 0x100

/* The GPT recipe, and then some: matrices decayed (group 1), the last
 * layer's bias at half the lr without decay (group 2: layers.2.weight is a
 * matrix, so group 1 takes it first), the other biases in the default group
 * with a decay of their own. */
static void
add_trainer_groups(QkvOptimizer *opt)
{
  g_autoptr(GError) error = NULL;
  g_assert_cmpuint(
      qkv_optimizer_add_group(opt, NULL, qkv_param_filter_matrices, NULL, 1.0, 0.05, &error), ==,
      1);
  g_assert_cmpuint(qkv_optimizer_add_group(opt, "layers.2.*", NULL, NULL, 0.5, 0.0, &error), ==, 2);
  g_assert_no_error(error);
  QkvParams *params = qkv_optimizer_get_params(opt);
  g_assert_cmpuint(qkv_optimizer_group_of(opt, qkv_params_lookup(params, "layers.2.weight")), ==,
                   1);
  g_assert_cmpuint(qkv_optimizer_group_of(opt, qkv_params_lookup(params, "layers.2.bias")), ==, 2);
  g_assert_cmpuint(qkv_optimizer_group_of(opt, qkv_params_lookup(params, "layers.0.bias")), ==, 0);
}

static void
trainer_init(Trainer *t, QkvOptimizerKind kind, gboolean grouped, guint64 init_seed)
{
  g_autoptr(GError) error = NULL;
  t->params = qkv_params_new();
  t->graph = qkv_graph_new();
  const gint64 sizes[] = {IN, HIDDEN, HIDDEN, CLASSES};
  QkvShape xs = QKV_SHAPE(BATCH, IN), ys = QKV_SHAPE(BATCH);
  QkvValue *h = qkv_graph_input(t->graph, "x", QKV_F32, &xs, &error);
  QkvValue *y = qkv_graph_input(t->graph, "y", QKV_I32, &ys, &error);
  for (gint l = 0; l < 3; l++) {
    g_autofree gchar *wn = g_strdup_printf("layers.%d.weight", l);
    g_autofree gchar *bn = g_strdup_printf("layers.%d.bias", l);
    QkvShape ws = QKV_SHAPE(sizes[l + 1], sizes[l]), bs = QKV_SHAPE(sizes[l + 1]);
    QkvParam *w = qkv_params_add(t->params, wn, &ws, &error);
    QkvParam *b = qkv_params_add(t->params, bn, &bs, &error);
    g_assert_true(qkv_init_linear(qkv_param_value(w), qkv_param_value(b),
                                  qkv_init_seed_for_name(init_seed, wn), &error));
    h = qkv_matmul(h, qkv_graph_param(t->graph, t->params, wn, NULL), FALSE, TRUE, &error);
    h = qkv_add(h, qkv_graph_param(t->graph, t->params, bn, NULL), &error);
    if (l < 2)
      h = qkv_relu(h, &error);
  }
  t->loss = qkv_cross_entropy(h, y, NULL, QKV_REDUCTION_MEAN, &error);
  g_assert_no_error(error);
  g_assert_true(qkv_graph_backward(t->graph, t->loss, &error));
  t->x = qkv_tensor_new(QKV_F32, &xs);
  t->y = qkv_tensor_new(QKV_I32, &ys);
  QkvPlanOptions o = qkv_plan_options_default();
  o.training = TRUE;
  o.n_threads = 2;
  t->plan = qkv_graph_compile(t->graph, &t->loss, 1, &o, &error);
  g_assert_no_error(error);
  g_assert_true(qkv_plan_bind(t->plan, "x", t->x, &error));
  g_assert_true(qkv_plan_bind(t->plan, "y", t->y, &error));
  QkvOptimConfig c =
      kind == QKV_OPTIMIZER_SGD ? qkv_optim_config_sgd(0.1) : qkv_optim_config_adam(0.1);
  c.momentum = 0.9;
  c.weight_decay = 1e-3;
  t->opt = qkv_optimizer_new(kind, t->params, &c, &error);
  g_assert_no_error(error);
  if (grouped) {
    add_trainer_groups(t->opt);
    t->schedule = qkv_schedule_try_new_warmup_decay(QKV_DECAY_COSINE, 3, 12, 0.1, 0.01, &error);
    g_assert_no_error(error);
    return;
  }
  t->schedule = kind == QKV_OPTIMIZER_SGD ? qkv_schedule_new_cosine(0.2, 12, 0.01)
                                          : qkv_schedule_new_warmup(0.5, HIDDEN, 4);
}

static void
trainer_clear(Trainer *t)
{
  qkv_schedule_free(t->schedule);
  qkv_optimizer_free(t->opt);
  qkv_plan_free(t->plan);
  qkv_tensor_free(t->x);
  qkv_tensor_free(t->y);
  qkv_graph_free(t->graph);
  qkv_params_free(t->params);
}

/* One training step; the batch (one of three) depends only on the step number. */
static float
trainer_step(Trainer *t)
{
  g_autoptr(GError) error = NULL;
  double lr = qkv_schedule_step(t->schedule, t->opt);
  /* a transformers-style warm-up starts at 0 */
  g_assert_cmpfloat(lr, >, qkv_schedule_get_position(t->schedule) == 1 ? -1 : 0);
  gint64 step = qkv_schedule_get_position(t->schedule);
  guint32 batch = (guint32)(step % 3);
  g_autoptr(QkvTensor) x = qkv_test_uniform(qkv_tensor_shape(t->x), 1000 + batch, -2, 2);
  g_autoptr(QkvTensor) y = qkv_test_randint(qkv_tensor_shape(t->y), 2000 + batch, 0, CLASSES);
  g_assert_true(qkv_tensor_copy_from(t->x, x, NULL));
  g_assert_true(qkv_tensor_copy_from(t->y, y, NULL));
  g_assert_true(qkv_plan_run(t->plan, &error));
  double norm = qkv_optimizer_clip_grad_norm(t->opt, 0.5, QKV_CLIP_TORCH);
  t->clipped += norm > 0.5;
  g_assert_true(qkv_optimizer_step(t->opt, &error));
  g_assert_no_error(error);
  return qkv_plan_output_scalar(t->plan, 0);
}

static void
test_resume(gconstpointer data)
{
  QkvOptimizerKind kind = GPOINTER_TO_INT(data) & ~RESUME_GROUPED;
  gboolean grouped = (GPOINTER_TO_INT(data) & RESUME_GROUPED) != 0;
  const gint N = 6, M = 7;
  g_autofree gchar *dir = make_tmpdir();
  g_autofree gchar *path = g_build_filename(dir, "train.safetensors", NULL);
  g_autoptr(GError) error = NULL;

  /* straight through */
  Trainer straight = {0};
  trainer_init(&straight, kind, grouped, 1);
  float first = 0, last = 0;
  for (gint i = 0; i < N + M; i++) {
    last = trainer_step(&straight);
    if (i == 0)
      first = last;
  }
  g_test_message("%s: loss %g -> %g over %d steps, %u clipped", qkv_optimizer_kind_name(kind),
                 first, last, N + M, straight.clipped);
  g_assert_cmpuint(straight.clipped, >, 0);
  g_assert_cmpfloat(last, <, first);

  /* N steps, save */
  Trainer before = {0};
  trainer_init(&before, kind, grouped, 1);
  for (gint i = 0; i < N; i++)
    trainer_step(&before);
  g_assert_true(
      qkv_checkpoint_save(path, before.params, before.opt, before.schedule, NULL, &error));
  g_assert_no_error(error);
  trainer_clear(&before);

  /* a fresh model (other initial values), optimizer and schedule: load, M steps */
  Trainer resumed = {0};
  trainer_init(&resumed, kind, grouped, 99);
  qkv_optimizer_set_lr(resumed.opt, 123.0);
  /* group settings come from the file too */
  for (guint g = 1; g < qkv_optimizer_get_n_groups(resumed.opt); g++)
    g_assert_true(qkv_optimizer_set_group_settings(resumed.opt, g, 3.0, 0.5, NULL));
  g_assert_true(qkv_checkpoint_load(path, resumed.params, resumed.opt, resumed.schedule, 0, NULL,
                                    NULL, &error));
  g_assert_no_error(error);
  g_assert_cmpint(qkv_optimizer_get_step(resumed.opt), ==, N);
  g_assert_cmpint(qkv_schedule_get_position(resumed.schedule), ==, N);
  for (gint i = 0; i < M; i++)
    trainer_step(&resumed);

  /* bit for bit: values, optimizer state, counters */
  g_autoptr(GBytes) a = snapshot(straight.params);
  g_autoptr(GBytes) b = snapshot(resumed.params);
  g_assert_cmpuint(g_bytes_get_size(a), ==, g_bytes_get_size(b));
  g_assert_cmpint(memcmp(g_bytes_get_data(a, NULL), g_bytes_get_data(b, NULL), g_bytes_get_size(a)),
                  ==, 0);
  g_assert_cmpint(qkv_optimizer_get_step(resumed.opt), ==, N + M);
  g_assert_cmpfloat(qkv_optimizer_get_lr(resumed.opt), ==, qkv_optimizer_get_lr(straight.opt));
  for (guint g = 0; g < qkv_optimizer_get_n_groups(straight.opt); g++) {
    g_assert_cmpfloat(qkv_optimizer_get_group_lr(resumed.opt, g), ==,
                      qkv_optimizer_get_group_lr(straight.opt, g));
    g_assert_cmpfloat(qkv_optimizer_get_group_weight_decay(resumed.opt, g), ==,
                      qkv_optimizer_get_group_weight_decay(straight.opt, g));
  }

  /* control: the weights alone (fresh optimizer state, schedule restarted)
   * do not continue the same way, so the comparison above can fail */
  Trainer weights_only = {0};
  trainer_init(&weights_only, kind, grouped, 99);
  g_assert_true(qkv_checkpoint_load(path, weights_only.params, NULL, NULL, 0, NULL, NULL, &error));
  g_assert_no_error(error);
  for (gint i = 0; i < M; i++)
    trainer_step(&weights_only);
  g_autoptr(GBytes) c = snapshot(weights_only.params);
  g_assert_false(g_bytes_equal(a, c));
  trainer_clear(&weights_only);
  trainer_clear(&straight);
  trainer_clear(&resumed);
  remove_tmpdir(dir);
}

static gboolean
accept_bias(QkvParam *param, gpointer user_data)
{
  return g_str_has_suffix(qkv_param_name(param), ".bias");
}

/* Overwrite the first occurrence of from in the file with to (same length). */
static void
patch_file(const gchar *path, const gchar *from, const gchar *to)
{
  g_assert_cmpuint(strlen(from), ==, strlen(to));
  g_autofree gchar *contents = NULL;
  gsize size = 0;
  g_assert_true(g_file_get_contents(path, &contents, &size, NULL));
  gchar *at = memmem(contents, size, from, strlen(from)); /* past the binary length */
  g_assert_nonnull(at);
  memcpy(at, to, strlen(to));
  g_assert_true(g_file_set_contents(path, contents, (gssize)size, NULL));
}

/* Loading requires the optimizer's groups to be the file's: a mismatch is an
 * error naming it, and nothing changes. */
static void
test_groups_mismatch(void)
{
  g_autofree gchar *dir = make_tmpdir();
  g_autofree gchar *path = g_build_filename(dir, "groups.safetensors", NULL);
  g_autofree gchar *plain = g_build_filename(dir, "plain.safetensors", NULL);
  g_autofree gchar *bad = g_build_filename(dir, "bad.safetensors", NULL);
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvParams) params = small_store(0.0f);
  QkvOptimConfig c = qkv_optim_config_adamw(0.1);
  g_autoptr(QkvOptimizer) opt = qkv_optimizer_new_adamw(params, &c, NULL);
  g_assert_cmpuint(qkv_optimizer_add_group(opt, "layer.*", accept_bias, NULL, 0.5, 0, NULL), ==, 1);
  g_assert_cmpuint(qkv_optimizer_add_group(opt, "scale", NULL, NULL, 2, 0.25, NULL), ==, 2);
  g_autoptr(QkvSchedule) sched = qkv_schedule_new_warmup_decay(QKV_DECAY_COSINE, 2, 10, 0.1, 0);
  qkv_schedule_step(sched, opt);
  g_assert_true(qkv_optimizer_step(opt, NULL));
  g_assert_true(qkv_checkpoint_save(path, params, opt, sched, NULL, &error));
  g_autoptr(QkvOptimizer) ungrouped = qkv_optimizer_new_adamw(params, &c, NULL);
  g_assert_true(qkv_checkpoint_save(plain, params, ungrouped, NULL, NULL, &error));
  g_assert_no_error(error);
  g_autoptr(GHashTable) meta = qkv_checkpoint_read_metadata(path, &error);
  g_assert_no_error(error);
  g_assert_cmpstr(g_hash_table_lookup(meta, "qkv.optimizer.groups"), ==, "2");
  g_assert_cmpstr(g_hash_table_lookup(meta, "qkv.optimizer.group.1.pattern"), ==, "layer.*");
  g_assert_cmpstr(g_hash_table_lookup(meta, "qkv.optimizer.group.1.filter"), ==, "true");
  g_assert_cmpstr(g_hash_table_lookup(meta, "qkv.optimizer.group.2.lr_factor"), ==, "2");
  g_assert_cmpstr(g_hash_table_lookup(meta, "qkv.optimizer.group_of.layer.bias"), ==, "1");
  g_assert_null(g_hash_table_lookup(meta, "qkv.optimizer.group_of.layer.weight"));
  g_assert_cmpstr(g_hash_table_lookup(meta, "qkv.schedule.kind"), ==, "warmup_cosine");

  struct {
    const gchar *pattern1, *pattern2;
    QkvParamFilter filter1;
    guint n;
    const gchar *says;
  } cases[] = {
      {NULL, NULL, NULL, 0, "holds 2 added parameter groups, the optimizer has 0"},
      {"layer.*", NULL, accept_bias, 1, "holds 2 added parameter groups, the optimizer has 1"},
      {"layer.b*", "scale", accept_bias, 2,
       "group 1 has pattern 'layer.*', the optimizer's has pattern 'layer.b*'"},
      {"layer.*", "scale", NULL, 2, "group 1 has a filter, the optimizer's has none"},
      /* same patterns, another filter: layer.weight changes group */
      {"layer.*", "scale", qkv_param_filter_matrices, 2,
       "parameter 'layer.weight' is in parameter group 0 there but in group 1"},
  };
  g_autoptr(QkvParams) other = small_store(1.0f);
  g_autoptr(GBytes) before = snapshot(other);
  for (guint i = 0; i < G_N_ELEMENTS(cases); i++) {
    g_autoptr(QkvOptimizer) o = qkv_optimizer_new_adamw(other, &c, NULL);
    if (cases[i].n >= 1)
      qkv_optimizer_add_group(o, cases[i].pattern1, cases[i].filter1, NULL, 1, 0, NULL);
    if (cases[i].n >= 2)
      qkv_optimizer_add_group(o, cases[i].pattern2, NULL, NULL, 1, 0, NULL);
    g_assert_false(qkv_checkpoint_load(path, other, o, NULL, 0, NULL, NULL, &error));
    g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
    if (strstr(error->message, cases[i].says) == NULL)
      g_error("case %u: '%s' does not say '%s'", i, error->message, cases[i].says);
    g_clear_error(&error);
    g_assert_cmpint(qkv_optimizer_get_step(o), ==, 0);
    assert_unchanged(other, before);
  }

  /* a file without groups into an optimizer with some */
  g_autoptr(QkvOptimizer) grouped = qkv_optimizer_new_adamw(other, &c, NULL);
  qkv_optimizer_add_group(grouped, "layer.*", accept_bias, NULL, 1, 0, NULL);
  qkv_optimizer_add_group(grouped, "scale", NULL, NULL, 1, 0, NULL);
  g_assert_false(qkv_checkpoint_load(plain, other, grouped, NULL, 0, NULL, NULL, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_assert_nonnull(strstr(error->message, "holds 0 added parameter groups, the optimizer has 2"));
  g_clear_error(&error);
  /* the schedule's kind counts too */
  g_autoptr(QkvSchedule) linear = qkv_schedule_new_warmup_decay(QKV_DECAY_LINEAR, 2, 10, 0.1, 0);
  g_assert_false(qkv_checkpoint_load(path, other, grouped, linear, 0, NULL, NULL, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_assert_nonnull(strstr(error->message, "warmup_cosine"));
  g_clear_error(&error);

  /* a file whose group data is wrong is corrupt */
  const gchar *corruptions[][3] = {
      {"\"qkv.optimizer.group_of.layer.bias\":\"1\"", "\"qkv.optimizer.group_of.layer.bias\":\"7\"",
       "is not a group from 1 to 2"},
      {"\"qkv.optimizer.group.1.lr_factor\":\"0.5\"", "\"qkv.optimizer.group.1.lr_factor\":\"-.5\"",
       "must be at least 0"},
      {"\"qkv.optimizer.group.2.filter\":\"false\"", "\"qkv.optimizer.group.2.filter\":\"frump\"",
       "is not true or false"},
  };
  for (guint i = 0; i < G_N_ELEMENTS(corruptions); i++) {
    g_autofree gchar *contents = NULL;
    gsize size = 0;
    g_assert_true(g_file_get_contents(path, &contents, &size, NULL));
    g_assert_true(g_file_set_contents(bad, contents, (gssize)size, NULL));
    patch_file(bad, corruptions[i][0], corruptions[i][1]);
    g_assert_false(qkv_checkpoint_load(bad, other, grouped, NULL, 0, NULL, NULL, &error));
    g_assert_error(error, QKV_ERROR, QKV_ERROR_CORRUPT);
    if (strstr(error->message, corruptions[i][2]) == NULL)
      g_error("corruption %u: '%s' does not say '%s'", i, error->message, corruptions[i][2]);
    g_clear_error(&error);
  }
  /* a group for a param in a file without groups */
  g_autoptr(GHashTable) user = g_hash_table_new(g_str_hash, g_str_equal);
  g_hash_table_insert(user, "xyz.optimizer.group_of.scale", "1");
  g_assert_true(qkv_checkpoint_save(bad, params, ungrouped, NULL, user, &error));
  g_assert_no_error(error);
  patch_file(bad, "xyz.optimizer.group_of", "qkv.optimizer.group_of");
  g_autoptr(QkvOptimizer) plain_opt = qkv_optimizer_new_adamw(other, &c, NULL);
  g_assert_false(qkv_checkpoint_load(bad, other, plain_opt, NULL, 0, NULL, NULL, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_CORRUPT);
  g_assert_nonnull(strstr(error->message, "names a parameter group, but the file has none"));
  g_clear_error(&error);
  assert_unchanged(other, before);

  /* the same groups: settings restored, schedule position too */
  g_assert_true(qkv_checkpoint_load(path, other, grouped, sched, 0, NULL, NULL, &error));
  g_assert_no_error(error);
  g_assert_cmpfloat(qkv_optimizer_get_group_lr_factor(grouped, 1), ==, 0.5);
  g_assert_cmpfloat(qkv_optimizer_get_group_weight_decay(grouped, 2), ==, 0.25);
  g_assert_cmpfloat(qkv_optimizer_get_group_lr_factor(grouped, 2), ==, 2);
  g_assert_cmpint(qkv_schedule_get_position(sched), ==, 1);
  remove_tmpdir(dir);
}

static void
test_optimizer_state_mismatch(void)
{
  g_autofree gchar *dir = make_tmpdir();
  g_autofree gchar *weights = g_build_filename(dir, "weights.safetensors", NULL);
  g_autofree gchar *sgd_file = g_build_filename(dir, "sgd.safetensors", NULL);
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvParams) params = small_store(0.0f);
  QkvOptimConfig c = qkv_optim_config_sgd(0.1);
  c.momentum = 0.5;
  g_autoptr(QkvOptimizer) sgd = qkv_optimizer_new_sgd(params, &c, NULL);
  g_assert_true(qkv_optimizer_step(sgd, NULL));
  g_assert_true(qkv_checkpoint_save(weights, params, NULL, NULL, NULL, &error));
  g_assert_true(qkv_checkpoint_save(sgd_file, params, sgd, NULL, NULL, &error));
  g_assert_no_error(error);

  g_autoptr(QkvParams) other = small_store(1.0f);
  QkvOptimConfig ac = qkv_optim_config_adam(0.1);
  g_autoptr(QkvOptimizer) adam = qkv_optimizer_new_adam(other, &ac, NULL);
  g_autoptr(QkvSchedule) sched = qkv_schedule_new_constant(0.1);
  g_autoptr(GBytes) before = snapshot(other);
  /* weights only: no optimizer state to restore */
  g_assert_false(qkv_checkpoint_load(weights, other, adam, NULL, 0, NULL, NULL, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_NOT_FOUND);
  g_clear_error(&error);
  /* SGD state into Adam */
  g_assert_false(qkv_checkpoint_load(sgd_file, other, adam, NULL, 0, NULL, NULL, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_assert_nonnull(strstr(error->message, "sgd"));
  g_clear_error(&error);
  /* no schedule saved */
  g_assert_false(qkv_checkpoint_load(sgd_file, other, NULL, sched, 0, NULL, NULL, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_NOT_FOUND);
  g_clear_error(&error);
  assert_unchanged(other, before);

  /* without an optimizer, optimizer state in the file is ignored */
  g_assert_true(qkv_checkpoint_load(sgd_file, other, NULL, NULL, 0, NULL, NULL, &error));
  g_assert_no_error(error);
  g_assert_cmpuint(qkv_param_n_states(qkv_params_nth(other, 0)), ==, 0);
  /* with one, the state of each loaded param becomes exactly the file's */
  g_autoptr(QkvOptimizer) sgd2 = qkv_optimizer_new_sgd(other, &c, NULL);
  qkv_param_state(qkv_params_nth(other, 0), "stale");
  g_assert_true(qkv_checkpoint_load(sgd_file, other, sgd2, NULL, 0, NULL, NULL, &error));
  g_assert_no_error(error);
  for (guint i = 0; i < qkv_params_size(other); i++) {
    QkvParam *p = qkv_params_nth(other, i);
    g_assert_cmpuint(qkv_param_n_states(p), ==, 1);
    qkv_assert_tensor_close(qkv_param_lookup_state(p, "momentum_buffer"),
                            qkv_param_lookup_state(qkv_params_nth(params, i), "momentum_buffer"),
                            0);
  }
  g_assert_cmpint(qkv_optimizer_get_step(sgd2), ==, 1);
  g_assert_cmpfloat(qkv_optimizer_get_config(sgd2)->momentum, ==, 0.5);
  remove_tmpdir(dir);
}

static void
test_reserved_names(void)
{
  g_autofree gchar *dir = make_tmpdir();
  g_autofree gchar *path = g_build_filename(dir, "x.safetensors", NULL);
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvParams) params = small_store(0.0f);
  g_autoptr(GHashTable) meta = g_hash_table_new(g_str_hash, g_str_equal);
  g_hash_table_insert(meta, "qkv.optimizer.step", "7");
  g_assert_false(qkv_checkpoint_save(path, params, NULL, NULL, meta, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_clear_error(&error);
  QkvOptimConfig c = qkv_optim_config_sgd(0.1);
  g_autoptr(QkvOptimizer) opt = qkv_optimizer_new_sgd(params, &c, NULL);
  qkv_param_state(qkv_params_nth(params, 0), "bad.name");
  g_assert_false(qkv_checkpoint_save(path, params, opt, NULL, NULL, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_clear_error(&error);
  g_autoptr(QkvParams) odd = qkv_params_new();
  QkvShape s = QKV_SHAPE(1);
  qkv_params_add(odd, "__metadata__", &s, NULL);
  g_assert_false(qkv_checkpoint_save(path, odd, NULL, NULL, NULL, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_assert_cmpuint(count_files(dir), ==, 0);
  remove_tmpdir(dir);
}

/* ---- corrupt and hostile files ---- */

typedef struct {
  const gchar *label;
  const gchar *json;    /* NULL: raw bytes below */
  gsize data_len;       /* bytes of data after the header */
  guint64 header_len;   /* G_MAXUINT64: the JSON's length */
  gint code;            /* expected QkvError */
  const gchar *needle1; /* must appear in the message */
  const gchar *needle2;
} Corrupt;

#define W_OK_ENTRY "\"layer.bias\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[48,64]}"
#define S_OK_ENTRY "\"scale\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[64,68]}"
#define CORE(w) "{\"layer.weight\":" w "," W_OK_ENTRY "," S_OK_ENTRY "}"
#define W_GOOD "{\"dtype\":\"F32\",\"shape\":[3,4],\"data_offsets\":[0,48]}"

static const Corrupt corrupt_cases[] = {
    {"good", CORE(W_GOOD), 68, G_MAXUINT64, -1, NULL, NULL},
    {"header length past the end", CORE(W_GOOD), 68, 100000, QKV_ERROR_CORRUPT, "header length",
     "byte offset 0"},
    {"huge header length", CORE(W_GOOD), 68, G_MAXUINT64 - 3, QKV_ERROR_CORRUPT, "header length",
     NULL},
    {"offsets past the end", CORE("{\"dtype\":\"F32\",\"shape\":[3,4],\"data_offsets\":[40,88]}"),
     68, G_MAXUINT64, QKV_ERROR_CORRUPT, "'layer.weight'", "byte offset"},
    {"overlapping offsets",
     "{\"layer.weight\":{\"dtype\":\"F32\",\"shape\":[3,4],\"data_offsets\":[0,48]},"
     "\"layer.bias\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[40,56]}," S_OK_ENTRY "}",
     68, G_MAXUINT64, QKV_ERROR_CORRUPT, "overlaps", "byte offset"},
    {"size not dtype x shape", CORE("{\"dtype\":\"F32\",\"shape\":[3,4],\"data_offsets\":[0,44]}"),
     68, G_MAXUINT64, QKV_ERROR_CORRUPT, "'layer.weight'", "byte offset"},
    {"end before begin", CORE("{\"dtype\":\"F32\",\"shape\":[3,4],\"data_offsets\":[48,0]}"), 68,
     G_MAXUINT64, QKV_ERROR_CORRUPT, "'layer.weight'", "byte offset"},
    {"unknown dtype", CORE("{\"dtype\":\"Q7\",\"shape\":[3,4],\"data_offsets\":[0,48]}"), 68,
     G_MAXUINT64, QKV_ERROR_CORRUPT, "'layer.weight'", "'Q7'"},
    {"unsupported dtype", CORE("{\"dtype\":\"I16\",\"shape\":[3,4],\"data_offsets\":[0,24]}"), 68,
     G_MAXUINT64, QKV_ERROR_DTYPE, "'layer.weight'", "I16"},
    {"good in BF16, F16, F64",
     "{\"layer.weight\":{\"dtype\":\"BF16\",\"shape\":[3,4],\"data_offsets\":[16,40]},"
     "\"layer.bias\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[8,16]},"
     "\"scale\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,8]}}",
     40, G_MAXUINT64, -1, NULL, NULL},
    /* the size rule holds for every dtype: 2 bytes an element in BF16 and F16 */
    {"BF16 size not dtype x shape",
     CORE("{\"dtype\":\"BF16\",\"shape\":[3,4],\"data_offsets\":[0,48]}"), 68, G_MAXUINT64,
     QKV_ERROR_CORRUPT, "BF16 (3, 4) needs 24 bytes", "byte offset"},
    {"F16 size not dtype x shape",
     CORE("{\"dtype\":\"F16\",\"shape\":[3,4],\"data_offsets\":[0,48]}"), 68, G_MAXUINT64,
     QKV_ERROR_CORRUPT, "F16 (3, 4) needs 24 bytes", "byte offset"},
    {"F64 size not dtype x shape",
     CORE("{\"dtype\":\"F64\",\"shape\":[3,4],\"data_offsets\":[0,48]}"), 68, G_MAXUINT64,
     QKV_ERROR_CORRUPT, "F64 (3, 4) needs 96 bytes", "byte offset"},
    {"BF16 shape mismatch", CORE("{\"dtype\":\"BF16\",\"shape\":[2,12],\"data_offsets\":[0,48]}"),
     68, G_MAXUINT64, QKV_ERROR_SHAPE, "'layer.weight'", "(2, 12)"},
    {"int dtype for a float param",
     CORE("{\"dtype\":\"I32\",\"shape\":[3,4],\"data_offsets\":[0,48]}"), 68, G_MAXUINT64,
     QKV_ERROR_DTYPE, "'layer.weight'", NULL},
    {"shape mismatch", CORE("{\"dtype\":\"F32\",\"shape\":[2,6],\"data_offsets\":[0,48]}"), 68,
     G_MAXUINT64, QKV_ERROR_SHAPE, "'layer.weight'", "(2, 6)"},
    {"overflowing shape",
     CORE("{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],\"data_offsets\":[0,48]}"), 68,
     G_MAXUINT64, QKV_ERROR_CORRUPT, "'layer.weight'", NULL},
    {"negative dim", CORE("{\"dtype\":\"F32\",\"shape\":[-3,-4],\"data_offsets\":[0,48]}"), 68,
     G_MAXUINT64, QKV_ERROR_CORRUPT, "'layer.weight'", "shape"},
    {"rank 7", CORE("{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,12],\"data_offsets\":[0,48]}"), 68,
     G_MAXUINT64, QKV_ERROR_CORRUPT, "'layer.weight'", "rank"},
    {"float offsets", CORE("{\"dtype\":\"F32\",\"shape\":[3,4],\"data_offsets\":[0.0,48]}"), 68,
     G_MAXUINT64, QKV_ERROR_CORRUPT, "'layer.weight'", "data_offsets"},
    {"missing field", CORE("{\"dtype\":\"F32\",\"data_offsets\":[0,48]}"), 68, G_MAXUINT64,
     QKV_ERROR_CORRUPT, "'layer.weight'", "shape"},
    {"entry not an object", CORE("[1,2,3]"), 68, G_MAXUINT64, QKV_ERROR_CORRUPT, "'layer.weight'",
     NULL},
    {"invalid JSON", "{\"layer.weight\":{\"dtype\":\"F32\",", 68, G_MAXUINT64, QKV_ERROR_CORRUPT,
     "JSON", NULL},
    {"JSON array", "[1, 2, 3]", 68, G_MAXUINT64, QKV_ERROR_CORRUPT, "JSON object", NULL},
    {"empty header", "", 68, G_MAXUINT64, QKV_ERROR_CORRUPT, "JSON object", NULL},
    /* the NUL ends the C string: the 9-byte header runs into the data, whose
     * first byte is 0 too */
    {"NUL in header", "{\"a\0\":1}", 68, 9, QKV_ERROR_CORRUPT, "UTF-8", "byte offset"},
    {"non-string metadata", "{\"__metadata__\":{\"epoch\":3}," W_OK_ENTRY "}", 68, G_MAXUINT64,
     QKV_ERROR_CORRUPT, "'epoch'", NULL},
    /* json-glib keeps the last of two equal names; qkv refuses the file */
    {"duplicate name",
     "{\"scale\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}," S_OK_ENTRY "}", 68,
     G_MAXUINT64, QKV_ERROR_CORRUPT, "repeats a key", NULL},
    {"duplicate metadata key",
     "{\"__metadata__\":{\"a\":\"1\",\"a\":\"2\"},\"layer.weight\":" W_GOOD "," W_OK_ENTRY
     "," S_OK_ENTRY "}",
     68, G_MAXUINT64, QKV_ERROR_CORRUPT, "repeats a key", NULL},
    {"two JSON values", CORE(W_GOOD) "{}", 68, G_MAXUINT64, QKV_ERROR_CORRUPT, "follows",
     "byte offset"},
    {"escaped NUL in a name",
     "{\"layer.weight\":" W_GOOD ",\"layer.bias\\u0000evil\":{\"dtype\":\"F32\",\"shape\":[4],"
     "\"data_offsets\":[48,64]}," S_OK_ENTRY "}",
     68, G_MAXUINT64, QKV_ERROR_CORRUPT, "NUL", "byte offset"},
    {"escaped lone surrogate in a name",
     "{\"layer.weight\":" W_GOOD ",\"layer.bias\\ud800\":{\"dtype\":\"F32\",\"shape\":[4],"
     "\"data_offsets\":[48,64]}," S_OK_ENTRY "}",
     68, G_MAXUINT64, QKV_ERROR_CORRUPT, NULL, NULL},
    /* as in the reference implementation, tensors tile the data exactly */
    {"gap between tensors",
     "{\"layer.weight\":" W_GOOD ",\"layer.bias\":{\"dtype\":\"F32\",\"shape\":[4],"
     "\"data_offsets\":[56,72]},\"scale\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[48,"
     "52]}}",
     72, G_MAXUINT64, QKV_ERROR_CORRUPT, "gap of 4", "byte offset"},
    {"gap at the start",
     "{\"layer.weight\":{\"dtype\":\"F32\",\"shape\":[3,4],\"data_offsets\":[4,52]},"
     "\"layer.bias\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[52,68]},"
     "\"scale\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[68,72]}}",
     72, G_MAXUINT64, QKV_ERROR_CORRUPT, "gap of 4", "'layer.weight'"},
    {"trailing bytes", CORE(W_GOOD), 69, G_MAXUINT64, QKV_ERROR_CORRUPT, "1 trailing byte",
     "byte offset"},
};

static void
test_corrupt_files(void)
{
  g_autofree gchar *dir = make_tmpdir();
  g_autofree gchar *good = g_build_filename(dir, "good.safetensors", NULL);
  g_autofree gchar *bad = g_build_filename(dir, "bad.safetensors", NULL);
  g_autoptr(QkvParams) params = small_store(0.0f);
  g_assert_true(qkv_checkpoint_save(good, params, NULL, NULL, NULL, NULL));
  g_autoptr(QkvParams) store = small_store(3.0f);
  g_autoptr(GBytes) before = snapshot(store);
  guint8 data[128];
  for (guint i = 0; i < sizeof data; i++)
    data[i] = (guint8)(i * 7);

  for (guint c = 0; c < G_N_ELEMENTS(corrupt_cases); c++) {
    const Corrupt *k = &corrupt_cases[c];
    write_raw(bad, k->json, data, k->data_len, k->header_len);
    g_autoptr(GError) error = NULL;
    gboolean ok = qkv_checkpoint_load(bad, store, NULL, NULL, 0, NULL, NULL, &error);
    if (k->code < 0) {
      g_assert_no_error(error);
      g_assert_true(ok);
      g_assert_true(qkv_checkpoint_load(good, store, NULL, NULL, 0, NULL, NULL, &error));
      g_bytes_unref(before);
      before = snapshot(store);
      continue;
    }
    g_test_message("%s: %s", k->label, error ? error->message : "(no error)");
    if (ok || error == NULL)
      g_error("%s: loaded without an error", k->label);
    g_assert_error(error, QKV_ERROR, k->code);
    if (k->needle1 != NULL && strstr(error->message, k->needle1) == NULL)
      g_error("%s: '%s' not in \"%s\"", k->label, k->needle1, error->message);
    if (k->needle2 != NULL && strstr(error->message, k->needle2) == NULL)
      g_error("%s: '%s' not in \"%s\"", k->label, k->needle2, error->message);
    assert_unchanged(store, before);
    /* the generic reader refuses it too (shape and dtype fit aside) */
    if (k->code == QKV_ERROR_CORRUPT) {
      g_autoptr(GError) e2 = NULL;
      g_assert_null(qkv_safetensors_read(bad, NULL, &e2));
      g_assert_error(e2, QKV_ERROR, QKV_ERROR_CORRUPT);
    }
  }

  /* truncations of a real file, at every length */
  g_autofree gchar *contents = NULL;
  gsize size = 0;
  g_assert_true(g_file_get_contents(good, &contents, &size, NULL));
  for (gsize cut = 0; cut < size; cut++) {
    g_assert_true(g_file_set_contents(bad, contents, cut, NULL));
    g_autoptr(GError) error = NULL;
    g_assert_false(qkv_checkpoint_load(bad, store, NULL, NULL, 0, NULL, NULL, &error));
    g_assert_error(error, QKV_ERROR, QKV_ERROR_CORRUPT);
    if (cut == size - 1)
      g_test_message("truncated by one byte: %s", error->message);
    assert_unchanged(store, before);
  }
  /* a file that does not exist, and a directory */
  g_autoptr(GError) error = NULL;
  g_autofree gchar *nowhere = g_build_filename(dir, "nope.safetensors", NULL);
  g_assert_false(qkv_checkpoint_load(nowhere, store, NULL, NULL, 0, NULL, NULL, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_IO);
  g_clear_error(&error);
  g_assert_false(qkv_checkpoint_load(dir, store, NULL, NULL, 0, NULL, NULL, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_IO);
  g_clear_error(&error);
  assert_unchanged(store, before);

  /* random damage: never a crash; either a clean load or an error and no change */
  GRand *rand = g_rand_new_with_seed(5);
  guint loaded = 0;
  for (guint trial = 0; trial < 3000; trial++) {
    g_autofree gchar *copy = g_memdup2(contents, size);
    guint flips = 1 + g_rand_int_range(rand, 0, 4);
    for (guint f = 0; f < flips; f++) {
      /* mostly in the header, where the structure is */
      gsize at = g_rand_int_range(rand, 0, 10) < 8
                     ? (gsize)g_rand_int_range(rand, 0, (gint32)MIN(size, 200))
                     : (gsize)g_rand_int_range(rand, 0, (gint32)size);
      copy[at] = (gchar)g_rand_int_range(rand, 0, 256);
    }
    g_assert_true(g_file_set_contents(bad, copy, size, NULL));
    g_autoptr(QkvParams) victim = small_store(3.0f);
    g_autoptr(GBytes) victim_before = snapshot(victim);
    g_autoptr(GError) e = NULL;
    if (qkv_checkpoint_load(bad, victim, NULL, NULL, 0, NULL, NULL, &e)) {
      loaded++;
    } else {
      g_assert_nonnull(e);
      assert_unchanged(victim, victim_before);
    }
  }
  g_rand_free(rand);
  g_test_message("random damage: %u of 3000 still loaded (data bytes hit)", loaded);

  /* the good file still loads */
  g_assert_true(qkv_checkpoint_load(good, store, NULL, NULL, 0, NULL, NULL, &error));
  g_assert_no_error(error);
  remove_tmpdir(dir);
}

static void
test_corrupt_optimizer_state(void)
{
  g_autofree gchar *dir = make_tmpdir();
  g_autofree gchar *path = g_build_filename(dir, "opt.safetensors", NULL);
  g_autoptr(GError) error = NULL;
  QkvShape ws = QKV_SHAPE(2);
  g_autoptr(QkvParams) params = qkv_params_new();
  fill_pattern(qkv_param_value(qkv_params_add(params, "w", &ws, NULL)), 1, 0);
  QkvOptimConfig c = qkv_optim_config_adam(0.1);
  g_autoptr(QkvOptimizer) opt = qkv_optimizer_new_adam(params, &c, NULL);
  g_autoptr(GBytes) before = snapshot(params);
  const gchar *meta_ok =
      "\"__metadata__\":{\"qkv.optimizer.kind\":\"adam\",\"qkv.optimizer.step\":\"%s\","
      "\"qkv.optimizer.lr\":\"0.1\",\"qkv.optimizer.weight_decay\":\"0\","
      "\"qkv.optimizer.momentum\":\"0\",\"qkv.optimizer.dampening\":\"0\","
      "\"qkv.optimizer.nesterov\":\"false\",\"qkv.optimizer.beta1\":\"%s\","
      "\"qkv.optimizer.beta2\":\"0.999\",\"qkv.optimizer.eps\":\"1e-8\"}";
  struct {
    const gchar *step, *beta1, *state_entry;
    gint code;
    const gchar *needle;
  } cases[] = {
      {"1", "0.9",
       "\"__optim__.w.exp_avg\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}", -1,
       NULL},
      {"1", "0.9",
       "\"__optim__.w.exp_avg\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}", -1,
       NULL}, /* again, into the state the first load created */
      {"-4", "0.9",
       "\"__optim__.w.exp_avg\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}",
       QKV_ERROR_CORRUPT, "qkv.optimizer.step"},
      {"1", "1.5",
       "\"__optim__.w.exp_avg\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}",
       QKV_ERROR_CORRUPT, "beta1"},
      {"1", "0.9",
       "\"__optim__.w.exp_avg\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}",
       QKV_ERROR_SHAPE, "'__optim__.w.exp_avg'"},
      {"1", "0.9",
       "\"__optim__.nope.exp_avg\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}",
       QKV_ERROR_NOT_FOUND, "'__optim__.nope.exp_avg'"},
      {"1", "0.9", "\"__optim__.w.step\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[8,16]}",
       QKV_ERROR_DTYPE, "does not fit"},
      /* into the F32 state the first load created */
      {"1", "0.9",
       "\"__optim__.w.exp_avg\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[8,12]}", -1,
       NULL},
      {"1", "0.9",
       "\"__optim__.w.exp_avg\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[8,16]}",
       QKV_ERROR_SHAPE, "'__optim__.w.exp_avg'"},
  };
  guint8 data[16] = {0, 0, 128, 63, 0, 0, 0, 64, 255, 255, 255, 255, 255, 255, 255, 127};
  g_autofree gchar *bad = g_build_filename(dir, "bad.safetensors", NULL);
  for (guint i = 0; i < G_N_ELEMENTS(cases); i++) {
    g_autofree gchar *meta = g_strdup_printf(meta_ok, cases[i].step, cases[i].beta1);
    g_autofree gchar *json =
        g_strdup_printf("{%s,\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},%s}",
                        meta, cases[i].state_entry);
    /* the data section ends where the state tensor ends */
    gsize len = strstr(cases[i].state_entry, "[8,12]") != NULL ? 12 : 16;
    write_raw(bad, json, data, len, G_MAXUINT64);
    gboolean ok = qkv_checkpoint_load(bad, params, opt, NULL, 0, NULL, NULL, &error);
    if (cases[i].code < 0) {
      g_assert_no_error(error);
      g_assert_true(ok);
      g_assert_cmpfloat(qkv_tensor_get(qkv_param_value(qkv_params_lookup(params, "w")), 1), ==,
                        2.0);
      g_bytes_unref(before);
      before = snapshot(params);
      continue;
    }
    g_test_message("%s", error ? error->message : "(none)");
    g_assert_false(ok);
    g_assert_error(error, QKV_ERROR, cases[i].code);
    g_assert_nonnull(strstr(error->message, cases[i].needle));
    g_clear_error(&error);
    assert_unchanged(params, before);
    g_assert_cmpint(qkv_optimizer_get_step(opt), ==, 1);
  }
  remove_tmpdir(dir);
}

/* A header nested a million levels deep (json-glib would recurse until the
 * stack overflows) and optimizer state of the wrong shape for a fresh
 * optimizer, which has no state of its own to compare with. */
static void
test_hostile_headers(void)
{
  g_autofree gchar *dir = make_tmpdir();
  g_autofree gchar *bad = g_build_filename(dir, "bad.safetensors", NULL);
  g_autoptr(GError) error = NULL;
  QkvShape ws = QKV_SHAPE(2);
  g_autoptr(QkvParams) params = qkv_params_new();
  fill_pattern(qkv_param_value(qkv_params_add(params, "w", &ws, NULL)), 1, 0);
  g_autoptr(GBytes) before = snapshot(params);

  const gsize depth = 1000000;
  GString *json = g_string_new("{\"a\":");
  for (gsize i = 0; i < depth; i++)
    g_string_append_c(json, '[');
  for (gsize i = 0; i < depth; i++)
    g_string_append_c(json, ']');
  g_string_append_c(json, '}');
  write_raw(bad, json->str, NULL, 0, G_MAXUINT64);
  g_string_free(json, TRUE);
  g_assert_false(qkv_checkpoint_load(bad, params, NULL, NULL, 0, NULL, NULL, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_CORRUPT);
  g_assert_nonnull(strstr(error->message, "nests deeper"));
  g_clear_error(&error);
  assert_unchanged(params, before);

  const gchar *states[] = {
      "\"__optim__.w.exp_avg\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}",
      "\"__optim__.w.step\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[8,12]}",
      /* the half dtypes are f32 states' and no step count's */
      "\"__optim__.w.exp_avg\":{\"dtype\":\"BF16\",\"shape\":[1,2],\"data_offsets\":[8,12]}",
      "\"__optim__.w.step\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[8,12]}",
  };
  guint8 data[12] = {0, 0, 128, 63, 0, 0, 0, 64, 0, 0, 128, 63};
  for (guint i = 0; i < G_N_ELEMENTS(states); i++) {
    QkvOptimConfig c = qkv_optim_config_adam(0.1);
    g_autoptr(QkvOptimizer) fresh = qkv_optimizer_new_adam(params, &c, NULL);
    g_autofree gchar *header = g_strdup_printf(
        "{\"__metadata__\":{\"qkv.optimizer.kind\":\"adam\",\"qkv.optimizer.step\":\"1\"},"
        "\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},%s}",
        states[i]);
    write_raw(bad, header, data, sizeof data, G_MAXUINT64);
    g_assert_false(qkv_checkpoint_load(bad, params, fresh, NULL, 0, NULL, NULL, &error));
    g_test_message("%s", error->message);
    g_assert_error(error, QKV_ERROR, QKV_ERROR_SHAPE);
    g_assert_nonnull(strstr(error->message, "optimizer state"));
    g_clear_error(&error);
    assert_unchanged(params, before);
    g_assert_null(qkv_param_lookup_state(qkv_params_lookup(params, "w"), "exp_avg"));
  }
  remove_tmpdir(dir);
}

/* ---- failed saves ---- */

static void
test_save_failures(void)
{
  g_autofree gchar *dir = make_tmpdir();
  g_autofree gchar *path = g_build_filename(dir, "model.safetensors", NULL);
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvParams) params = small_store(0.0f);
  g_assert_true(qkv_checkpoint_save(path, params, NULL, NULL, NULL, &error));
  g_autoptr(GBytes) saved = snapshot(params);

  /* a "directory" that is a regular file: unwritable even for root */
  g_autofree gchar *under_file = g_build_filename(path, "x.safetensors", NULL);
  g_assert_false(qkv_checkpoint_save(under_file, params, NULL, NULL, NULL, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_IO);
  g_test_message("%s", error->message);
  g_clear_error(&error);
  g_assert_false(
      qkv_checkpoint_save("/proc/qkv-no-such-dir/x.safetensors", params, NULL, NULL, NULL, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_IO);
  g_clear_error(&error);

  /* a full disk, by a file size limit: the write fails half way, the old file stays */
  g_autoptr(QkvParams) big = small_store(1.0f);
  QkvShape s = QKV_SHAPE(64, 1024);
  fill_pattern(qkv_param_value(qkv_params_add(big, "big", &s, NULL)), 1, 0);
  struct rlimit old_limit, limit;
  g_assert_cmpint(getrlimit(RLIMIT_FSIZE, &old_limit), ==, 0);
  void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);
  limit = old_limit;
  limit.rlim_cur = 4096;
  g_assert_cmpint(setrlimit(RLIMIT_FSIZE, &limit), ==, 0);
  gboolean ok = qkv_checkpoint_save(path, big, NULL, NULL, NULL, &error);
  g_assert_cmpint(setrlimit(RLIMIT_FSIZE, &old_limit), ==, 0);
  signal(SIGXFSZ, old_handler);
  g_assert_false(ok);
  g_assert_error(error, QKV_ERROR, QKV_ERROR_IO);
  g_test_message("%s", error->message);
  g_clear_error(&error);
  /* no temporary file left behind, and the previous checkpoint is intact */
  g_assert_cmpuint(count_files(dir), ==, 1);
  g_autoptr(QkvParams) fresh = small_store(5.0f);
  g_assert_true(qkv_checkpoint_load(path, fresh, NULL, NULL, 0, NULL, NULL, &error));
  g_assert_no_error(error);
  assert_unchanged(fresh, saved);
  remove_tmpdir(dir);
}

/* Per-param Adam step counts out of range: a negative count once loaded and
 * turned every value into NaN at the next step; G_MAXINT32 overflowed the
 * i32 counter at the next step. */
static void
test_step_state_range(void)
{
  g_autofree gchar *dir = make_tmpdir();
  g_autofree gchar *bad = g_build_filename(dir, "step.safetensors", NULL);
  QkvShape ws = QKV_SHAPE(2);
  g_autoptr(QkvParams) params = qkv_params_new();
  fill_pattern(qkv_param_value(qkv_params_add(params, "w", &ws, NULL)), 1, 0);
  QkvOptimConfig c = qkv_optim_config_adam(0.1);
  g_autoptr(QkvOptimizer) opt = qkv_optimizer_new_adam(params, &c, NULL);
  g_autoptr(GBytes) before = snapshot(params);
  /* loads: accepted; steps: the next optimizer step succeeds (a count of
   * G_MAXINT32 loads, as a store that reached it must save and load back,
   * but cannot advance) */
  const struct {
    gint64 value;
    gboolean i64, loads, steps;
  } cases[] = {
      {-1, FALSE, FALSE, FALSE},
      {-5, FALSE, FALSE, FALSE},
      {G_MININT32, FALSE, FALSE, FALSE},
      {-5, TRUE, FALSE, FALSE},
      {G_MAXINT32 + G_GINT64_CONSTANT(1), TRUE, FALSE, FALSE},
      {7, FALSE, TRUE, TRUE},
      {G_MAXINT32 - 1, TRUE, TRUE, TRUE},
      {G_MAXINT32, FALSE, TRUE, FALSE},
  };
  for (guint i = 0; i < G_N_ELEMENTS(cases); i++) {
    guint8 data[16] = {0, 0, 128, 63, 0, 0, 0, 64};
    guint64 u = (guint64)cases[i].value;
    for (int b = 0; b < 8; b++)
      data[8 + b] = (guint8)(u >> (8 * b));
    g_autofree gchar *json = g_strdup_printf(
        "{\"__metadata__\":{\"qkv.optimizer.kind\":\"adam\",\"qkv.optimizer.step\":\"3\","
        "\"qkv.optimizer.lr\":\"0.1\",\"qkv.optimizer.weight_decay\":\"0\","
        "\"qkv.optimizer.momentum\":\"0\",\"qkv.optimizer.dampening\":\"0\","
        "\"qkv.optimizer.nesterov\":\"false\",\"qkv.optimizer.beta1\":\"0.9\","
        "\"qkv.optimizer.beta2\":\"0.999\",\"qkv.optimizer.eps\":\"1e-8\"},"
        "\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
        "\"__optim__.w.step\":{\"dtype\":\"%s\",\"shape\":[],\"data_offsets\":[8,%d]}}",
        cases[i].i64 ? "I64" : "I32", cases[i].i64 ? 16 : 12);
    write_raw(bad, json, data, cases[i].i64 ? 16 : 12, G_MAXUINT64);
    g_autoptr(GError) error = NULL;
    gboolean ok = qkv_checkpoint_load(bad, params, opt, NULL, 0, NULL, NULL, &error);
    g_test_message("%" G_GINT64_FORMAT " (%s): %s", cases[i].value, cases[i].i64 ? "I64" : "I32",
                   error ? error->message : "loaded");
    if (cases[i].loads) {
      g_assert_no_error(error);
      g_assert_true(ok);
      /* and the next step is finite, or refused without overflowing */
      qkv_tensor_fill(qkv_param_grad(qkv_params_lookup(params, "w")), 0.25);
      g_autoptr(GBytes) loaded = snapshot(params);
      gboolean stepped = qkv_optimizer_step(opt, &error);
      g_test_message("step: %s", error ? error->message : "ok");
      g_assert_cmpint(stepped, ==, cases[i].steps);
      if (!stepped) {
        g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
        assert_unchanged(params, loaded);
        continue;
      }
      g_assert_no_error(error);
      QkvTensor *v = qkv_param_value(qkv_params_lookup(params, "w"));
      g_assert_true(isfinite(qkv_tensor_get(v, 0)) && isfinite(qkv_tensor_get(v, 1)));
      continue;
    }
    g_assert_false(ok);
    g_assert_nonnull(error);
    g_assert_true(error->code == QKV_ERROR_CORRUPT || error->code == QKV_ERROR_DTYPE);
    g_assert_nonnull(strstr(error->message, "step"));
    assert_unchanged(params, before);
  }
  remove_tmpdir(dir);
}

/* A name that is not UTF-8 used to be written as is, into a file that no
 * reader accepts; the save refuses it and leaves no file. */
static void
test_save_refuses_bad_names(void)
{
  g_autofree gchar *dir = make_tmpdir();
  g_autofree gchar *path = g_build_filename(dir, "names.safetensors", NULL);
  g_autoptr(GError) error = NULL;
  QkvShape s = QKV_SHAPE(2);
  g_autoptr(QkvParams) params = qkv_params_new();
  g_assert_nonnull(qkv_params_add(params, "bad\xff.weight", &s, NULL));
  g_assert_false(qkv_checkpoint_save(path, params, NULL, NULL, NULL, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_assert_nonnull(strstr(error->message, "UTF-8"));
  g_test_message("%s", error->message);
  g_clear_error(&error);
  g_assert_cmpuint(count_files(dir), ==, 0);

  /* a state name that is not UTF-8, with the optimizer's state */
  g_autoptr(QkvParams) p2 = qkv_params_new();
  QkvParam *w = qkv_params_add(p2, "w", &s, NULL);
  qkv_param_state(w, "exp\xc3");
  QkvOptimConfig c = qkv_optim_config_adam(0.1);
  g_autoptr(QkvOptimizer) opt = qkv_optimizer_new_adam(p2, &c, NULL);
  g_assert_false(qkv_checkpoint_save(path, p2, opt, NULL, NULL, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT);
  g_assert_nonnull(strstr(error->message, "UTF-8"));
  g_clear_error(&error);
  g_assert_cmpuint(count_files(dir), ==, 0);
  remove_tmpdir(dir);
}

/* What killed saves leave behind: ".NAME.tmp-XXXXXX". The next successful
 * save of NAME removes the stale ones, and nothing else. */
static void
test_stale_temporaries(void)
{
  g_autofree gchar *dir = make_tmpdir();
  g_autofree gchar *path = g_build_filename(dir, "model.safetensors", NULL);
  g_autoptr(QkvParams) params = small_store(0.0f);
  const struct {
    const gchar *name;
    gboolean old, locked, removed;
  } files[] = {
      {".model.safetensors.tmp-a1B2c3", TRUE, FALSE, TRUE},
      {".model.safetensors.tmp-ZZZZZZ", TRUE, FALSE, TRUE},
      /* fresh: may be another save in progress */
      {".model.safetensors.tmp-fresh1", FALSE, FALSE, FALSE},
      /* old but locked: a live writer that has not written for a while */
      {".model.safetensors.tmp-lockd1", TRUE, TRUE, FALSE},
      /* not exactly the pattern, or another target */
      {".model.safetensors.tmp-a1B2c3x", TRUE, FALSE, FALSE},
      {".model.safetensors.tmp-a1B2", TRUE, FALSE, FALSE},
      {"model.safetensors.tmp-a1B2c3", TRUE, FALSE, FALSE},
      {".other.safetensors.tmp-a1B2c3", TRUE, FALSE, FALSE},
      {".model.safetensors.tmp-a.B2c3", TRUE, FALSE, FALSE},
  };
  int lock_fd = -1;
  for (guint i = 0; i < G_N_ELEMENTS(files); i++) {
    g_autofree gchar *p = g_build_filename(dir, files[i].name, NULL);
    g_assert_true(g_file_set_contents(p, "partial", 7, NULL));
    if (files[i].old) {
      struct utimbuf t = {time(NULL) - 3600, time(NULL) - 3600};
      g_assert_cmpint(g_utime(p, &t), ==, 0);
    }
    if (files[i].locked) {
      lock_fd = open(p, O_RDONLY);
      g_assert_cmpint(flock(lock_fd, LOCK_EX), ==, 0);
    }
  }
  g_autoptr(GError) error = NULL;
  g_assert_true(qkv_checkpoint_save(path, params, NULL, NULL, NULL, &error));
  g_assert_no_error(error);
  for (guint i = 0; i < G_N_ELEMENTS(files); i++) {
    g_autofree gchar *p = g_build_filename(dir, files[i].name, NULL);
    if (files[i].removed == g_file_test(p, G_FILE_TEST_EXISTS))
      g_error("%s: %s", files[i].name, files[i].removed ? "not removed" : "removed");
  }
  g_assert_cmpuint(count_files(dir), ==, 1 + G_N_ELEMENTS(files) - 2);
  close(lock_fd);
  remove_tmpdir(dir);
}

/* ---- half precision and F64 ---- */

/* A one-tensor file: name, dtype, shape (n), data. */
static void
write_one(const gchar *path, const gchar *name, const gchar *dtype, gsize n, const void *data,
          gsize data_len)
{
  g_autofree gchar *json = g_strdup_printf("{\"%s\":{\"dtype\":\"%s\",\"shape\":[%" G_GSIZE_FORMAT
                                           "],\"data_offsets\":[0,%" G_GSIZE_FORMAT "]}}",
                                           name, dtype, n, data_len);
  write_raw(path, json, data, data_len, G_MAXUINT64);
}

static guint32
f32_bits(float x)
{
  guint32 u;
  memcpy(&u, &x, 4);
  return u;
}

/* Every element of t has exactly the bits of want. */
static void
assert_bits(const QkvTensor *t, const guint32 *want, gsize n, const gchar *what)
{
  g_assert_cmpint(qkv_tensor_dtype(t), ==, QKV_F32);
  g_assert_cmpint(qkv_tensor_numel(t), ==, (gint64)n);
  const float *got = qkv_tensor_const_data(t);
  for (gsize i = 0; i < n; i++)
    if (f32_bits(got[i]) != want[i])
      g_error("%s[%" G_GSIZE_FORMAT "]: 0x%08x, expected 0x%08x", what, i, f32_bits(got[i]),
              want[i]);
}

/* 16-bit patterns, little-endian. */
static void
pack_le16(guint8 *out, const guint16 *v, gsize n)
{
  for (gsize i = 0; i < n; i++) {
    out[2 * i] = (guint8)v[i];
    out[2 * i + 1] = (guint8)(v[i] >> 8);
  }
}

/* Loads path's "h" into a store holding just "h" (n), through both
 * readers, and checks the bits. */
static void
assert_loads_bits(const gchar *path, const guint32 *want, gsize n, const gchar *what)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvParams) params = qkv_params_new();
  QkvShape s = QKV_SHAPE((gint64)n);
  fill_pattern(qkv_param_value(qkv_params_add(params, "h", &s, NULL)), 1, 7);
  g_assert_true(qkv_checkpoint_load(path, params, NULL, NULL, 0, NULL, NULL, &error));
  g_assert_no_error(error);
  assert_bits(qkv_param_value(qkv_params_lookup(params, "h")), want, n, what);
  g_autoptr(GHashTable) all = qkv_safetensors_read(path, NULL, &error);
  g_assert_no_error(error);
  assert_bits(g_hash_table_lookup(all, "h"), want, n, what);
}

/* BF16 and F16 load exactly: subnormals, signed zeros, infinities, NaN
 * payloads. The expected f32 bits are computed apart from qkv: BF16 by
 * shifting, F16 from a table of known values. */
static void
test_half_loads_exactly(void)
{
  g_autofree gchar *dir = make_tmpdir();
  g_autofree gchar *path = g_build_filename(dir, "half.safetensors", NULL);

  static const guint16 bf16[] = {
      0x0000, 0x8000, 0x3f80, 0xbf80, 0x4049, /* 3.140625 */
      0x0001, 0x8001, 0x007f,                 /* subnormals: min, -min, max */
      0x0080, 0x7f7f, 0xff7f,                 /* min normal, max, -max */
      0x7f80, 0xff80, 0x7fc0, 0xffc1, 0x7f81, /* +-inf, NaNs, a signalling one */
  };
  guint8 raw[2 * G_N_ELEMENTS(bf16)];
  guint32 want[G_N_ELEMENTS(bf16)];
  pack_le16(raw, bf16, G_N_ELEMENTS(bf16));
  for (gsize i = 0; i < G_N_ELEMENTS(bf16); i++)
    want[i] = (guint32)bf16[i] << 16;
  write_one(path, "h", "BF16", G_N_ELEMENTS(bf16), raw, sizeof raw);
  assert_loads_bits(path, want, G_N_ELEMENTS(bf16), "BF16");

  static const struct {
    guint16 half;
    guint32 single;
  } f16[] = {
      {0x0000, 0x00000000}, /* +0 */
      {0x8000, 0x80000000}, /* -0 */
      {0x3c00, 0x3f800000}, /* 1 */
      {0xc000, 0xc0000000}, /* -2 */
      {0x3555, 0x3eaaa000}, /* 0.333251953125 */
      {0x0001, 0x33800000}, /* 2^-24, the smallest subnormal */
      {0x8001, 0xb3800000}, /* -2^-24 */
      {0x0002, 0x34000000}, /* 2^-23 */
      {0x0003, 0x34400000}, /* 3 * 2^-24 */
      {0x0200, 0x38000000}, /* 2^-15 */
      {0x03ff, 0x387fc000}, /* 1023 * 2^-24, the largest subnormal */
      {0x0400, 0x38800000}, /* 2^-14, the smallest normal */
      {0x7bff, 0x477fe000}, /* 65504, the largest */
      {0xfbff, 0xc77fe000}, /* -65504 */
      {0x7c00, 0x7f800000}, /* inf */
      {0xfc00, 0xff800000}, /* -inf */
      {0x7e00, 0x7fc00000}, /* quiet NaN */
      {0xfe01, 0xffc02000}, /* negative quiet NaN with a payload */
      {0x7c01, 0x7f802000}, /* signalling NaN: the payload moves, nothing quiets it */
  };
  guint16 halves[G_N_ELEMENTS(f16)];
  guint32 singles[G_N_ELEMENTS(f16)];
  for (gsize i = 0; i < G_N_ELEMENTS(f16); i++) {
    halves[i] = f16[i].half;
    singles[i] = f16[i].single;
  }
  guint8 raw16[2 * G_N_ELEMENTS(f16)];
  pack_le16(raw16, halves, G_N_ELEMENTS(f16));
  write_one(path, "h", "F16", G_N_ELEMENTS(f16), raw16, sizeof raw16);
  assert_loads_bits(path, singles, G_N_ELEMENTS(f16), "F16");

  /* all 65536 F16 patterns: each loads to the value it denotes (checked
   * with floating-point arithmetic, not bits: sign * mantissa * 2^exp) */
  g_autofree guint16 *every = g_new(guint16, 65536);
  for (guint i = 0; i < 65536; i++)
    every[i] = (guint16)i;
  g_autofree guint8 *every_raw = g_malloc(2 * 65536);
  pack_le16(every_raw, every, 65536);
  write_one(path, "h", "F16", 65536, every_raw, 2 * 65536);
  g_autoptr(GHashTable) all = qkv_safetensors_read(path, NULL, NULL);
  g_assert_nonnull(all);
  const float *got = qkv_tensor_const_data(g_hash_table_lookup(all, "h"));
  for (guint i = 0; i < 65536; i++) {
    guint exp = (i >> 10) & 0x1f, mant = i & 0x3ff;
    double sign = (i & 0x8000) ? -1 : 1, want_value;
    if (exp == 0x1f) {
      g_assert_true(mant != 0 ? isnan(got[i]) : isinf(got[i]));
      g_assert_cmpint(!!signbit(got[i]), ==, !!(i & 0x8000));
      continue;
    }
    if (exp == 0)
      want_value = sign * ldexp(mant, -24);
    else
      want_value = sign * ldexp(1024 + mant, (gint)exp - 25);
    if ((double)got[i] != want_value || !!signbit(got[i]) != !!(i & 0x8000))
      g_error("F16 0x%04x loaded as %a, expected %a", i, (double)got[i], want_value);
  }
  remove_tmpdir(dir);
}

/* The fixture that tests/reference/half_ckpt_ref.py writes with Python's own
 * half-precision packing: each tensor loads to the F32 bits beside it. */
static void
test_half_reference_file(void)
{
  g_autofree gchar *path = qkv_test_data_path("half_ref.safetensors");
  g_autoptr(GError) error = NULL;
  g_autoptr(GHashTable) all = qkv_safetensors_read(path, NULL, &error);
  g_assert_no_error(error);
  const gchar *names[] = {"f16", "bf16", "f64"};
  g_autoptr(QkvParams) params = qkv_params_new();
  for (guint i = 0; i < G_N_ELEMENTS(names); i++) {
    g_autofree gchar *expected_name = g_strconcat(names[i], ".expected", NULL);
    QkvTensor *expected = g_hash_table_lookup(all, expected_name);
    g_assert_nonnull(expected);
    const float *e = qkv_tensor_const_data(expected);
    g_autofree guint32 *bits = g_new(guint32, qkv_tensor_numel(expected));
    for (gint64 k = 0; k < qkv_tensor_numel(expected); k++)
      bits[k] = f32_bits(e[k]);
    assert_bits(g_hash_table_lookup(all, names[i]), bits, (gsize)qkv_tensor_numel(expected),
                names[i]);
    qkv_params_add(params, names[i], qkv_tensor_shape(expected), NULL);
  }
  /* and into a store */
  g_assert_true(qkv_checkpoint_load(path, params, NULL, NULL, QKV_CHECKPOINT_ALLOW_UNEXPECTED, NULL,
                                    NULL, &error));
  g_assert_no_error(error);
  for (guint i = 0; i < G_N_ELEMENTS(names); i++) {
    g_autofree gchar *expected_name = g_strconcat(names[i], ".expected", NULL);
    QkvTensor *got = qkv_param_value(qkv_params_lookup(params, names[i]));
    g_assert_cmpmem(qkv_tensor_const_data(got), qkv_tensor_nbytes(got),
                    qkv_tensor_const_data(g_hash_table_lookup(all, expected_name)),
                    qkv_tensor_nbytes(got));
  }
}

/* A checkpoint with Adam state in BF16, F16, F64 and F32 and step counts in
 * I32 and I64 (tests/reference/half_ckpt_ref.py) resumes: values and states
 * load exactly (the script chose values all dtypes hold) and the optimizer
 * steps from them. */
static void
test_half_optimizer_state(void)
{
  g_autofree gchar *path = qkv_test_data_path("half_adam.safetensors");
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvParams) params = qkv_params_new();
  QkvShape shapes[] = {QKV_SHAPE(3, 4), QKV_SHAPE(4), qkv_shape_scalar(), QKV_SHAPE(5, 2)};
  const gchar *names[] = {"layer.weight", "layer.bias", "scale", "emb"};
  for (guint i = 0; i < G_N_ELEMENTS(names); i++)
    qkv_params_add(params, names[i], &shapes[i], NULL);
  QkvOptimConfig c = qkv_optim_config_adam(0.5);
  g_autoptr(QkvOptimizer) opt = qkv_optimizer_new_adam(params, &c, NULL);
  g_autoptr(QkvSchedule) sched = qkv_schedule_new_step(0.01, 10, 0.5);
  g_assert_true(qkv_checkpoint_load(path, params, opt, sched, 0, NULL, NULL, &error));
  g_assert_no_error(error);
  g_assert_cmpint(qkv_optimizer_get_step(opt), ==, 2);
  g_assert_cmpint(qkv_schedule_get_position(sched), ==, 2);
  g_assert_cmpfloat(qkv_optimizer_get_config(opt)->lr, ==, 0.01);
  for (guint i = 0; i < G_N_ELEMENTS(names); i++) {
    QkvParam *p = qkv_params_lookup(params, names[i]);
    const float *v = qkv_tensor_const_data(qkv_param_value(p));
    const float *avg = qkv_tensor_const_data(qkv_param_lookup_state(p, "exp_avg"));
    const float *sq = qkv_tensor_const_data(qkv_param_lookup_state(p, "exp_avg_sq"));
    QkvTensor *step = qkv_param_lookup_state(p, "step");
    g_assert_cmpint(qkv_tensor_dtype(step), ==, QKV_I32);
    g_assert_cmpint(qkv_tensor_i32(step)[0], ==, 2);
    for (gint64 k = 0; k < qkv_tensor_numel(qkv_param_value(p)); k++) {
      g_assert_cmpfloat(v[k], ==, (float)((k * 37 + i) % 11) / 8.0f - 0.5f);
      g_assert_cmpfloat(avg[k], ==, (float)((k + i) % 5 - 2) / 64.0f);
      g_assert_cmpfloat(sq[k], ==, (float)(k % 3 + 1) / 1024.0f);
    }
  }
  for (guint i = 0; i < G_N_ELEMENTS(names); i++)
    qkv_tensor_fill(qkv_param_grad(qkv_params_nth(params, i)), 0.25);
  qkv_schedule_step(sched, opt);
  g_assert_true(qkv_optimizer_step(opt, &error));
  g_assert_no_error(error);
  g_assert_cmpint(qkv_optimizer_get_step(opt), ==, 3);
}

/* F64 loads rounded to nearest, ties to even, overflow to infinity. */
static void
test_f64_loads_rounded(void)
{
  g_autofree gchar *dir = make_tmpdir();
  g_autofree gchar *path = g_build_filename(dir, "f64.safetensors", NULL);
  static const struct {
    double in;
    guint32 out;
  } cases[] = {
      {1.0, 0x3f800000},
      {0.1, 0x3dcccccd},
      {-2.5, 0xc0200000},
      {-0.0, 0x80000000},
      {0x1.000001p0, 0x3f800000},          /* 1 + 2^-24: a tie, to even */
      {0x1.000003p0, 0x3f800002},          /* 1 + 3 * 2^-24: a tie, to even */
      {0x1.0000011p0, 0x3f800001},         /* just past the tie */
      {16777217.0, 0x4b800000},            /* 2^24 + 1: a tie */
      {0x1p-149, 0x00000001},              /* the smallest f32 subnormal */
      {0x1p-150, 0x00000000},              /* half of it: a tie, to 0 */
      {0x1.8p-149, 0x00000002},            /* 1.5 of it: a tie, to 2 */
      {1e-50, 0x00000000},                 /* underflow */
      {-1e-50, 0x80000000},                /* to a signed zero */
      {0x1.fffffefffffffp127, 0x7f7fffff}, /* just below the overflow edge */
      {0x1.ffffffp127, 0x7f800000},        /* FLT_MAX + half an ulp: a tie, to inf */
      {1e300, 0x7f800000},
      {-1e300, 0xff800000},
      {INFINITY, 0x7f800000},
      {-INFINITY, 0xff800000},
  };
  gsize n = G_N_ELEMENTS(cases);
  g_autofree guint8 *raw = g_malloc(8 * (n + 1));
  g_autofree guint32 *want = g_new(guint32, n + 1);
  for (gsize i = 0; i <= n; i++) {
    double d = i < n ? cases[i].in : NAN;
    guint64 u;
    memcpy(&u, &d, 8);
    for (int b = 0; b < 8; b++)
      raw[8 * i + b] = (guint8)(u >> (8 * b));
    want[i] = i < n ? cases[i].out : 0;
  }
  /* everything but the NaN at the end, whose payload is the platform's */
  write_one(path, "h", "F64", n, raw, 8 * n);
  assert_loads_bits(path, want, n, "F64");
  write_one(path, "h", "F64", n + 1, raw, 8 * (n + 1));
  g_autoptr(GHashTable) all = qkv_safetensors_read(path, NULL, NULL);
  g_assert_true(isnan(qkv_tensor_get(g_hash_table_lookup(all, "h"), (gint64)n)));
  remove_tmpdir(dir);
}

/* The "dtype" and the begin offset of tensor name in a saved file's header
 * (json-glib writes it compactly, "NAME":{"dtype":"X","shape":[..],
 * "data_offsets":[b,e]}). */
static gchar *
header_entry(const gchar *contents, const gchar *name, guint64 *begin)
{
  g_autofree gchar *key = g_strdup_printf("\"%s\":{\"dtype\":\"", name);
  const gchar *at = strstr(contents + 8, key);
  g_assert_nonnull(at);
  at += strlen(key);
  gchar *dtype = g_strndup(at, strcspn(at, "\""));
  const gchar *offsets = strstr(at, "\"data_offsets\":[");
  g_assert_nonnull(offsets);
  *begin = g_ascii_strtoull(offsets + strlen("\"data_offsets\":["), NULL, 10);
  return dtype;
}

/* The states of the params of a and b are the same, bit for bit. */
static void
assert_same_states(QkvParams *a, QkvParams *b)
{
  for (guint i = 0; i < qkv_params_size(a); i++) {
    QkvParam *p = qkv_params_nth(a, i), *q = qkv_params_nth(b, i);
    g_assert_cmpuint(qkv_param_n_states(p), ==, qkv_param_n_states(q));
    for (guint s = 0; s < qkv_param_n_states(p); s++) {
      QkvTensor *t;
      const gchar *name = qkv_param_nth_state(p, s, &t);
      QkvTensor *u = qkv_param_lookup_state(q, name);
      g_assert_nonnull(u);
      g_assert_cmpint(qkv_tensor_dtype(u), ==, qkv_tensor_dtype(t));
      g_assert_cmpmem(qkv_tensor_const_data(t), qkv_tensor_nbytes(t), qkv_tensor_const_data(u),
                      qkv_tensor_nbytes(u));
    }
  }
}

/* f32 → bf16: round to nearest, ties to even, carries into the exponent,
 * overflow to infinity, NaN stays a quiet NaN of its sign. */
static void
test_save_bf16(void)
{
  g_autofree gchar *dir = make_tmpdir();
  g_autofree gchar *path = g_build_filename(dir, "bf16.safetensors", NULL);
  static const struct {
    guint32 in;
    guint16 out;
  } cases[] = {
      {0x3f800000, 0x3f80}, /* 1 */
      {0x3f808000, 0x3f80}, /* a tie, down to the even 0x3f80 */
      {0x3f818000, 0x3f82}, /* a tie, up to the even 0x3f82 */
      {0x3f808001, 0x3f81}, /* just past a tie */
      {0x3f807fff, 0x3f80}, /* just short of one */
      {0xbf818000, 0xbf82}, /* a negative tie */
      {0x3fffffff, 0x4000}, /* the carry runs into the exponent */
      {0x3fff8000, 0x4000}, /* a tie whose even neighbour is the next binade */
      {0x007fffff, 0x0080}, /* the largest f32 subnormal up to the smallest normal */
      {0x00008000, 0x0000}, /* a subnormal tie, to the even 0 */
      {0x00018000, 0x0002}, /* a subnormal tie, to the even 2 */
      {0x80000000, 0x8000}, /* -0 */
      {0x7f7f7fff, 0x7f7f}, /* short of the tie past the largest bfloat16 */
      {0x7f7f8000, 0x7f80}, /* that tie: to infinity */
      {0x7f7fffff, 0x7f80}, /* FLT_MAX: infinity */
      {0xff7fffff, 0xff80}, /* -FLT_MAX */
      {0x7f800000, 0x7f80}, /* inf */
      {0xff800000, 0xff80}, /* -inf */
  };
  static const guint32 nans[] = {0x7fc00000, 0xffc00000, 0x7f800001, 0xff812345, 0x7fbfffff};
  gsize n = G_N_ELEMENTS(cases), n_all = n + G_N_ELEMENTS(nans);
  g_autoptr(QkvParams) params = qkv_params_new();
  /* "b" has 2 elements so that 4-byte data after the 2-byte would be misaligned */
  QkvShape ws = QKV_SHAPE((gint64)n_all), bs = QKV_SHAPE(2);
  QkvTensor *w = qkv_param_value(qkv_params_add(params, "w", &ws, NULL));
  fill_pattern(qkv_param_value(qkv_params_add(params, "b", &bs, NULL)), 1, 0.25f);
  /* optimizer state first (a step would turn the NaNs' neighbours into
   * anything), then the bit patterns */
  QkvOptimConfig c = qkv_optim_config_adam(0.01);
  g_autoptr(QkvOptimizer) opt = qkv_optimizer_new_adam(params, &c, NULL);
  for (guint i = 0; i < 2; i++)
    fill_pattern(qkv_param_grad(qkv_params_nth(params, i)), 1, -0.5f);
  g_autoptr(GError) error = NULL;
  g_assert_true(qkv_optimizer_step(opt, &error));
  guint32 *wbits = qkv_tensor_data(w);
  for (gsize i = 0; i < n_all; i++)
    wbits[i] = i < n ? cases[i].in : nans[i - n];
  g_autoptr(GBytes) before = snapshot(params);
  g_assert_true(
      qkv_checkpoint_save_full(path, params, opt, NULL, NULL, QKV_CHECKPOINT_DTYPE_BF16, &error));
  g_assert_no_error(error);
  assert_unchanged(params, before); /* saving rounds the file, not the store */

  /* params in BF16, states in F32 and I32, each aligned to its size */
  g_autofree gchar *contents = NULL;
  gsize size = 0;
  g_assert_true(g_file_get_contents(path, &contents, &size, NULL));
  guint64 header_len = 0;
  for (int i = 7; i >= 0; i--)
    header_len = (header_len << 8) | (guchar)contents[i];
  g_assert_cmpuint(size, ==, 8 + header_len + 2 * (n_all + 2) + 4 * 2 * (n_all + 2) + 4 * 2);
  const gchar *entries[][2] = {
      {"w", "BF16"},
      {"b", "BF16"},
      {"__optim__.w.exp_avg", "F32"},
      {"__optim__.b.exp_avg_sq", "F32"},
      {"__optim__.b.step", "I32"},
  };
  for (guint i = 0; i < G_N_ELEMENTS(entries); i++) {
    guint64 begin = 0;
    g_autofree gchar *dtype = header_entry(contents, entries[i][0], &begin);
    g_assert_cmpstr(dtype, ==, entries[i][1]);
    g_assert_cmpuint(begin % (g_str_equal(dtype, "BF16") ? 2 : 4), ==, 0);
  }

  /* into a fresh store and optimizer: params rounded, state exact */
  g_autoptr(QkvParams) again = qkv_params_new();
  qkv_params_add(again, "w", &ws, NULL);
  qkv_params_add(again, "b", &bs, NULL);
  g_autoptr(QkvOptimizer) opt2 = qkv_optimizer_new_adam(again, &c, NULL);
  g_assert_true(qkv_checkpoint_load(path, again, opt2, NULL, 0, NULL, NULL, &error));
  g_assert_no_error(error);
  g_assert_cmpint(qkv_optimizer_get_step(opt2), ==, 1);
  const guint32 *got = qkv_tensor_const_data(qkv_param_value(qkv_params_lookup(again, "w")));
  for (gsize i = 0; i < n_all; i++) {
    guint32 in = wbits[i], out = got[i];
    if (i < n) {
      if (out != (guint32)cases[i].out << 16)
        g_error("0x%08x saved as bf16 0x%08x, expected 0x%04x", in, out, cases[i].out);
      continue;
    }
    /* a NaN: still one, quiet, same sign, low half zero (it came from bf16) */
    if ((out & 0x7f800000) != 0x7f800000 || (out & 0x007fffff) == 0 || !(out & 0x00400000) ||
        (out >> 31) != (in >> 31) || (out & 0xffff) != 0)
      g_error("NaN 0x%08x saved as 0x%08x", in, out);
  }
  assert_same_states(params, again);
  /* ordinary values: within half a bf16 ulp (2^-8 relative) */
  const float *b1 = qkv_tensor_const_data(qkv_param_value(qkv_params_lookup(params, "b")));
  const float *b2 = qkv_tensor_const_data(qkv_param_value(qkv_params_lookup(again, "b")));
  for (guint k = 0; k < 2; k++) {
    g_assert_cmpuint(f32_bits(b2[k]) & 0xffff, ==, 0);
    g_assert_cmpfloat(fabsf(b2[k] - b1[k]), <=, ldexpf(fabsf(b1[k]), -8));
  }
  remove_tmpdir(dir);
}

/* QKV_CHECKPOINT_DTYPE_F32 writes the file qkv_checkpoint_save() writes. */
static void
test_save_full_f32(void)
{
  g_autofree gchar *dir = make_tmpdir();
  g_autofree gchar *plain = g_build_filename(dir, "plain.safetensors", NULL);
  g_autofree gchar *full = g_build_filename(dir, "full.safetensors", NULL);
  g_autoptr(QkvParams) params = small_store(0.0f);
  QkvOptimConfig c = qkv_optim_config_adam(0.01);
  g_autoptr(QkvOptimizer) opt = qkv_optimizer_new_adam(params, &c, NULL);
  fill_pattern(qkv_param_grad(qkv_params_nth(params, 0)), 1, -0.5f);
  g_assert_true(qkv_optimizer_step(opt, NULL));
  g_autoptr(GError) error = NULL;
  g_assert_true(qkv_checkpoint_save(plain, params, opt, NULL, NULL, &error));
  g_assert_true(
      qkv_checkpoint_save_full(full, params, opt, NULL, NULL, QKV_CHECKPOINT_DTYPE_F32, &error));
  g_assert_no_error(error);
  g_autofree gchar *c1 = NULL, *c2 = NULL;
  gsize s1 = 0, s2 = 0;
  g_assert_true(g_file_get_contents(plain, &c1, &s1, NULL));
  g_assert_true(g_file_get_contents(full, &c2, &s2, NULL));
  g_assert_cmpmem(c1, s1, c2, s2);
  remove_tmpdir(dir);
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  g_test_add_func("/checkpoint/round-trip", test_round_trip);
  g_test_add_func("/checkpoint/reads-torch-file", test_reads_torch_file);
  g_test_add_func("/checkpoint/missing-and-unexpected", test_missing_and_unexpected);
  g_test_add_data_func("/checkpoint/resume-bit-identical/adam", GINT_TO_POINTER(QKV_OPTIMIZER_ADAM),
                       test_resume);
  g_test_add_data_func("/checkpoint/resume-bit-identical/adamw",
                       GINT_TO_POINTER(QKV_OPTIMIZER_ADAMW), test_resume);
  g_test_add_data_func("/checkpoint/resume-bit-identical/sgd", GINT_TO_POINTER(QKV_OPTIMIZER_SGD),
                       test_resume);
  g_test_add_data_func("/checkpoint/resume-bit-identical/adamw-groups-warmup-cosine",
                       GINT_TO_POINTER(QKV_OPTIMIZER_ADAMW | RESUME_GROUPED), test_resume);
  g_test_add_func("/checkpoint/optimizer-state-mismatch", test_optimizer_state_mismatch);
  g_test_add_func("/checkpoint/groups-mismatch", test_groups_mismatch);
  g_test_add_func("/checkpoint/reserved-names", test_reserved_names);
  g_test_add_func("/checkpoint/corrupt-files", test_corrupt_files);
  g_test_add_func("/checkpoint/corrupt-optimizer-state", test_corrupt_optimizer_state);
  g_test_add_func("/checkpoint/hostile-headers", test_hostile_headers);
  g_test_add_func("/checkpoint/save-failures", test_save_failures);
  g_test_add_func("/checkpoint/step-state-range", test_step_state_range);
  g_test_add_func("/checkpoint/save-refuses-bad-names", test_save_refuses_bad_names);
  g_test_add_func("/checkpoint/stale-temporaries", test_stale_temporaries);
  g_test_add_func("/checkpoint/half-loads-exactly", test_half_loads_exactly);
  g_test_add_func("/checkpoint/half-reference-file", test_half_reference_file);
  g_test_add_func("/checkpoint/half-optimizer-state", test_half_optimizer_state);
  g_test_add_func("/checkpoint/f64-loads-rounded", test_f64_loads_rounded);
  g_test_add_func("/checkpoint/save-bf16", test_save_bf16);
  g_test_add_func("/checkpoint/save-full-f32", test_save_full_f32);
  return g_test_run();
}
