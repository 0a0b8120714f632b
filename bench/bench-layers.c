/* bench-layers.c: the fused layer ops (layer_norm, position_wise_ffn,
 * positional_encoding, additive_attention) against the same computation
 * built from primitive ops.
 *
 * For each op and size a training plan (forward, backward, the gradient of
 * every float input) is compiled for the fused op and for its composite, and
 * run N times after two warm-up runs. Printed: the median and fastest run,
 * the plan arena (qkv_plan_arena_size) and the peak resident set
 * (ru_maxrss), each measurement in a child process of its own so that
 * ru_maxrss is that measurement's peak.
 *
 * Sizes: the book's Transformer (batch 64, 10 steps, 32 hiddens, FFN 64) and
 * a larger one (batch 32, 128 steps, 512 hiddens, FFN 2048). Additive
 * attention runs with n_q = n_k = T, q, k and v of size d, h = d, valid
 * lengths (B), and dropout 0.1 on the weights; positional encoding with
 * dropout 0.1, as in the book's training. The composites use "dropout" (the
 * op) where the fused ops drop out inside.
 *
 * Usage: bench-layers [runs-per-measurement-for-the-large-size [op-name]]
 */
#include <qkv/qkv.h>

#include "bench-common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../examples/common/program-version.h"

typedef enum {
  OP_LAYER_NORM,
  OP_FFN,
  OP_POSITIONAL,
  OP_ADDITIVE,
  N_OPS,
} OpKind;

static const char *const op_names[] = {"layer_norm", "position_wise_ffn", "positional_encoding",
                                       "additive_attention"};

typedef struct {
  const char *label;
  gint64 batch, steps, hidden, ffn_hidden;
  gint runs;
} Size;

#define DROPOUT 0.1

typedef struct {
  QkvGraph *graph;
  GPtrArray *tensors; /* QkvTensor*, one per graph input, named in%u */
  GPtrArray *inputs;  /* QkvValue* */
  guint32 seed;
} Bench;

static QkvValue *
add_input(Bench *b, QkvShape shape, float lo, float hi)
{
  g_autofree gchar *name = g_strdup_printf("in%u", b->inputs->len);
  QkvValue *v = qkv_graph_input(b->graph, name, QKV_F32, &shape, NULL);
  qkv_value_set_requires_grad(v, TRUE);
  QkvTensor *t = qkv_tensor_new(QKV_F32, &shape);
  GRand *rand = g_rand_new_with_seed(b->seed++);
  float *d = qkv_tensor_f32(t);
  for (gint64 i = 0; i < qkv_tensor_numel(t); i++)
    d[i] = (float)g_rand_double_range(rand, lo, hi);
  g_rand_free(rand);
  g_ptr_array_add(b->inputs, v);
  g_ptr_array_add(b->tensors, t);
  return v;
}

/* Valid lengths (B) between T/2 and T, like padded sentences. */
static QkvTensor *
valid_lens_tensor(const Size *z)
{
  QkvShape s = QKV_SHAPE(z->batch);
  QkvTensor *t = qkv_tensor_new(QKV_I32, &s);
  gint32 *d = qkv_tensor_i32(t);
  for (gint64 b = 0; b < z->batch; b++)
    d[b] = (gint32)(z->steps - b % MAX(z->steps / 2, 1));
  return t;
}

static QkvValue *
add_valid_lens(Bench *b, const Size *z)
{
  g_autofree gchar *name = g_strdup_printf("in%u", b->inputs->len);
  QkvShape s = QKV_SHAPE(z->batch);
  QkvValue *v = qkv_graph_input(b->graph, name, QKV_I32, &s, NULL);
  g_ptr_array_add(b->inputs, v);
  g_ptr_array_add(b->tensors, valid_lens_tensor(z));
  return v;
}

/* (x − mean) · exp(−½ log(var + eps)) · gamma + beta. */
static QkvValue *
composite_layer_norm(QkvValue *x, QkvValue *gamma, QkvValue *beta, GError **error)
{
  const gint last = -1;
  QkvGraph *g = qkv_value_graph(x);
  QkvValue *mean = qkv_mean(x, &last, 1, TRUE, error);
  QkvValue *xc = mean ? qkv_sub(x, mean, error) : NULL;
  QkvValue *var = xc ? qkv_mean(qkv_mul(xc, xc, error), &last, 1, TRUE, error) : NULL;
  QkvValue *ve = var ? qkv_add(var, qkv_graph_scalar(g, 1e-5f), error) : NULL;
  QkvValue *rstd = ve ? qkv_exp(qkv_scale(qkv_log(ve, error), -0.5, error), error) : NULL;
  QkvValue *y = rstd ? qkv_mul(qkv_mul(xc, rstd, error), gamma, error) : NULL;
  return y ? qkv_add(y, beta, error) : NULL;
}

