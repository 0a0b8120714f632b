/* bench-transformer.c: trains the d2l Transformer exactly as the PyTorch peer
 * (/work/shared/bench/peers/torch_transformer.py; its docstring defines the
 * model, data, loss, FLOP formula and output fields) does, and prints one JSON
 * line with the peer's fields, so the two can be compared side by side.
 *
 * Model: the book's encoder-decoder Transformer built by qkv's builders
 * (post-LN, d2l 0.17), Xavier-uniform linear weights (QkvBuilder.xavier_linear),
 * embeddings N(0, 1), LayerNorm 1/0, linear biases PyTorch's default. Data:
 * the synthetic reverse task from the splitmix64 stream started at --seed,
 * batch after batch (the same stream as the peer's gen_batch and as
 * seq2seq_data_reverse() of the seq2seq example). Loss: the book's
 * MaskedSoftmaxCELoss summed over the batch (l.sum()); backward on it, global
 * gradient-norm clipping at 1, Adam.
 *
 * One step: the batch is filled outside the timer; timed are the plan run
 * (forward + backward) and qkv_optimizer_step_clipped() (the global-norm
 * clipping and the Adam update in one pass over the parameter state). W
 * warm-up steps, then K timed steps; all train. The JSON also gives the
 * median of each part (median_run_s, median_update_s).
 *
 *   qkv-bench-transformer --config M --threads 2 --steps 30 --warmup 5
 *   mpirun -np 2 qkv-bench-transformer --config M --threads 1 --distributed
 *   qkv-bench-transformer --config S --dropout 0 --steps 200 --warmup 0 --losses \
 *       --init /work/shared/bench/peers/ref_S_seed0/init
 *
 * --distributed (under mpirun): data-parallel over the ranks with qkv-dist.h;
 * every rank draws the same global batch from the stream and trains on its
 * rows, the gradients (and the loss and token count) are summed across ranks
 * before the update, which is timed with the step. Rank 0 prints, adding
 * world_size, bytes_allreduced_per_step, median_allreduce_s (the all-reduce
 * call: packing, waiting for the other ranks, the transfer) and
 * median_transfer_s (the transfer alone, after every rank arrived),
 * median_pack_s (copying the gradients into and out of the flat buffer), and
 * comm_share (median all-reduce / median step).
 *
 * --init DIR loads the initial weights from raw little-endian float32 files
 * <name>.f32 listed in DIR/manifest.json (what torch_transformer.py
 * --dump-init writes): [{"key": NAME, "shape": [...], "file": FILE}, ...].
 */
#include <qkv/qkv.h>
#include <qkv/qkv-dist.h>
#include <qkv/qkv-optim.h>

#include <cblas.h>
#include <json-glib/json-glib.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include "../examples/common/options.h"

#include "../examples/common/program-version.h"

typedef struct {
  const gchar *name;
  gint64 d_model, ffn;
  gint heads, n_enc, n_dec;
  double dropout;
  gint batch, num_steps;
  gint64 vocab;
  double lr;
} BenchConfig;

/* torch_transformer.py's CONFIGS */
static const BenchConfig configs[] = {
    {"S", 32, 64, 4, 2, 2, 0.1, 64, 10, 200, 0.005},
    {"M", 256, 1024, 8, 2, 2, 0.1, 64, 32, 1000, 0.001},
    {"L", 512, 2048, 8, 6, 6, 0.1, 16, 64, 8000, 0.0005},
};

enum { PAD = 0, BOS = 1, EOS = 2 };

static gchar *opt_config = NULL;
static gint opt_threads = 1;
static gint opt_steps = 20;
static gint opt_warmup = 3;
static gint64 opt_seed = 0;
static double opt_dropout = -1;
static double opt_lr = -1;
static gboolean opt_losses = FALSE;
static gboolean opt_profile = FALSE;
static gchar *opt_init = NULL;
static gchar *opt_precision = NULL;
static QkvPrecision precision = QKV_PRECISION_FP32;
static gboolean opt_fp32_activations = FALSE;
static gboolean opt_distributed = FALSE;
static QkvDist *dist = NULL;

