/* test-tensor.c: tensors and shapes. */
#include "test-util.h"

#include <math.h>
#include <string.h>

static void
test_create_and_query(void)
{
  for (gint rank = 0; rank <= QKV_MAX_RANK; rank++) {
    gint64 dims[QKV_MAX_RANK];
    gint64 numel = 1;
    for (gint i = 0; i < rank; i++) {
      dims[i] = i + 2;
      numel *= dims[i];
    }
    QkvShape s = qkv_shape_from_array(rank, dims);
    g_autoptr(QkvTensor) t = qkv_tensor_new(QKV_F32, &s);
    g_assert_cmpint(qkv_tensor_rank(t), ==, rank);
    g_assert_cmpint(qkv_tensor_numel(t), ==, numel);
    g_assert_cmpuint(qkv_tensor_nbytes(t), ==, (gsize)numel * 4);
    g_assert_true(qkv_tensor_owns_data(t));
    g_assert_cmpuint((guintptr)qkv_tensor_data(t) % 64, ==, 0);
    for (gint64 i = 0; i < numel; i++)
      g_assert_cmpfloat(qkv_tensor_get(t, i), ==, 0.0);
    if (rank > 0)
      g_assert_cmpint(qkv_tensor_dim(t, -1), ==, dims[rank - 1]);
  }
}