/* The book's table for T rows of d columns. */
static QkvTensor *
positional_table(gint64 t, gint64 d)
{
  QkvShape s = QKV_SHAPE(t, d);
  QkvTensor *p = qkv_tensor_new(QKV_F32, &s);
  for (gint64 pos = 0; pos < t; pos++)
    for (gint64 j = 0; j < d; j++) {
      float angle = (float)pos / powf(10000.0f, (float)(j - (j & 1)) / (float)d);
      qkv_tensor_f32(p)[pos * d + j] = (float)((j & 1) ? cos(angle) : sin(angle));
    }
  return p;
}

/* The book's AdditiveAttention from primitives, masked by constants
 * (s · keep − 1e6 where masked), then dropout and the product with v. */
static QkvValue *
composite_additive(QkvValue *q, QkvValue *k, QkvValue *v, QkvValue *wq, QkvValue *wk, QkvValue *wv,
                   const QkvTensor *lens, GError **error)
{
  QkvGraph *g = qkv_value_graph(q);
  const QkvShape *qs = qkv_value_shape(q), *ks = qkv_value_shape(k);
  gint64 b = qs->dims[0], nq = qs->dims[1], nk = ks->dims[1], h = qkv_value_shape(wq)->dims[0];
  QkvShape q4 = QKV_SHAPE(b, nq, 1, h), k4 = QKV_SHAPE(b, 1, nk, h), s3 = QKV_SHAPE(b, nq, nk);
  QkvValue *qp = qkv_reshape(qkv_matmul(q, wq, FALSE, TRUE, error), &q4, error);
  QkvValue *kp = qp ? qkv_reshape(qkv_matmul(k, wk, FALSE, TRUE, error), &k4, error) : NULL;
  QkvValue *f = kp ? qkv_tanh(qkv_add(qp, kp, error), error) : NULL;
  QkvValue *s = f ? qkv_reshape(qkv_matmul(f, wv, FALSE, TRUE, error), &s3, error) : NULL;
  if (s == NULL)
    return NULL;
  g_autoptr(QkvTensor) keep = qkv_tensor_new(QKV_F32, &s3);
  g_autoptr(QkvTensor) fill = qkv_tensor_new(QKV_F32, &s3);
  const gint32 *len = qkv_tensor_const_data(lens);
  for (gint64 r = 0; r < b * nq; r++)
    for (gint64 j = 0; j < nk; j++) {
      gboolean kept = j < len[r / nq];
      qkv_tensor_f32(keep)[r * nk + j] = kept ? 1.0f : 0.0f;
      qkv_tensor_f32(fill)[r * nk + j] = kept ? 0.0f : -1e6f;
    }
  s = qkv_add(qkv_mul(s, qkv_graph_constant(g, keep, error), error),
              qkv_graph_constant(g, fill, error), error);
  QkvValue *w = s ? qkv_softmax(s, error) : NULL;
  w = w ? qkv_dropout(w, DROPOUT, error) : NULL;
  return w ? qkv_matmul(w, v, FALSE, FALSE, error) : NULL;
}

static QkvValue *
build(Bench *b, OpKind op, gboolean fused, const Size *z, GError **error)
{
  const gint64 B = z->batch, T = z->steps, D = z->hidden, F = z->ffn_hidden;
  switch (op) {
  case OP_LAYER_NORM: {
    QkvValue *x = add_input(b, QKV_SHAPE(B, T, D), -2, 2);
    QkvValue *gamma = add_input(b, QKV_SHAPE(D), 0.5f, 1.5f);
    QkvValue *beta = add_input(b, QKV_SHAPE(D), -1, 1);
    if (fused)
      return qkv_layer_norm(x, gamma, beta, 1e-5, error);
    return composite_layer_norm(x, gamma, beta, error);
  }
  case OP_FFN: {
    float b1 = (float)(1.0 / sqrt((double)D)), b2 = (float)(1.0 / sqrt((double)F));
    QkvValue *x = add_input(b, QKV_SHAPE(B, T, D), -1, 1);
    QkvValue *w1 = add_input(b, QKV_SHAPE(F, D), -b1, b1);
    QkvValue *bias1 = add_input(b, QKV_SHAPE(F), -b1, b1);
    QkvValue *w2 = add_input(b, QKV_SHAPE(D, F), -b2, b2);
    QkvValue *bias2 = add_input(b, QKV_SHAPE(D), -b2, b2);
    if (fused)
      return qkv_position_wise_ffn(x, w1, bias1, w2, bias2, error);
    QkvValue *h = qkv_relu(qkv_add(qkv_matmul(x, w1, FALSE, TRUE, error), bias1, error), error);
    return h ? qkv_add(qkv_matmul(h, w2, FALSE, TRUE, error), bias2, error) : NULL;
  }
  case OP_POSITIONAL: {
    QkvValue *x = add_input(b, QKV_SHAPE(B, T, D), -1, 1);
    if (fused)
      return qkv_positional_encoding(x, DROPOUT, 0, error);
    g_autoptr(QkvTensor) table = positional_table(T, D);
    QkvValue *y = qkv_add(x, qkv_graph_constant(b->graph, table, error), error);
    return y ? qkv_dropout(y, DROPOUT, error) : NULL;
  }
  case OP_ADDITIVE: {
    float bound = (float)(1.0 / sqrt((double)D));
    QkvValue *q = add_input(b, QKV_SHAPE(B, T, D), -1, 1);
    QkvValue *k = add_input(b, QKV_SHAPE(B, T, D), -1, 1);
    QkvValue *v = add_input(b, QKV_SHAPE(B, T, D), -1, 1);
    QkvValue *wq = add_input(b, QKV_SHAPE(D, D), -bound, bound);
    QkvValue *wk = add_input(b, QKV_SHAPE(D, D), -bound, bound);
    QkvValue *wv = add_input(b, QKV_SHAPE(1, D), -bound, bound);
    if (fused)
      return qkv_additive_attention(q, k, v, wq, wk, wv, add_valid_lens(b, z), DROPOUT, NULL,
                                    error);
    g_autoptr(QkvTensor) lens = valid_lens_tensor(z);
    return composite_additive(q, k, v, wq, wk, wv, lens, error);
  }
  default:
    return NULL;
  }
}