static gboolean opt_version = FALSE;
static GOptionEntry entries[] = {
    {"config", 'c', 0, G_OPTION_ARG_STRING, &opt_config, "S, M or L (required)", "NAME"},
    {"threads", 't', 0, G_OPTION_ARG_INT, &opt_threads, "Threads (default 1)", "N"},
    {"steps", 'k', 0, G_OPTION_ARG_INT, &opt_steps, "Timed steps K (default 20)", "K"},
    {"warmup", 'w', 0, G_OPTION_ARG_INT, &opt_warmup,
     "Untimed steps W before the timed ones; they train too (default 3)", "W"},
    {"seed", 's', 0, G_OPTION_ARG_INT64, &opt_seed,
     "Seed of the data stream, the initial weights and dropout (default 0)", "N"},
    {"dropout", 0, 0, G_OPTION_ARG_DOUBLE, &opt_dropout,
     "Override the config's dropout (0: deterministic)", "P"},
    {"lr", 0, 0, G_OPTION_ARG_DOUBLE, &opt_lr, "Override the config's learning rate", "LR"},
    {"profile", 0, 0, G_OPTION_ARG_NONE, &opt_profile,
     "Time every op of the timed steps and print the table to stderr", NULL},
    {"losses", 0, 0, G_OPTION_ARG_NONE, &opt_losses, "Add the per-step loss list to the JSON",
     NULL},
    {"precision", 0, 0, G_OPTION_ARG_STRING, &opt_precision,
     "Matrix products in fp32 (default) or bf16 (operands rounded to bfloat16, float32 sums, as "
     "PyTorch's autocast; the peer's --autocast bf16)",
     "fp32|bf16"},
    {"fp32-activations", 0, 0, G_OPTION_ARG_NONE, &opt_fp32_activations,
     "With bf16: keep every activation in float32 (the default stores those that only feed "
     "products as bfloat16: the same numbers in less memory)",
     NULL},
    {"distributed", 0, 0, G_OPTION_ARG_NONE, &opt_distributed,
     "Data-parallel over MPI (start with mpirun -np N); the batch is the global one", NULL},
    {"init", 0, 0, G_OPTION_ARG_FILENAME, &opt_init,
     "Load the initial weights from DIR/manifest.json and DIR/<name>.f32 (torch_transformer.py "
     "--dump-init)",
     "DIR"},
    {"version", 'V', 0, G_OPTION_ARG_NONE, &opt_version, "Print the version and exit", NULL},
    {NULL}};