static void
test_fill_copy(void)
{
  QkvShape s = QKV_SHAPE(2, 3);
  g_autoptr(QkvTensor) a = qkv_tensor_new(QKV_F32, &s);
  qkv_tensor_fill(a, 2.5);
  g_autoptr(QkvTensor) b = qkv_tensor_copy(a);
  g_assert_true(qkv_tensor_data(a) != qkv_tensor_data(b));
  for (gint i = 0; i < 6; i++)
    g_assert_cmpfloat(qkv_tensor_get(b, i), ==, 2.5);
  qkv_tensor_f32(a)[4] = -1.0f;
  g_assert_cmpfloat(qkv_tensor_get(b, 4), ==, 2.5);
  g_autoptr(GError) error = NULL;
  g_assert_true(qkv_tensor_copy_from(b, a, &error));
  g_assert_cmpfloat(qkv_tensor_get(b, 4), ==, -1.0);

  QkvShape s2 = QKV_SHAPE(3, 2);
  g_autoptr(QkvTensor) c = qkv_tensor_new(QKV_F32, &s2);
  g_assert_false(qkv_tensor_copy_from(c, a, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_SHAPE);

  gint32 ids[] = {1, 2, 3, 4};
  QkvShape s4 = QKV_SHAPE(4);
  g_autoptr(QkvTensor) i = qkv_tensor_new_i32(&s4, ids);
  g_assert_cmpint(qkv_tensor_dtype(i), ==, QKV_I32);
  g_assert_cmpint(qkv_tensor_i32(i)[3], ==, 4);
  qkv_tensor_fill(i, 7);
  g_assert_cmpint(qkv_tensor_i32(i)[0], ==, 7);
}

static void
test_borrowed(void)
{
  float data[6] = {1, 2, 3, 4, 5, 6};
  QkvShape s = QKV_SHAPE(3, 2);
  QkvTensor *t = qkv_tensor_new_borrowed(QKV_F32, &s, data);
  g_assert_false(qkv_tensor_owns_data(t));
  g_assert_true(qkv_tensor_data(t) == data);
  qkv_tensor_f32(t)[0] = 10;
  g_assert_cmpfloat(data[0], ==, 10);
  qkv_tensor_free(t);
  g_assert_cmpfloat(data[5], ==, 6); /* still ours */
}

static void
test_shapes(void)
{
  QkvShape a = QKV_SHAPE(2, 1, 3), b = QKV_SHAPE(4, 1), out;
  g_assert_true(qkv_shape_broadcast(&a, &b, &out));
  QkvShape want = QKV_SHAPE(2, 4, 3);
  g_assert_true(qkv_shape_equal(&out, &want));
  QkvShape c = QKV_SHAPE(2, 3), d = QKV_SHAPE(3, 2);
  g_assert_false(qkv_shape_broadcast(&c, &d, &out));
  QkvShape sc = qkv_shape_scalar();
  g_assert_true(qkv_shape_broadcast(&sc, &c, &out));
  g_assert_true(qkv_shape_equal(&out, &c));
  g_autofree gchar *str = qkv_shape_to_string(&a);
  g_assert_cmpstr(str, ==, "(2, 1, 3)");
  g_autofree gchar *str0 = qkv_shape_to_string(&sc);
  g_assert_cmpstr(str0, ==, "()");
  g_assert_cmpint(qkv_shape_numel(&sc), ==, 1);
  g_assert_cmpstr(qkv_dtype_name(QKV_I32), ==, "i32");
}

/* The vectorised dropout mask draws exactly what qkv_random_uniform draws. */
static void
test_dropout_mask_matches_draws(void)
{
  const gsize n = 1003;
  const float p = 0.3f;
  float *mask = g_new(float, n);
  guint64 key = qkv_random_key(42, 7, 3);
  qkv_random_dropout_mask(key, 5, n, p, mask);
  gsize dropped = 0;
  for (gsize j = 0; j < n; j++) {
    float want = qkv_random_uniform(key, 5 + j) < p ? 0.0f : (float)(1.0 / (1.0 - p));
    g_assert_cmpfloat(mask[j], ==, want);
    dropped += mask[j] == 0.0f;
  }
  g_assert_cmpuint(dropped, >, n / 5);
  g_assert_cmpuint(dropped, <, n * 2 / 5);
  /* another step gives another mask */
  float *other = g_new(float, n);
  qkv_random_dropout_mask(qkv_random_key(42, 8, 3), 5, n, p, other);
  g_assert_true(memcmp(mask, other, n * sizeof(float)) != 0);
  g_free(other);
  g_free(mask);
}

static void
check_string(QkvTensor *t, gint64 threshold, gint edge, const gchar *want)
{
  g_autofree gchar *got = qkv_tensor_to_string_full(t, threshold, edge);
  g_assert_cmpstr(got, ==, want);
  qkv_tensor_free(t);
}

static QkvTensor *
arange_i32(const QkvShape *shape)
{
  QkvTensor *t = qkv_tensor_new(QKV_I32, shape);
  for (gint64 i = 0; i < qkv_tensor_numel(t); i++)
    qkv_tensor_i32(t)[i] = (gint32)i;
  return t;
}

/* The expected strings of the i32 cases are NumPy's
 * np.array2string(a, separator=', ') with the same threshold and edge items. */
static void
test_to_string(void)
{
  QkvShape s23 = QKV_SHAPE(2, 3), s3 = QKV_SHAPE(3), scalar = qkv_shape_scalar();
  check_string(qkv_tensor_new_f32(&s23, (const float[]){1, 2.5f, -3, 4, 5, 6}), 1000, 3,
               "[[ 1., 2.5, -3.],\n [ 4.,  5.,  6.]] f32(2, 3)");
  check_string(qkv_tensor_new_f32(&scalar, (const float[]){3.5f}), 1000, 3, "3.5 f32()");
  check_string(qkv_tensor_new_f32(&s3, (const float[]){NAN, -INFINITY, 1e-7f}), 1000, 3,
               "[  nan,  -inf, 1e-07] f32(3)");
  check_string(qkv_tensor_new_i32(&s3, (const gint32[]){1, -20, 300}), 1000, 3,
               "[  1, -20, 300] i32(3)");
  QkvShape s222 = QKV_SHAPE(2, 2, 2);
  check_string(arange_i32(&s222), 1000, 3,
               "[[[0, 1],\n  [2, 3]],\n\n [[4, 5],\n  [6, 7]]] i32(2, 2, 2)");
  QkvShape s6 = QKV_SHAPE(1, 1, 1, 1, 1, 2);
  check_string(arange_i32(&s6), 1000, 3, "[[[[[[0, 1]]]]]] i32(1, 1, 1, 1, 1, 2)");
  QkvShape empty = QKV_SHAPE(0);
  check_string(qkv_tensor_new(QKV_F32, &empty), 1000, 3, "[] f32(0)");
}

static void
test_to_string_summarised(void)
{
  QkvShape s = QKV_SHAPE(2, 1000);
  check_string(arange_i32(&s), QKV_PRINT_THRESHOLD, QKV_PRINT_EDGE_ITEMS,
               "[[   0,    1,    2, ...,  997,  998,  999],\n"
               " [1000, 1001, 1002, ..., 1997, 1998, 1999]] i32(2, 1000)");
  QkvShape s55 = QKV_SHAPE(5, 5), s333 = QKV_SHAPE(3, 3, 3);
  check_string(arange_i32(&s55), 10, 1, "[[ 0, ...,  4],\n ...,\n [20, ..., 24]] i32(5, 5)");
  check_string(arange_i32(&s333), 10, 1,
               "[[[ 0, ...,  2],\n  ...,\n  [ 6, ...,  8]],\n\n ...,\n\n"
               " [[18, ..., 20],\n  ...,\n  [24, ..., 26]]] i32(3, 3, 3)");
  /* at the threshold nothing is left out */
  QkvShape s10 = QKV_SHAPE(10);
  check_string(arange_i32(&s10), 10, 1, "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9] i32(10)");
  /* the default: a million elements print in a few lines */
  QkvShape big = QKV_SHAPE(1000, 1000);
  g_autoptr(QkvTensor) t = qkv_tensor_new(QKV_F32, &big);
  g_autofree gchar *str = qkv_tensor_to_string(t);
  g_assert_cmpstr(
      str, ==,
      "[[0., 0., 0., ..., 0., 0., 0.],\n [0., 0., 0., ..., 0., 0., 0.],\n"
      " [0., 0., 0., ..., 0., 0., 0.],\n ...,\n [0., 0., 0., ..., 0., 0., 0.],\n"
      " [0., 0., 0., ..., 0., 0., 0.],\n [0., 0., 0., ..., 0., 0., 0.]] f32(1000, 1000)");
}

/* An empty tensor has no elements but may have many rows: those summarise
 * too, so the string stays short and the call returns. */
static void
test_to_string_empty_rows(void)
{
  QkvShape million = QKV_SHAPE(1000000, 0);
  check_string(qkv_tensor_new(QKV_F32, &million), QKV_PRINT_THRESHOLD, QKV_PRINT_EDGE_ITEMS,
               "[[],\n [],\n [],\n ...,\n [],\n [],\n []] f32(1000000, 0)");
  QkvShape huge = QKV_SHAPE((gint64)1 << 40, 0);
  check_string(qkv_tensor_new(QKV_I32, &huge), QKV_PRINT_THRESHOLD, QKV_PRINT_EDGE_ITEMS,
               "[[],\n [],\n [],\n ...,\n [],\n [],\n []] i32(1099511627776, 0)");
  /* 3 · 4 = 12 rows above a threshold of 10: both axes longer than 2 are
   * summarised */
  QkvShape s340 = QKV_SHAPE(3, 4, 0);
  check_string(qkv_tensor_new(QKV_F32, &s340), 10, 1,
               "[[[],\n  ...,\n  []],\n\n ...,\n\n [[],\n  ...,\n  []]] f32(3, 4, 0)");
  /* an empty axis first: nothing below it prints */
  QkvShape s0big = QKV_SHAPE(0, (gint64)1 << 40);
  check_string(qkv_tensor_new(QKV_F32, &s0big), QKV_PRINT_THRESHOLD, QKV_PRINT_EDGE_ITEMS,
               "[] f32(0, 1099511627776)");
  /* at or below the threshold every row prints */
  QkvShape s30 = QKV_SHAPE(3, 0);
  check_string(qkv_tensor_new(QKV_F32, &s30), 3, 1, "[[],\n [],\n []] f32(3, 0)");
}

/* edge_items 0 shows a summarised axis as "..." alone; a negative count is
 * taken as 0. Nothing is logged (a critical would abort the test). */
static void
test_to_string_no_edge_items(void)
{
  QkvShape s55 = QKV_SHAPE(5, 5), s3 = QKV_SHAPE(3);
  check_string(arange_i32(&s55), 10, 0, "[...] i32(5, 5)");
  check_string(arange_i32(&s55), 10, -3, "[...] i32(5, 5)");
  /* below the threshold the edge count does not matter */
  check_string(arange_i32(&s3), 10, 0, "[0, 1, 2] i32(3)");
  QkvShape empty = QKV_SHAPE(0);
  check_string(qkv_tensor_new(QKV_F32, &empty), -1, 0, "[] f32(0)");
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  g_test_add_func("/tensor/create-and-query", test_create_and_query);
  g_test_add_func("/tensor/fill-copy", test_fill_copy);
  g_test_add_func("/tensor/borrowed", test_borrowed);
  g_test_add_func("/tensor/shapes", test_shapes);
  g_test_add_func("/tensor/dropout-mask-matches-draws", test_dropout_mask_matches_draws);
  g_test_add_func("/tensor/to-string", test_to_string);
  g_test_add_func("/tensor/to-string-summarised", test_to_string_summarised);
  g_test_add_func("/tensor/to-string-empty-rows", test_to_string_empty_rows);
  g_test_add_func("/tensor/to-string-no-edge-items", test_to_string_no_edge_items);
  return g_test_run();
}
