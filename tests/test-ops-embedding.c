/* test-ops-embedding.c: "embedding" and "embedding_backward". */
#include "test-util.h"

#include <math.h>

#include <string.h>

static QkvValue *
build_embedding(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  return qkv_embedding(in[0], in[1], error);
}

/* The padding behaviour, asked for by name: an id out of range gives a zero
 * row and no gradient. */
static QkvValue *
build_embedding_zero(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "zero_out_of_range", g_variant_new_boolean(TRUE));
  return qkv_graph_op(graph, "embedding", in, 2, g_variant_builder_end(&attrs), error);
}

static QkvValue *
build_embedding_backward(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  return qkv_embedding_backward(in[0], in[1], GPOINTER_TO_INT(user_data), error);
}

static void
test_forward(void)
{
  /* weight rows [1 2], [3 4], [5 6]; ids -1 and 3 are out of range, which
   * zero_out_of_range turns into zero rows. */
  QkvShape sw = QKV_SHAPE(3, 2), si = QKV_SHAPE(2, 2);
  float w[] = {1, 2, 3, 4, 5, 6};
  gint32 ids[] = {2, 0, -1, 3};
  g_autoptr(QkvTensor) tw = qkv_tensor_new_f32(&sw, w);
  g_autoptr(QkvTensor) ti = qkv_tensor_new_i32(&si, ids);
  QkvTensor *in[] = {ti, tw};
  g_autoptr(QkvTensor) y = qkv_test_eval(2, in, build_embedding_zero, NULL);
  QkvShape want_shape = QKV_SHAPE(2, 2, 2);
  g_assert_true(qkv_shape_equal(qkv_tensor_shape(y), &want_shape));
  float want[] = {5, 6, 1, 2, 0, 0, 0, 0};
  qkv_assert_values(y, want, 8, 0);

  /* A scalar id gives one row. */
  QkvShape s0 = qkv_shape_scalar();
  gint32 one = 1;
  g_autoptr(QkvTensor) t0 = qkv_tensor_new_i32(&s0, &one);
  QkvTensor *in0[] = {t0, tw};
  g_autoptr(QkvTensor) y0 = qkv_test_eval(2, in0, build_embedding, NULL);
  g_assert_cmpint(qkv_tensor_rank(y0), ==, 1);
  float want0[] = {3, 4};
  qkv_assert_values(y0, want0, 2, 0);
}

static void
test_backward_forward(void)
{
  /* ids 2, 0, 2, 7 (out of range): row 0 = dy1, row 1 = 0, row 2 = dy0 + dy2. */
  QkvShape sd = QKV_SHAPE(4, 2), si = QKV_SHAPE(4);
  float dy[] = {1, 2, 10, 20, 100, 200, 1000, 2000};
  gint32 ids[] = {2, 0, 2, 7};
  g_autoptr(QkvTensor) td = qkv_tensor_new_f32(&sd, dy);
  g_autoptr(QkvTensor) ti = qkv_tensor_new_i32(&si, ids);
  QkvTensor *in[] = {td, ti};
  g_autoptr(QkvTensor) dw = qkv_test_eval(2, in, build_embedding_backward, GINT_TO_POINTER(3));
  QkvShape want_shape = QKV_SHAPE(3, 2);
  g_assert_true(qkv_shape_equal(qkv_tensor_shape(dw), &want_shape));
  float want[] = {10, 20, 0, 0, 101, 202};
  qkv_assert_values(dw, want, 6, 0);
}

/* Big enough for the threaded scatter-add (threads own column ranges), with
 * many repeated ids: compare with a serial sum. */
