/* bench-attention.c: the fused attention-family ops against the same
 * computation built from primitive ops.
 *
 * For each op and size, a training plan (forward, backward, the gradient of
 * every float input) is compiled for the fused op and for its composite, and
 * run N times after two warm-up runs. Printed: the median and fastest run,
 * the plan arena (qkv_plan_arena_size) and the peak resident set
 * (ru_maxrss). Every measurement runs in a child process of its own, so
 * ru_maxrss is that measurement's peak, not the largest so far.
 *
 * Sizes: the book's Transformer (batch 64, 10 steps, 32 hiddens, 4 heads) and
 * a larger one (batch 32, 128 steps, 512 hiddens, 8 heads). Valid lengths
 * (B) mask the keys, and attention dropout 0.1 is on, as in the book's
 * training. The composite dropout is the "dropout" op on the weights; the
 * composite of "dropout" itself is a multiplication by a constant mask (no
 * random numbers drawn: a lower bound).
 *
 * Usage: bench-attention [runs-per-measurement-for-the-large-size]
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
  OP_MASKED_SOFTMAX,
  OP_DOT_ATTENTION,
  OP_MHA,
  OP_DROPOUT,
  N_OPS,
} OpKind;

static const char *const op_names[] = {"masked_softmax", "dot_product_attention",
                                       "multi_head_attention", "dropout"};

typedef struct {
  const char *label;
  gint64 batch, steps, hidden;
  gint heads;
  gint runs;
} Size;

#define DROPOUT 0.1

/* The graph under construction and the tensors its inputs are bound to. */
typedef struct {
  QkvGraph *graph;
  GPtrArray *tensors; /* QkvTensor*, one per input, named in%u */
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

/* valid lengths (B): between T/2 and T, like padded sentences. */
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

/* The book's masking from primitives: x · keep + (-1e6 where masked), the
 * masks constants of x's shape (B, …, n_q, n_k). */
static QkvValue *
composite_masked_softmax(QkvValue *x, const QkvTensor *lens, GError **error)
{
  const QkvShape *s = qkv_value_shape(x);
  g_autoptr(QkvTensor) keep = qkv_tensor_new(QKV_F32, s);
  g_autoptr(QkvTensor) neg = qkv_tensor_new(QKV_F32, s);
  gint64 n_k = s->dims[s->rank - 1], rows = qkv_shape_numel(s) / n_k;
  gint64 per_batch = rows / s->dims[0];
  float *pk = qkv_tensor_f32(keep), *pn = qkv_tensor_f32(neg);
  const gint32 *len = qkv_tensor_const_data(lens);
  for (gint64 r = 0; r < rows; r++)
    for (gint64 j = 0; j < n_k; j++) {
      gboolean kept = j < len[r / per_batch];
      pk[r * n_k + j] = kept ? 1.0f : 0.0f;
      pn[r * n_k + j] = kept ? 0.0f : -1e6f;
    }
  QkvGraph *g = qkv_value_graph(x);
  QkvValue *m = qkv_mul(x, qkv_graph_constant(g, keep, error), error);
  m = m ? qkv_add(m, qkv_graph_constant(g, neg, error), error) : NULL;
  return m ? qkv_softmax(m, error) : NULL;
}

static QkvValue *
composite_attention(QkvValue *q, QkvValue *k, QkvValue *v, const QkvTensor *lens, GError **error)
{
  const QkvShape *qs = qkv_value_shape(q);
  QkvValue *s = qkv_matmul(q, k, FALSE, TRUE, error);
  s = s ? qkv_scale(s, 1.0 / sqrt((double)qs->dims[qs->rank - 1]), error) : NULL;
  QkvValue *p = s ? composite_masked_softmax(s, lens, error) : NULL;
  p = p ? qkv_dropout(p, DROPOUT, error) : NULL;
  return p ? qkv_matmul(p, v, FALSE, FALSE, error) : NULL;
}

static QkvValue *
split_heads(QkvValue *x, gint heads, GError **error)
{
  const QkvShape *s = qkv_value_shape(x);
  QkvShape shape = QKV_SHAPE(s->dims[0], s->dims[1], heads, s->dims[2] / heads);
  const gint perm[] = {0, 2, 1, 3};
  QkvValue *r = qkv_reshape(x, &shape, error);
  return r ? qkv_permute(r, perm, 4, error) : NULL;
}

static QkvValue *
build(Bench *b, OpKind op, gboolean fused, const Size *z, GError **error)
{
  gint64 B = z->batch, T = z->steps, H = z->hidden;
  g_autoptr(QkvTensor) lens = valid_lens_tensor(z);
  switch (op) {
  case OP_MASKED_SOFTMAX: {
    QkvValue *x = add_input(b, QKV_SHAPE(B, z->heads, T, T), -3, 3);
    if (fused)
      return qkv_masked_softmax(x, add_valid_lens(b, z), FALSE, error);
    return composite_masked_softmax(x, lens, error);
  }
  case OP_DOT_ATTENTION: {
    QkvValue *q = add_input(b, QKV_SHAPE(B, T, H), -1, 1);
    QkvValue *k = add_input(b, QKV_SHAPE(B, T, H), -1, 1);
    QkvValue *v = add_input(b, QKV_SHAPE(B, T, H), -1, 1);
    if (fused)
      return qkv_dot_product_attention(q, k, v, add_valid_lens(b, z), FALSE, DROPOUT, NULL, error);
    return composite_attention(q, k, v, lens, error);
  }
  case OP_MHA: {
    QkvValue *x[3], *w[4];
    for (guint i = 0; i < 3; i++)
      x[i] = add_input(b, QKV_SHAPE(B, T, H), -1, 1);
    float bound = (float)sqrt(3.0 / (double)H);
    for (guint i = 0; i < 4; i++)
      w[i] = add_input(b, QKV_SHAPE(H, H), -bound, bound);
    if (fused)
      return qkv_multi_head_attention(x[0], x[1], x[2], w[0], w[1], w[2], w[3], NULL, z->heads,
                                      add_valid_lens(b, z), FALSE, DROPOUT, NULL, error);
    QkvValue *h[3];
    for (guint i = 0; i < 3; i++) {
      QkvValue *p = qkv_matmul(x[i], w[i], FALSE, TRUE, error);
      h[i] = p ? split_heads(p, z->heads, error) : NULL;
      if (h[i] == NULL)
        return NULL;
    }
    QkvValue *o = composite_attention(h[0], h[1], h[2], lens, error);
    const gint perm[] = {0, 2, 1, 3};
    o = o ? qkv_permute(o, perm, 4, error) : NULL;
    QkvShape cs = QKV_SHAPE(B, T, H);
    o = o ? qkv_reshape(o, &cs, error) : NULL;
    return o ? qkv_matmul(o, w[3], FALSE, TRUE, error) : NULL;
  }
  case OP_DROPOUT: {
    QkvValue *x = add_input(b, QKV_SHAPE(B, T, H), -1, 1);
    if (fused)
      return qkv_dropout(x, DROPOUT, error);
    QkvShape s = QKV_SHAPE(B, T, H);
    g_autoptr(QkvTensor) mask = qkv_tensor_new(QKV_F32, &s);
    float *m = qkv_tensor_f32(mask);
    GRand *rand = g_rand_new_with_seed(3);
    for (gint64 i = 0; i < qkv_tensor_numel(mask); i++)
      m[i] = g_rand_double(rand) < DROPOUT ? 0.0f : (float)(1.0 / (1.0 - DROPOUT));
    g_rand_free(rand);
    return qkv_mul(x, qkv_graph_constant(b->graph, mask, error), error);
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
    program_print_version("bench-attention");
    return 0;
  }
  gint large_runs = argc > 1 ? atoi(argv[1]) : 7;
  Size sizes[] = {
      {"B64 T10 H32 h4", 64, 10, 32, 4, 51},
      {"B32 T128 H512 h8", 32, 128, 512, 8, MAX(large_runs, 1)},
  };
  printf("qkv %s, %d threads, vector ISA %s; training plans (forward + backward of every float "
         "input), attention dropout %.1f, valid_lens (B)\n",
         qkv_version(), qkv_get_num_threads(), qkv_vec_isa(), DROPOUT);
  printf("%-22s %-17s %-9s %5s %6s %11s %11s %10s %11s\n", "op", "size", "variant", "runs", "nodes",
         "median ms", "min ms", "arena MiB", "maxrss MiB");
  for (guint s = 0; s < G_N_ELEMENTS(sizes); s++)
    for (guint op = 0; op < N_OPS; op++) {
      BenchResult res[2];
      for (gint fused = 1; fused >= 0; fused--) {
        BenchResult *r = &res[1 - fused];
        Job job = {(OpKind)op, fused, &sizes[s]};
        bench_measure_in_child(measure_job, &job, r);
        if (r->error[0] != '\0') {
          printf("%-22s %-17s %-9s error: %s\n", op_names[op], sizes[s].label,
                 fused ? "fused" : "composite", r->error);
          continue;
        }
        printf("%-22s %-17s %-9s %5d %6u %11.3f %11.3f %10.2f %11.1f\n", op_names[op],
               sizes[s].label, fused ? "fused" : "composite", sizes[s].runs, r->n_steps,
               r->median_ms, r->min_ms, (double)r->arena_bytes / (1 << 20),
               (double)r->maxrss_kb / 1024);
      }
      if (res[0].error[0] == '\0' && res[1].error[0] == '\0')
        printf("%-22s %-17s speed-up %.2fx, arena %.2fx of composite\n", "", "",
               res[1].median_ms / res[0].median_ms,
               (double)res[0].arena_bytes / (double)MAX(res[1].arena_bytes, 1));
    }
  return 0;
}
