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

static void
trainer_init(Trainer *t, QkvOptimizerKind kind, guint64 init_seed)
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
  g_assert_cmpfloat(lr, >, 0);
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
  QkvOptimizerKind kind = GPOINTER_TO_INT(data);
  const gint N = 6, M = 7;
  g_autofree gchar *dir = make_tmpdir();
  g_autofree gchar *path = g_build_filename(dir, "train.safetensors", NULL);
  g_autoptr(GError) error = NULL;

  /* straight through */
  Trainer straight = {0};
  trainer_init(&straight, kind, 1);
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
  trainer_init(&before, kind, 1);
  for (gint i = 0; i < N; i++)
    trainer_step(&before);
  g_assert_true(
      qkv_checkpoint_save(path, before.params, before.opt, before.schedule, NULL, &error));
  g_assert_no_error(error);
  trainer_clear(&before);

  /* a fresh model (other initial values), optimizer and schedule: load, M steps */
  Trainer resumed = {0};
  trainer_init(&resumed, kind, 99);
  qkv_optimizer_set_lr(resumed.opt, 123.0);
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

  /* control: the weights alone (fresh optimizer state, schedule restarted)
   * do not continue the same way, so the comparison above can fail */
  Trainer weights_only = {0};
  trainer_init(&weights_only, kind, 99);
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
    {"unsupported dtype", CORE("{\"dtype\":\"F16\",\"shape\":[3,4],\"data_offsets\":[0,24]}"), 68,
     G_MAXUINT64, QKV_ERROR_DTYPE, "'layer.weight'", "F16"},
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
  g_test_add_func("/checkpoint/optimizer-state-mismatch", test_optimizer_state_mismatch);
  g_test_add_func("/checkpoint/reserved-names", test_reserved_names);
  g_test_add_func("/checkpoint/corrupt-files", test_corrupt_files);
  g_test_add_func("/checkpoint/corrupt-optimizer-state", test_corrupt_optimizer_state);
  g_test_add_func("/checkpoint/hostile-headers", test_hostile_headers);
  g_test_add_func("/checkpoint/save-failures", test_save_failures);
  g_test_add_func("/checkpoint/step-state-range", test_step_state_range);
  g_test_add_func("/checkpoint/save-refuses-bad-names", test_save_refuses_bad_names);
  g_test_add_func("/checkpoint/stale-temporaries", test_stale_temporaries);
  return g_test_run();
}