static void
test_backward_large(void)
{
  const gint64 n = 1200, v = 40, d = 257;
  QkvShape sd = QKV_SHAPE(3, n / 3, d), si = QKV_SHAPE(3, n / 3);
  g_autoptr(QkvTensor) dy = qkv_test_uniform(&sd, 1, -1, 1);
  g_autoptr(QkvTensor) ids = qkv_test_randint(&si, 2, -2, (gint32)v + 2);
  QkvTensor *in[] = {dy, ids};
  g_autoptr(QkvTensor) got =
      qkv_test_eval(2, in, build_embedding_backward, GINT_TO_POINTER((gint)v));

  QkvShape sw = QKV_SHAPE(v, d);
  g_autoptr(QkvTensor) want = qkv_tensor_new(QKV_F32, &sw);
  g_autoptr(QkvTensor) magnitude = qkv_tensor_new(QKV_F32, &sw);
  gint64 count[40] = {0}, most = 0;
  for (gint64 i = 0; i < n; i++) {
    gint32 id = qkv_tensor_i32(ids)[i];
    if (id < 0 || id >= v)
      continue;
    most = MAX(most, ++count[id]);
    for (gint64 c = 0; c < d; c++) {
      qkv_tensor_f32(want)[id * d + c] += qkv_tensor_f32(dy)[i * d + c];
      qkv_tensor_f32(magnitude)[id * d + c] += fabsf(qkv_tensor_f32(dy)[i * d + c]);
    }
  }
  /* Two float32 sums of the same rows (at most `most` terms) in any order:
   * 2 · gamma(most) times the sum of their magnitudes. */
  qkv_assert_bounded("scatter-add vs serial sum", got, want, magnitude,
                     2 * qkv_test_gamma((double)most) / QKV_TEST_U);

  /* And the lookup of the same ids from the large table. */
  g_autoptr(QkvTensor) w = qkv_test_uniform(&sw, 3, -1, 1);
  QkvTensor *fin[] = {ids, w};
  g_autoptr(QkvTensor) y = qkv_test_eval(2, fin, build_embedding_zero, NULL);
  for (gint64 i = 0; i < n; i++) {
    gint32 id = qkv_tensor_i32(ids)[i];
    for (gint64 c = 0; c < d; c += 17)
      g_assert_cmpfloat(qkv_tensor_get(y, i * d + c), ==,
                        id < 0 || id >= v ? 0.0 : qkv_tensor_get(w, id * d + c));
  }
}

static void
test_grad(void)
{
  /* Repeated ids (gradient rows add up), and one id out of range where the
   * node asks for zero rows. */
  QkvShape si = QKV_SHAPE(2, 3), sw = QKV_SHAPE(5, 4);
  gint32 ids[] = {1, 4, 1, 0, 9, 4};
  g_autoptr(QkvTensor) ti = qkv_tensor_new_i32(&si, ids);
  g_autoptr(QkvTensor) tw = qkv_test_uniform(&sw, 4, -1, 1);
  QkvTensor *in[] = {ti, tw};
  qkv_test_gradcheck("embedding zero_out_of_range", 2, in, NULL, build_embedding_zero, NULL);
  gint32 good_ids[] = {1, 4, 1, 0, 3, 4};
  g_autoptr(QkvTensor) tg = qkv_tensor_new_i32(&si, good_ids);
  QkvTensor *ing[] = {tg, tw};
  qkv_test_gradcheck("embedding", 2, ing, NULL, build_embedding, NULL);

  QkvShape si1 = QKV_SHAPE(7), sw1 = QKV_SHAPE(3, 5);
  g_autoptr(QkvTensor) ti1 = qkv_test_randint(&si1, 5, 0, 3);
  g_autoptr(QkvTensor) tw1 = qkv_test_uniform(&sw1, 6, -1, 1);
  QkvTensor *in1[] = {ti1, tw1};
  qkv_test_gradcheck("embedding rank 1", 2, in1, NULL, build_embedding, NULL);

  /* embedding_backward is linear in dy; its gradient is a lookup. */
  QkvShape sd = QKV_SHAPE(2, 3, 4);
  g_autoptr(QkvTensor) td = qkv_test_uniform(&sd, 7, -1, 1);
  QkvTensor *bin[] = {td, ti};
  qkv_test_gradcheck("embedding_backward", 2, bin, NULL, build_embedding_backward,
                     GINT_TO_POINTER(5));
}

/* An id outside [0, V) fails the run, naming the node, the position and
 * the value (it used to give a zero row). Of several bad ids, the first
 * position is reported whatever the thread count. */