static void
measure(OpKind op, gboolean fused, const Size *z, BenchResult *r)
{
  g_autoptr(GError) error = NULL;
  Bench b = {qkv_graph_new(), g_ptr_array_new_with_free_func((GDestroyNotify)qkv_tensor_free),
             g_ptr_array_new(), 1};
  QkvValue *out = build(&b, op, fused, z, &error);
  QkvPlan *plan = out ? bench_training_plan(b.graph, out, b.inputs, b.tensors, &error) : NULL;
  if (plan != NULL)
    bench_time_plan(plan, z->runs, r);
  else
    g_strlcpy(r->error, error ? error->message : "building the plan failed", sizeof r->error);
  qkv_plan_free(plan);
  g_ptr_array_unref(b.inputs);
  g_ptr_array_unref(b.tensors);
  qkv_graph_free(b.graph);
}

typedef struct {
  OpKind op;
  gboolean fused;
  const Size *size;
} Job;

static void
measure_job(gconstpointer data, BenchResult *r)
{
  const Job *job = data;
  measure(job->op, job->fused, job->size, r);
}

int
main(int argc, char **argv)
{
  if (program_version_requested(argc, argv)) {
    program_print_version("bench-layers");
    return 0;
  }
  gint large_runs = argc > 1 ? atoi(argv[1]) : 5;
  const char *only = argc > 2 ? argv[2] : NULL;
  Size sizes[] = {
      {"B64 T10 d32 F64", 64, 10, 32, 64, 51},
      {"B32 T128 d512 F2048", 32, 128, 512, 2048, MAX(large_runs, 1)},
  };
  printf("qkv %s, %d threads, vector ISA %s; training plans (forward + backward of every float "
         "input); dropout %.1f in positional_encoding and additive_attention, whose valid_lens "
         "are (B) and h = d\n",
         qkv_version(), qkv_get_num_threads(), qkv_vec_isa(), DROPOUT);
  printf("%-20s %-20s %-9s %5s %6s %11s %11s %10s %11s\n", "op", "size", "variant", "runs", "nodes",
         "median ms", "min ms", "arena MiB", "maxrss MiB");
  for (guint s = 0; s < G_N_ELEMENTS(sizes); s++)
    for (guint op = 0; op < N_OPS; op++) {
      if (only != NULL && strcmp(only, op_names[op]) != 0)
        continue;
      BenchResult res[2];
      for (gint fused = 1; fused >= 0; fused--) {
        BenchResult *r = &res[1 - fused];
        Job job = {(OpKind)op, fused, &sizes[s]};
        bench_measure_in_child(measure_job, &job, r);
        if (r->error[0] != '\0') {
          printf("%-20s %-20s %-9s error: %s\n", op_names[op], sizes[s].label,
                 fused ? "fused" : "composite", r->error);
          continue;
        }
        printf("%-20s %-20s %-9s %5d %6u %11.3f %11.3f %10.2f %11.1f\n", op_names[op],
               sizes[s].label, fused ? "fused" : "composite", sizes[s].runs, r->n_steps,
               r->median_ms, r->min_ms, (double)r->arena_bytes / (1 << 20),
               (double)r->maxrss_kb / 1024);
      }
      if (res[0].error[0] == '\0' && res[1].error[0] == '\0')
        printf("%-20s %-20s speed-up %.2fx, arena %.2fx of composite\n", "", "",
               res[1].median_ms / res[0].median_ms,
               (double)res[0].arena_bytes / (double)MAX(res[1].arena_bytes, 1));
    }
  return 0;
}