static double
now_s(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static guint64
splitmix64_next(guint64 *state)
{
  guint64 z = (*state += G_GUINT64_CONSTANT(0x9E3779B97F4A7C15));
  z = (z ^ (z >> 30)) * G_GUINT64_CONSTANT(0xBF58476D1CE4E5B9);
  z = (z ^ (z >> 27)) * G_GUINT64_CONSTANT(0x94D049BB133111EB);
  return z ^ (z >> 31);
}

typedef struct {
  QkvTensor *src, *src_valid, *dec_in, *labels, *mask;
} Batch;

/* The peer's gen_batch: B consecutive sequences of the stream, then the
 * teacher-forcing decoder input [<bos>, Y[:, :-1]] and the valid-token mask.
 * Returns the number of valid target tokens. */
static gint64
fill_batch(guint64 *rng, const BenchConfig *cfg, Batch *batch)
{
  const gint B = cfg->batch, T = cfg->num_steps, lo = T / 2;
  gint32 *src = qkv_tensor_i32(batch->src), *valid = qkv_tensor_i32(batch->src_valid);
  gint32 *dec = qkv_tensor_i32(batch->dec_in), *lab = qkv_tensor_i32(batch->labels);
  float *mask = qkv_tensor_f32(batch->mask);
  gint64 tokens = 0;
  for (gint b = 0; b < B; b++) {
    gint len = lo + (gint)(splitmix64_next(rng) % (guint64)(T - lo + 1));
    gint32 *s = src + (gsize)b * T, *y = lab + (gsize)b * T, *d = dec + (gsize)b * T;
    for (gint t = 0; t < T; t++)
      s[t] = y[t] = PAD;
    for (gint t = 0; t < len - 1; t++)
      s[t] = 3 + (gint32)(splitmix64_next(rng) % (guint64)(cfg->vocab - 3));
    for (gint t = 0; t < len - 1; t++)
      y[t] = s[len - 2 - t];
    s[len - 1] = y[len - 1] = EOS;
    valid[b] = len;
    d[0] = BOS;
    for (gint t = 1; t < T; t++)
      d[t] = y[t - 1];
    for (gint t = 0; t < T; t++)
      mask[(gsize)b * T + t] = t < len ? 1.0f : 0.0f;
    tokens += len;
  }
  return tokens;
}

/* Copy every parameter from DIR/manifest.json + DIR/<file>; the manifest and
 * the store must name the same tensors with the same shapes. */
static gboolean
load_init_dir(QkvParams *params, const gchar *dir, GError **error)
{
  g_autofree gchar *manifest = g_build_filename(dir, "manifest.json", NULL);
  g_autoptr(JsonParser) parser = json_parser_new();
  if (!json_parser_load_from_file(parser, manifest, error))
    return FALSE;
  JsonNode *root = json_parser_get_root(parser);
  if (!JSON_NODE_HOLDS_ARRAY(root)) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_CORRUPT, "%s: expected a JSON array", manifest);
    return FALSE;
  }
  JsonArray *items = json_node_get_array(root);
  guint n = json_array_get_length(items);
  if (n != qkv_params_size(params)) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_SHAPE, "%s lists %u tensors, the model has %u",
                manifest, n, qkv_params_size(params));
    return FALSE;
  }
  for (guint i = 0; i < n; i++) {
    JsonObject *item = json_array_get_object_element(items, i);
    const gchar *key = item ? json_object_get_string_member_with_default(item, "key", NULL) : NULL;
    const gchar *file =
        item ? json_object_get_string_member_with_default(item, "file", NULL) : NULL;
    JsonArray *shape = item && json_object_has_member(item, "shape")
                           ? json_object_get_array_member(item, "shape")
                           : NULL;
    if (key == NULL || file == NULL || shape == NULL) {
      g_set_error(error, QKV_ERROR, QKV_ERROR_CORRUPT, "%s: entry %u lacks key, file or shape",
                  manifest, i);
      return FALSE;
    }
    QkvParam *p = qkv_params_lookup(params, key);
    if (p == NULL) {
      g_set_error(error, QKV_ERROR, QKV_ERROR_NOT_FOUND, "%s: the model has no parameter '%s'",
                  manifest, key);
      return FALSE;
    }
    gint64 dims[QKV_MAX_RANK];
    guint rank = json_array_get_length(shape);
    for (guint d = 0; d < rank && d < QKV_MAX_RANK; d++)
      dims[d] = json_array_get_int_element(shape, d);
    QkvShape want = qkv_shape_from_array((gint)MIN(rank, QKV_MAX_RANK), dims);
    if (rank > QKV_MAX_RANK || !qkv_shape_equal(&want, qkv_param_shape(p))) {
      g_autofree gchar *have = qkv_shape_to_string(qkv_param_shape(p));
      g_autofree gchar *listed =
          rank <= QKV_MAX_RANK ? qkv_shape_to_string(&want) : g_strdup("of rank > 6");
      g_set_error(error, QKV_ERROR, QKV_ERROR_SHAPE, "%s: '%s' is %s there, the model's is %s",
                  manifest, key, listed, have);
      return FALSE;
    }
    g_autofree gchar *path = g_build_filename(dir, file, NULL);
    g_autofree gchar *data = NULL;
    gsize size = 0;
    if (!g_file_get_contents(path, &data, &size, error))
      return FALSE;
    QkvTensor *value = qkv_param_value(p);
    gsize need = (gsize)qkv_tensor_numel(value) * sizeof(float);
    if (size != need) {
      g_set_error(error, QKV_ERROR, QKV_ERROR_CORRUPT, "%s: %zu bytes, expected %zu", path, size,
                  need);
      return FALSE;
    }
    /* little-endian f32, the only host order qkv runs on */
    memcpy(qkv_tensor_f32(value), data, need);
  }
  return TRUE;
}