static void
test_out_of_range_fails(void)
{
  QkvShape sw = QKV_SHAPE(3, 2), si = QKV_SHAPE(2, 2);
  float w[] = {1, 2, 3, 4, 5, 6};
  g_autoptr(QkvTensor) tw = qkv_tensor_new_f32(&sw, w);
  gint32 ids[] = {2, 0, 5, 1};
  g_autoptr(QkvTensor) ti = qkv_tensor_new_i32(&si, ids);
  QkvTensor *in[] = {ti, tw};
  qkv_test_assert_eval_fails(2, in, build_embedding, NULL, QKV_ERROR_INDEX,
                             "run: node 'embedding_0' (embedding): id 5 at position [1, 0] is "
                             "outside [0, 3)");
  gint32 negative[] = {2, -1, 0, 1};
  g_autoptr(QkvTensor) tn = qkv_tensor_new_i32(&si, negative);
  QkvTensor *inn[] = {tn, tw};
  qkv_test_assert_eval_fails(2, inn, build_embedding, NULL, QKV_ERROR_INDEX,
                             "(embedding): id -1 at position [0, 1] is outside [0, 3)");

  /* many rows, the loop split over threads, bad ids late in two chunks */
  QkvShape sbig = QKV_SHAPE(4000), swide = QKV_SHAPE(50, 64);
  g_autoptr(QkvTensor) big = qkv_test_randint(&sbig, 8, 0, 50);
  qkv_tensor_i32(big)[3999] = 50;
  qkv_tensor_i32(big)[2345] = 77;
  g_autoptr(QkvTensor) wide = qkv_test_uniform(&swide, 9, -1, 1);
  QkvTensor *inb[] = {big, wide};
  qkv_test_assert_eval_fails(2, inb, build_embedding, NULL, QKV_ERROR_INDEX,
                             "(embedding): id 77 at position [2345] is outside [0, 50)");
}

/* ---- bad input -------------------------------------------------------- */

static void
test_bad_input(void)
{
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvValue *ids = qkv_test_input(g, "ids", QKV_I32, QKV_SHAPE(2, 3));
  QkvValue *fids = qkv_test_input(g, "fids", QKV_F32, QKV_SHAPE(2, 3));
  QkvValue *w = qkv_test_input(g, "w", QKV_F32, QKV_SHAPE(5, 4));
  QkvValue *w1 = qkv_test_input(g, "w1", QKV_F32, QKV_SHAPE(20));
  QkvValue *wi = qkv_test_input(g, "wi", QKV_I32, QKV_SHAPE(5, 4));
  QkvValue *dy = qkv_test_input(g, "dy", QKV_F32, QKV_SHAPE(2, 3, 4));
  QkvValue *dy_bad = qkv_test_input(g, "dy_bad", QKV_F32, QKV_SHAPE(3, 2, 4));
  QkvValue *ids5 = qkv_test_input(g, "ids5", QKV_I32, QKV_SHAPE(1, 1, 1, 1, 1, 1));

  qkv_assert_op_fails(g, "'embedding'", QKV_ERROR_DTYPE, qkv_embedding(fids, w, &error_));
  qkv_assert_op_fails(g, "'embedding'", QKV_ERROR_DTYPE, qkv_embedding(ids, wi, &error_));
  qkv_assert_op_fails(g, "'embedding'", QKV_ERROR_SHAPE, qkv_embedding(ids, w1, &error_));
  qkv_assert_op_fails(g, "'embedding'", QKV_ERROR_SHAPE, qkv_embedding(ids5, w, &error_));
  qkv_assert_op_fails(g, "embedding_backward", QKV_ERROR_SHAPE,
                      qkv_embedding_backward(dy_bad, ids, 5, &error_));
  qkv_assert_op_fails(g, "embedding_backward", QKV_ERROR_DTYPE,
                      qkv_embedding_backward(dy, fids, 5, &error_));
  qkv_assert_op_fails(g, "embedding_backward", QKV_ERROR_ATTRIBUTE,
                      qkv_embedding_backward(dy, ids, -1, &error_));
  QkvValue *pair[] = {dy, ids};
  qkv_assert_op_fails(g, "embedding_backward", QKV_ERROR_ATTRIBUTE,
                      qkv_graph_op(g, "embedding_backward", pair, 2, NULL, &error_));
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  g_test_add_func("/embedding/forward", test_forward);
  g_test_add_func("/embedding/backward-op", test_backward_forward);
  g_test_add_func("/embedding/backward-large", test_backward_large);
  g_test_add_func("/embedding/grad", test_grad);
  g_test_add_func("/embedding/out-of-range-fails", test_out_of_range_fails);
  g_test_add_func("/embedding/bad-input", test_bad_input);
  return g_test_run();
}