static int
compare_double(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Python's statistics.median (the mean of the two middle values for even n);
 * sorts v. */
static double
median_of(double *v, gint n)
{
  qsort(v, n, sizeof(double), compare_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* NaN and infinities are not JSON: write them as null. */
static void
add_double(JsonBuilder *jb, const gchar *name, double v)
{
  json_builder_set_member_name(jb, name);
  if (isfinite(v))
    json_builder_add_double_value(jb, v);
  else
    json_builder_add_null_value(jb);
}

static void
add_int(JsonBuilder *jb, const gchar *name, gint64 v)
{
  json_builder_set_member_name(jb, name);
  json_builder_add_int_value(jb, v);
}

static void
add_string(JsonBuilder *jb, const gchar *name, const gchar *v)
{
  json_builder_set_member_name(jb, name);
  json_builder_add_string_value(jb, v);
}

/* The model of this rank: the training graph (for its rows of the global
 * batch), its plan, the parameters and Adam. */
typedef struct {
  QkvParams *params;
  QkvGraph *graph;
  QkvPlan *plan;
  QkvOptimizer *optimizer;
} Model;

static void
model_clear(Model *m)
{
  qkv_optimizer_free(m->optimizer);
  qkv_plan_free(m->plan);
  qkv_graph_free(m->graph);
  qkv_params_free(m->params);
  *m = (Model){0};
}

/* Build and compile the training graph for rows sequences, create (or
 * --init) the weights and the optimizer, and give every rank rank 0's. */
static gboolean
model_build(Model *m, const BenchConfig *cfg, gint64 rows, double dropout, double lr,
            GError **error)
{
  const gint T = cfg->num_steps;
  m->params = qkv_params_new();
  m->graph = qkv_graph_new();
  QkvGraph *g = m->graph;
  QkvShape bt = QKV_SHAPE(rows, T), bs = QKV_SHAPE(rows);
  QkvValue *src = qkv_graph_input(g, "src", QKV_I32, &bt, error);
  QkvValue *src_valid = qkv_graph_input(g, "src_valid", QKV_I32, &bs, error);
  QkvValue *dec_in = qkv_graph_input(g, "dec_in", QKV_I32, &bt, error);
  QkvValue *labels = qkv_graph_input(g, "labels", QKV_I32, &bt, error);
  QkvValue *mask = qkv_graph_input(g, "mask", QKV_F32, &bt, error);
  if (mask == NULL)
    return FALSE;
  QkvBuilder b = {
      .graph = g, .params = m->params, .seed = (guint64)opt_seed, .xavier_linear = TRUE};
  /* the peer's configs have as many decoder blocks as encoder blocks */
  QkvTransformerConfig tc = {
      .src_vocab = cfg->vocab,
      .tgt_vocab = cfg->vocab,
      .num_hiddens = cfg->d_model,
      .ffn_hiddens = cfg->ffn,
      .num_heads = cfg->heads,
      .num_layers = cfg->n_enc,
      .dropout = dropout,
  };
  QkvValue *enc = qkv_build_transformer_encoder(&b, &tc, src, src_valid, error);
  QkvValue *logits =
      enc ? qkv_build_transformer_decoder(&b, &tc, dec_in, enc, src_valid, NULL, error) : NULL;
  QkvValue *loss = logits ? qkv_build_seq2seq_loss(logits, labels, mask, error) : NULL;
  if (loss == NULL || !qkv_graph_backward(g, loss, error))
    return FALSE;
  QkvPlanOptions po = qkv_plan_options_default();
  po.training = TRUE;
  po.n_threads = opt_threads;
  po.precision = precision;
  po.bf16_activations = precision == QKV_PRECISION_BF16 && !opt_fp32_activations;
  /* each rank its own dropout masks */
  po.seed = (guint64)opt_seed + (dist != NULL ? 7919u * (guint64)qkv_dist_rank(dist) : 0);
  m->plan = qkv_graph_compile(g, &loss, 1, &po, error);
  if (m->plan == NULL)
    return FALSE;
  if (opt_init != NULL && !load_init_dir(m->params, opt_init, error))
    return FALSE;
  QkvOptimConfig oc = qkv_optim_config_adam(lr);
  m->optimizer = qkv_optimizer_new_adam(m->params, &oc, error);
  if (m->optimizer == NULL)
    return FALSE;
  return dist == NULL || qkv_dist_broadcast_params(dist, m->params, m->optimizer, error);
}

/* What the steps measured: the parts of each timed step (--steps of them,
 * after the warm-up) and every step's loss. */
typedef struct {
  double *step, *run, *update;
  double *comm, *transfer, *pack; /* --distributed */
  double *losses;                 /* the book's metric, warm-up steps too */
  guint64 bytes_per_step;
  double tokens_timed, last_token_ce;
} StepTimes;

static void
step_times_init(StepTimes *st, gint total)
{
  const gint n = MAX(opt_steps, 1);
  *st = (StepTimes){
      .step = g_new0(double, n),
      .run = g_new0(double, n),
      .update = g_new0(double, n),
      .comm = g_new0(double, n),
      .transfer = g_new0(double, n),
      .pack = g_new0(double, n),
      .losses = g_new0(double, MAX(total, 1)),
      .last_token_ce = NAN,
  };
}

static void
step_times_clear(StepTimes *st)
{
  g_free(st->step);
  g_free(st->run);
  g_free(st->update);
  g_free(st->comm);
  g_free(st->transfer);
  g_free(st->pack);
  g_free(st->losses);
}

/* Bind this rank's rows [row0, row0 + rows) of the global batch; views
 * gets the five borrowed tensors, which must outlive the runs. */
static gboolean
bind_rows(QkvPlan *plan, const Batch *batch, gint64 row0, gint64 rows, gint T, QkvTensor **views,
          GError **error)
{
  QkvShape bt = QKV_SHAPE(rows, T), bs = QKV_SHAPE(rows);
  views[0] = qkv_tensor_new_borrowed(QKV_I32, &bt, qkv_tensor_i32(batch->src) + row0 * T);
  views[1] = qkv_tensor_new_borrowed(QKV_I32, &bs, qkv_tensor_i32(batch->src_valid) + row0);
  views[2] = qkv_tensor_new_borrowed(QKV_I32, &bt, qkv_tensor_i32(batch->dec_in) + row0 * T);
  views[3] = qkv_tensor_new_borrowed(QKV_I32, &bt, qkv_tensor_i32(batch->labels) + row0 * T);
  views[4] = qkv_tensor_new_borrowed(QKV_F32, &bt, qkv_tensor_f32(batch->mask) + row0 * T);
  return qkv_plan_bind(plan, "src", views[0], error) &&
         qkv_plan_bind(plan, "src_valid", views[1], error) &&
         qkv_plan_bind(plan, "dec_in", views[2], error) &&
         qkv_plan_bind(plan, "labels", views[3], error) &&
         qkv_plan_bind(plan, "mask", views[4], error);
}

/* One training step i on the filled batch (tokens valid target tokens):
 * run, all-reduce (--distributed), clipped Adam update, timed in parts. */
static gboolean
train_step(Model *m, gint i, gint64 tokens, gint T, StepTimes *st, GError **error)
{
  double t0 = now_s();
  if (!qkv_plan_run(m->plan, error))
    return FALSE;
  double t_run = now_s(), t_reduced = t_run; /* the update starts after the all-reduce */
  float loss_sum = qkv_plan_output_scalar(m->plan, 0);
  if (dist != NULL) {
    QkvDistStats before, after;
    qkv_dist_get_stats(dist, &before);
    if (!qkv_dist_allreduce_grads(dist, m->params, QKV_DIST_SUM, &loss_sum, 1, error))
      return FALSE;
    qkv_dist_get_stats(dist, &after);
    if (i >= opt_warmup) {
      st->comm[i - opt_warmup] = now_s() - t_run;
      st->transfer[i - opt_warmup] = after.seconds_reduce - before.seconds_reduce;
      st->pack[i - opt_warmup] = after.seconds_pack - before.seconds_pack;
    }
    st->bytes_per_step = after.bytes_reduced - before.bytes_reduced;
    t_reduced = now_s();
  }
  gboolean ok = qkv_optimizer_step_clipped(m->optimizer, 1.0, QKV_CLIP_TORCH, NULL, error);
  double dt = now_s() - t0;
  st->losses[i] = (double)loss_sum / (double)tokens; /* the book's metric */
  st->last_token_ce = (double)loss_sum * T / (double)tokens;
  if (i >= opt_warmup) {
    st->step[i - opt_warmup] = dt;
    st->run[i - opt_warmup] = t_run - t0;
    st->update[i - opt_warmup] = dt - (t_reduced - t0);
    st->tokens_timed += (double)tokens;
  }
  return ok;
}

/* --warmup then --steps training steps, each on the next global batch of
 * the stream (filled outside the timer); *train_wall_s gets the time since
 * start_s when they are done. */
static gboolean
train_steps(Model *m, const BenchConfig *cfg, gint64 row0, gint64 rows, gint total, double start_s,
            StepTimes *st, double *train_wall_s, GError **error)
{
  const gint B = cfg->batch, T = cfg->num_steps;
  /* the whole global batch; the plan reads this rank's rows of it */
  QkvShape gbt = QKV_SHAPE(B, T), gbs = QKV_SHAPE(B);
  Batch batch = {
      .src = qkv_tensor_new(QKV_I32, &gbt),
      .src_valid = qkv_tensor_new(QKV_I32, &gbs),
      .dec_in = qkv_tensor_new(QKV_I32, &gbt),
      .labels = qkv_tensor_new(QKV_I32, &gbt),
      .mask = qkv_tensor_new(QKV_F32, &gbt),
  };
  QkvTensor *views[5] = {NULL};
  gboolean ok = bind_rows(m->plan, &batch, row0, rows, T, views, error);
  guint64 rng = (guint64)opt_seed;
  for (gint i = 0; ok && i < total; i++) {
    gint64 tokens = fill_batch(&rng, cfg, &batch);
    if (opt_profile && i == opt_warmup)
      qkv_plan_set_profiling(m->plan, TRUE);
    ok = train_step(m, i, tokens, T, st, error);
  }
  *train_wall_s = now_s() - start_s;
  if (opt_profile) {
    g_autofree gchar *report = qkv_plan_profile_report(m->plan);
    g_printerr("%s", report);
  }
  for (guint i = 0; i < G_N_ELEMENTS(views); i++)
    qkv_tensor_free(views[i]);
  qkv_tensor_free(batch.src);
  qkv_tensor_free(batch.src_valid);
  qkv_tensor_free(batch.dec_in);
  qkv_tensor_free(batch.labels);
  qkv_tensor_free(batch.mask);
  return ok;
}

/* The timed steps' statistics; NaN without timed steps. */
typedef struct {
  double median, min, mean, mean_tokens;
  double median_run, median_update, median_comm, median_transfer, median_pack;
} Summary;

/* Sorts the arrays of st. */
static Summary
summarise(StepTimes *st)
{
  Summary s = {NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN};
  if (opt_steps > 0) {
    double sum = 0;
    for (gint i = 0; i < opt_steps; i++)
      sum += st->step[i];
    s.mean = sum / opt_steps;
    s.mean_tokens = st->tokens_timed / opt_steps;
    s.median = median_of(st->step, opt_steps);
    s.min = st->step[0];
    s.median_run = median_of(st->run, opt_steps);
    s.median_update = median_of(st->update, opt_steps);
    s.median_comm = median_of(st->comm, opt_steps);
    s.median_transfer = median_of(st->transfer, opt_steps);
    s.median_pack = median_of(st->pack, opt_steps);
  }
  return s;
}

/* The configuration's fields of the JSON line. */
static void
add_config(JsonBuilder *jb, const BenchConfig *cfg, double dropout, double lr)
{
  add_string(jb, "config", cfg->name);
  add_int(jb, "threads", opt_threads);
  add_int(jb, "steps", opt_steps);
  add_int(jb, "warmup", opt_warmup);
  add_int(jb, "seed", opt_seed);
  add_int(jb, "d_model", cfg->d_model);
  add_int(jb, "ffn", cfg->ffn);
  add_int(jb, "heads", cfg->heads);
  add_int(jb, "n_enc", cfg->n_enc);
  add_int(jb, "n_dec", cfg->n_dec);
  add_double(jb, "dropout", dropout);
  add_int(jb, "batch", cfg->batch);
  add_int(jb, "num_steps", cfg->num_steps);
  add_int(jb, "vocab", cfg->vocab);
  add_double(jb, "lr", lr);
}

/* The losses' fields: the last, the mean of the last ten, and with
 * --losses every one. */
static void
add_losses(JsonBuilder *jb, const StepTimes *st, gint total)
{
  add_int(jb, "steps_trained", total);
  add_double(jb, "final_loss", total > 0 ? st->losses[total - 1] : NAN);
  add_double(jb, "final_token_ce", st->last_token_ce);
  gint last = MIN(10, total);
  double tail = 0;
  for (gint i = total - last; i < total; i++)
    tail += st->losses[i];
  add_double(jb, "mean_loss_last10", last > 0 ? tail / last : NAN);
  if (opt_losses) {
    json_builder_set_member_name(jb, "losses");
    json_builder_begin_array(jb);
    for (gint i = 0; i < total; i++) {
      if (isfinite(st->losses[i]))
        json_builder_add_double_value(jb, st->losses[i]);
      else
        json_builder_add_null_value(jb);
    }
    json_builder_end_array(jb);
  }
}

/* The build: the plan's memory, the kernels and libraries it ran on. */
static void
add_build(JsonBuilder *jb, const Model *m)
{
  add_int(jb, "arena_bytes", (gint64)qkv_plan_arena_size(m->plan));
  add_int(jb, "intermediates_bytes", (gint64)qkv_plan_intermediates_size(m->plan));
  add_int(jb, "plan_steps", qkv_plan_n_steps(m->plan));
  add_string(jb, "vec_isa", qkv_vec_isa());
  static const gchar *const sparse_modes[] = {"off", "auto", "always"};
  add_string(jb, "sparse_backward", sparse_modes[qkv_get_sparse_backward()]);
  g_autofree gchar *blas =
      g_strdup_printf("%s (%s)", openblas_get_corename(), openblas_get_config());
  add_string(jb, "blas", blas);
  add_string(jb, "gemm_backend", qkv_gemm_backend());
  add_string(jb, "gemm_kernel", qkv_gemm_kernel());
  const gchar *bf16_why;
  gboolean bf16_native = qkv_bf16_native(&bf16_why);
  add_string(jb, "precision", precision == QKV_PRECISION_BF16 ? "bf16" : "fp32");
  add_string(jb, "activations",
             precision == QKV_PRECISION_BF16 && !opt_fp32_activations ? "bf16" : "fp32");
  g_autofree gchar *bf16 =
      g_strdup_printf("%s (%s)", bf16_native ? "native" : "emulated", bf16_why);
  add_string(jb, "bf16", bf16);
  add_string(jb, "init", opt_init != NULL ? opt_init : "qkv");
}

/* The JSON line with the peer's fields (rank 0). */
static void
print_report(const BenchConfig *cfg, const Model *m, double dropout, double lr, const StepTimes *st,
             const Summary *s, gint total, double train_wall_s)
{
  const gint B = cfg->batch, T = cfg->num_steps;
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  const gint64 d = cfg->d_model, f = cfg->ffn, V = cfg->vocab;
  const gint64 p_mm =
      cfg->n_enc * (4 * d * d + 2 * d * f) + cfg->n_dec * (8 * d * d + 2 * d * f) + d * V;
  const gint64 f_mm = 6 * p_mm * B * T;
  const gint64 f_att = (gint64)12 * B * T * T * d * (cfg->n_enc + 2 * cfg->n_dec);

  g_autoptr(JsonBuilder) jb = json_builder_new();
  json_builder_begin_object(jb);
  add_config(jb, cfg, dropout, lr);
  add_double(jb, "median_step_s", s->median);
  add_double(jb, "median_run_s", s->median_run);
  add_double(jb, "median_update_s", s->median_update);
  if (dist != NULL) {
    add_int(jb, "world_size", qkv_dist_world_size(dist));
    add_int(jb, "bytes_allreduced_per_step", (gint64)st->bytes_per_step);
    add_double(jb, "median_allreduce_s", s->median_comm);
    add_double(jb, "median_transfer_s", s->median_transfer);
    add_double(jb, "median_pack_s", s->median_pack);
    add_double(jb, "comm_share", s->median_comm / s->median);
    add_double(jb, "transfer_share", s->median_transfer / s->median);
  }
  add_double(jb, "min_step_s", s->min);
  add_double(jb, "mean_step_s", s->mean);
  add_double(jb, "mean_valid_tgt_tokens_per_step", s->mean_tokens);
  add_double(jb, "tokens_per_s", s->mean_tokens / s->median);
  add_double(jb, "padded_tokens_per_s", (double)B * T / s->median);
  add_double(jb, "peak_rss_mib", ru.ru_maxrss / 1024.0);
  add_int(jb, "params", qkv_params_numel(m->params));
  add_int(jb, "params_matmul", p_mm);
  add_int(jb, "flops_per_step", f_mm + f_att);
  add_int(jb, "flops_matmul", f_mm);
  add_int(jb, "flops_attention", f_att);
  add_double(jb, "gflops_per_s", (double)(f_mm + f_att) / s->median / 1e9);
  add_losses(jb, st, total);
  add_double(jb, "train_wall_s", train_wall_s);
  add_build(jb, m);
  json_builder_end_object(jb);

  g_autoptr(JsonGenerator) gen = json_generator_new();
  g_autoptr(JsonNode) root = json_builder_get_root(jb);
  json_generator_set_root(gen, root);
  g_autofree gchar *text = json_generator_to_data(gen, NULL);
  printf("%s\n", text);
}

static gboolean
run(const BenchConfig *cfg, double start_s, GError **error)
{
  /* --distributed: this rank's rows of each global batch; the graph is built
   * for them */
  gint64 row0 = 0, rows = cfg->batch;
  if (dist != NULL)
    qkv_dist_shard(dist, cfg->batch, &row0, &rows);
  const double dropout = opt_dropout >= 0 ? opt_dropout : cfg->dropout;
  const double lr = opt_lr >= 0 ? opt_lr : cfg->lr;
  const gint total = opt_warmup + opt_steps;
  Model m = {0};
  StepTimes st;
  step_times_init(&st, total);
  double train_wall_s = 0;
  gboolean ok = model_build(&m, cfg, rows, dropout, lr, error) &&
                train_steps(&m, cfg, row0, rows, total, start_s, &st, &train_wall_s, error);
  if (ok) {
    Summary s = summarise(&st);
    /* rank 0 reports */
    if (dist == NULL || qkv_dist_is_root(dist))
      print_report(cfg, &m, dropout, lr, &st, &s, total, train_wall_s);
  }
  step_times_clear(&st);
  model_clear(&m);
  return ok;
}

int
main(int argc, char **argv)
{
  double start_s = now_s();
  g_autoptr(GError) error = NULL;
  g_autoptr(GOptionContext) context =
      g_option_context_new("- train the d2l Transformer as bench/peers/torch_transformer.py does");
  g_option_context_add_main_entries(context, entries, NULL);
  /* dropout and lr: -1 (any negative) takes the config's */
  const OptionRange ranges[] = {
      OPTION_INT("threads", &opt_threads, 1, options_max_threads()),
      OPTION_INT("steps", &opt_steps, 0, 1000000),
      OPTION_INT("warmup", &opt_warmup, 0, 1000000),
      OPTION_INT64("seed", &opt_seed, G_MININT64, G_MAXINT64),
      OPTION_DOUBLE_OPEN("dropout", &opt_dropout, -1, 1, FALSE, TRUE),
      OPTION_DOUBLE("lr", &opt_lr, -1, 10),
  };
  if (!g_option_context_parse(context, &argc, &argv, &error) ||
      !options_check_ranges(ranges, G_N_ELEMENTS(ranges), &error)) {
    g_printerr("qkv-bench-transformer: %s\n", error->message);
    return 2;
  }
  if (opt_version) {
    program_print_version("qkv-bench-transformer");
    return 0;
  }
  const BenchConfig *cfg = NULL;
  for (guint i = 0; opt_config != NULL && i < G_N_ELEMENTS(configs); i++)
    if (g_str_equal(opt_config, configs[i].name))
      cfg = &configs[i];
  gboolean precision_ok = opt_precision == NULL || g_str_equal(opt_precision, "fp32") ||
                          g_str_equal(opt_precision, "bf16");
  if (cfg == NULL || opt_threads < 1 || opt_steps < 0 || opt_warmup < 0 || opt_dropout >= 1 ||
      !precision_ok) {
    g_printerr("qkv-bench-transformer: --config S|M|L is required; --threads >= 1, --steps and "
               "--warmup >= 0, --dropout < 1, --precision fp32 or bf16\n");
    return 2;
  }
  if (opt_precision != NULL && g_str_equal(opt_precision, "bf16"))
    precision = QKV_PRECISION_BF16;
  /* the plan's kernels, OpenBLAS (OpenMP build) and the optimizer's loops */
  qkv_set_num_threads(opt_threads);
  omp_set_num_threads(opt_threads);
  if (opt_distributed && (dist = qkv_dist_init(&argc, &argv, &error)) == NULL) {
    g_printerr("qkv-bench-transformer: %s\n", error->message);
    return 1;
  }
  gboolean ok = run(cfg, start_s, &error);
  if (!ok)
    g_printerr("qkv-bench-transformer: %s\n", error->message);
  qkv_dist_free(dist);
  return ok ? 0 : 1;
}
