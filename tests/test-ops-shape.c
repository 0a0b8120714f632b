/* test-ops-shape.c: "reshape", "permute", "slice", "concat" and
 * "slice_backward": forward values, gradients and bad input. */
#include "test-util.h"

#include <string.h>

static QkvTensor *
arange(const QkvShape *shape, QkvDType dtype)
{
  QkvTensor *t = qkv_tensor_new(dtype, shape);
  for (gint64 i = 0; i < qkv_tensor_numel(t); i++) {
    if (dtype == QKV_F32)
      qkv_tensor_f32(t)[i] = (float)i;
    else
      qkv_tensor_i32(t)[i] = (gint32)i;
  }
  return t;
}

static void
assert_shape(const QkvTensor *t, const QkvShape *want)
{
  g_autofree gchar *got = qkv_shape_to_string(qkv_tensor_shape(t));
  g_autofree gchar *exp = qkv_shape_to_string(want);
  g_assert_cmpstr(got, ==, exp);
}

/* The call failed with a QKV_ERROR naming op, and added no node. */
#define assert_op_fails_any_code(graph, op, call)                                                  \
  G_STMT_START                                                                                     \
  {                                                                                                \
    guint n_nodes_ = qkv_graph_n_nodes(graph);                                                     \
    GError *error_ = NULL;                                                                         \
    QkvValue *v_ = (call);                                                                         \
    g_assert_null(v_);                                                                             \
    g_assert_nonnull(error_);                                                                      \
    g_assert_true(error_->domain == QKV_ERROR);                                                    \
    if (strstr(error_->message, op) == NULL)                                                       \
      g_error("error message '%s' does not name '%s'", error_->message, op);                       \
    g_test_message("%s", error_->message);                                                         \
    g_assert_cmpuint(qkv_graph_n_nodes(graph), ==, n_nodes_);                                      \
    g_clear_error(&error_);                                                                        \
  }                                                                                                \
  G_STMT_END

/* ---- reshape ---------------------------------------------------------- */

static QkvValue *
build_reshape(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  return qkv_reshape(in[0], user_data, error);
}

/* reshape of an intermediate, which the planner may run in place. */
static QkvValue *
build_scaled_reshape(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  QkvValue *x = qkv_scale(in[0], 2.0, error);
  QkvValue *y = x != NULL ? qkv_reshape(x, user_data, error) : NULL;
  return y != NULL ? qkv_scale(y, 0.5, error) : NULL;
}

static void
test_reshape_forward(void)
{
  QkvShape s23 = QKV_SHAPE(2, 3), s32 = QKV_SHAPE(3, 2), s3m = QKV_SHAPE(3, -1);
  QkvShape s6 = QKV_SHAPE(6), s1231 = QKV_SHAPE(1, 2, 3, 1);
  g_autoptr(QkvTensor) x = arange(&s23, QKV_F32);
  float want[] = {0, 1, 2, 3, 4, 5};

  QkvTensor *in[] = {x};
  g_autoptr(QkvTensor) y = qkv_test_eval(1, in, build_reshape, &s3m);
  assert_shape(y, &s32);
  qkv_assert_values(y, want, 6, 0);
  g_autoptr(QkvTensor) y2 = qkv_test_eval(1, in, build_reshape, &s1231);
  assert_shape(y2, &s1231);
  qkv_assert_values(y2, want, 6, 0);
  g_autoptr(QkvTensor) y3 = qkv_test_eval(1, in, build_scaled_reshape, &s6);
  assert_shape(y3, &s6);
  qkv_assert_values(y3, want, 6, 0);

  /* i32 keeps its dtype. */
  g_autoptr(QkvTensor) xi = arange(&s23, QKV_I32);
  QkvTensor *ini[] = {xi};
  g_autoptr(QkvTensor) yi = qkv_test_eval(1, ini, build_reshape, &s6);
  g_assert_cmpint(qkv_tensor_dtype(yi), ==, QKV_I32);
  qkv_assert_values(yi, want, 6, 0);

  /* To a scalar and back. */
  QkvShape s1 = QKV_SHAPE(1), scalar = qkv_shape_scalar();
  float v = 4.5f;
  g_autoptr(QkvTensor) one = qkv_tensor_new_f32(&s1, &v);
  QkvTensor *in1[] = {one};
  g_autoptr(QkvTensor) ys = qkv_test_eval(1, in1, build_reshape, &scalar);
  g_assert_cmpint(qkv_tensor_rank(ys), ==, 0);
  qkv_assert_values(ys, &v, 1, 0);
}

static void
test_reshape_grad(void)
{
  QkvShape s = QKV_SHAPE(2, 3, 4), to[] = {QKV_SHAPE(4, -1), QKV_SHAPE(24), QKV_SHAPE(3, 2, 2, 2)};
  g_autoptr(QkvTensor) x = qkv_test_uniform(&s, 1, -1, 1);
  QkvTensor *in[] = {x};
  for (guint i = 0; i < G_N_ELEMENTS(to); i++) {
    qkv_test_gradcheck("reshape", 1, in, NULL, build_reshape, &to[i]);
    qkv_test_gradcheck("reshape in place", 1, in, NULL, build_scaled_reshape, &to[i]);
  }
}

/* ---- permute ---------------------------------------------------------- */

typedef struct {
  gint perm[QKV_MAX_RANK];
  guint n;
} Perm;

static QkvValue *
build_permute(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  const Perm *p = user_data;
  return qkv_permute(in[0], p->perm, p->n, error);
}

/* Reference: y[i0..] = x[index with axis perm[k] = ik]. */
static QkvTensor *
reference_permute(QkvTensor *x, const Perm *p)
{
  const QkvShape *xs = qkv_tensor_shape(x);
  QkvShape ys = {.rank = xs->rank};
  gint64 xstr[QKV_MAX_RANK], idx[QKV_MAX_RANK];
  for (gint i = 0; i < xs->rank; i++)
    ys.dims[i] = xs->dims[p->perm[i]];
  QkvTensor *y = qkv_tensor_new(QKV_F32, &ys);
  gint64 s = 1;
  for (gint i = xs->rank - 1; i >= 0; i--) {
    xstr[i] = s;
    s *= xs->dims[i];
  }
  for (gint64 e = 0; e < qkv_tensor_numel(y); e++) {
    gint64 rem = e, off = 0;
    for (gint i = ys.rank - 1; i >= 0; i--) {
      idx[i] = rem % ys.dims[i];
      rem /= ys.dims[i];
      off += idx[i] * xstr[p->perm[i]];
    }
    qkv_tensor_f32(y)[e] = qkv_tensor_f32(x)[off];
  }
  return y;
}

static void
test_permute_forward(void)
{
  /* A plain transpose. */
  QkvShape s23 = QKV_SHAPE(2, 3), s32 = QKV_SHAPE(3, 2);
  g_autoptr(QkvTensor) x = arange(&s23, QKV_F32);
  Perm t = {{1, 0}, 2};
  QkvTensor *in[] = {x};
  g_autoptr(QkvTensor) y = qkv_test_eval(1, in, build_permute, &t);
  float want[] = {0, 3, 1, 4, 2, 5};
  assert_shape(y, &s32);
  qkv_assert_values(y, want, 6, 0);

  /* Leading axes swap, the last stays: rows of 3 move whole. */
  QkvShape s223 = QKV_SHAPE(2, 2, 3);
  g_autoptr(QkvTensor) x3 = arange(&s223, QKV_F32);
  Perm p102 = {{1, 0, 2}, 3};
  QkvTensor *in3[] = {x3};
  g_autoptr(QkvTensor) y3 = qkv_test_eval(1, in3, build_permute, &p102);
  float want3[] = {0, 1, 2, 6, 7, 8, 3, 4, 5, 9, 10, 11};
  qkv_assert_values(y3, want3, 12, 0);

  /* (2, 3, 2) with perm (2, 0, 1): y[k][i][j] = x[i][j][k]. */
  QkvShape s232 = QKV_SHAPE(2, 3, 2);
  g_autoptr(QkvTensor) x4 = arange(&s232, QKV_F32);
  Perm p201 = {{2, 0, 1}, 3};
  QkvTensor *in4[] = {x4};
  g_autoptr(QkvTensor) y4 = qkv_test_eval(1, in4, build_permute, &p201);
  float want4[] = {0, 2, 4, 6, 8, 10, 1, 3, 5, 7, 9, 11};
  qkv_assert_values(y4, want4, 12, 0);

  /* Negative axes count from the end; i32 works too. */
  g_autoptr(QkvTensor) xi = arange(&s23, QKV_I32);
  Perm neg = {{-1, 0}, 2};
  QkvTensor *ini[] = {xi};
  g_autoptr(QkvTensor) yi = qkv_test_eval(1, ini, build_permute, &neg);
  g_assert_cmpint(qkv_tensor_dtype(yi), ==, QKV_I32);
  qkv_assert_values(yi, want, 6, 0);
}

/* Big enough for the parallel paths, against the reference. */
static void
test_permute_large(void)
{
  const struct {
    QkvShape shape;
    Perm perm;
  } cases[] = {
      {QKV_SHAPE(4, 64, 8, 128), {{0, 2, 1, 3}, 4}}, /* (B, T, H, D) → (B, H, T, D) */
      {QKV_SHAPE(4, 8, 64, 128), {{0, 2, 1, 3}, 4}}, /* and back */
      {QKV_SHAPE(3, 300, 300), {{0, 2, 1}, 3}},      /* batched transpose */
      {QKV_SHAPE(5, 7, 11, 13, 9), {{4, 2, 0, 3, 1}, 5}},
  };
  for (guint c = 0; c < G_N_ELEMENTS(cases); c++) {
    g_autoptr(QkvTensor) x = qkv_test_uniform(&cases[c].shape, c, -1, 1);
    QkvTensor *in[] = {x};
    g_autoptr(QkvTensor) got = qkv_test_eval(1, in, build_permute, (gpointer)&cases[c].perm);
    g_autoptr(QkvTensor) want = reference_permute(x, &cases[c].perm);
    qkv_assert_tensor_close(got, want, 0);
  }
}

static QkvValue *
build_transpose(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  const gint *axes = user_data;
  return qkv_transpose(in[0], axes[0], axes[1], error);
}

static void
test_permute_grad(void)
{
  QkvShape s = QKV_SHAPE(2, 3, 2, 4);
  g_autoptr(QkvTensor) x = qkv_test_uniform(&s, 3, -1, 1);
  QkvTensor *in[] = {x};
  Perm perms[] = {{{0, 2, 1, 3}, 4}, {{3, 1, 2, 0}, 4}, {{1, 2, 3, 0}, 4}, {{0, 1, 3, 2}, 4}};
  for (guint i = 0; i < G_N_ELEMENTS(perms); i++)
    qkv_test_gradcheck("permute", 1, in, NULL, build_permute, &perms[i]);

  gint axes[] = {-1, 1};
  qkv_test_gradcheck("transpose", 1, in, NULL, build_transpose, axes);
  g_autoptr(QkvTensor) y = qkv_test_eval(1, in, build_transpose, axes);
  QkvShape want = QKV_SHAPE(2, 4, 2, 3);
  assert_shape(y, &want);
}

/* ---- slice ------------------------------------------------------------ */

typedef struct {
  gint axis;
  gint64 start, end;
} Slice;

static QkvValue *
build_slice(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  const Slice *s = user_data;
  return qkv_slice(in[0], s->axis, s->start, s->end, error);
}

static void
test_slice_forward(void)
{
  QkvShape s34 = QKV_SHAPE(3, 4);
  g_autoptr(QkvTensor) x = arange(&s34, QKV_F32);
  QkvTensor *in[] = {x};

  Slice cols = {1, 1, 3};
  g_autoptr(QkvTensor) y = qkv_test_eval(1, in, build_slice, &cols);
  QkvShape s32 = QKV_SHAPE(3, 2);
  float want[] = {1, 2, 5, 6, 9, 10};
  assert_shape(y, &s32);
  qkv_assert_values(y, want, 6, 0);

  /* Negative axis and start: rows 1 and 2. */
  Slice rows = {-2, -2, 3};
  g_autoptr(QkvTensor) y2 = qkv_test_eval(1, in, build_slice, &rows);
  float want2[] = {4, 5, 6, 7, 8, 9, 10, 11};
  qkv_assert_values(y2, want2, 8, 0);

  /* Negative end: the last column dropped. */
  Slice drop_last = {1, 0, -1};
  g_autoptr(QkvTensor) y3 = qkv_test_eval(1, in, build_slice, &drop_last);
  float want3[] = {0, 1, 2, 4, 5, 6, 8, 9, 10};
  qkv_assert_values(y3, want3, 9, 0);
}

static void
test_slice_grad(void)
{
  QkvShape s = QKV_SHAPE(3, 5, 4);
  g_autoptr(QkvTensor) x = qkv_test_uniform(&s, 4, -1, 1);
  QkvTensor *in[] = {x};
  Slice cases[] = {{0, 1, 3}, {1, 2, 5}, {-1, -3, -1}, {1, 0, 1}};
  for (guint i = 0; i < G_N_ELEMENTS(cases); i++)
    qkv_test_gradcheck("slice", 1, in, NULL, build_slice, &cases[i]);
}

/* ---- slice_backward --------------------------------------------------- */

typedef struct {
  QkvShape shape;
  gint axis;
  gint64 start;
} SliceBackward;

static QkvValue *
build_slice_backward(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  const SliceBackward *s = user_data;
  return qkv_slice_backward(in[0], &s->shape, s->axis, s->start, error);
}

static void
test_slice_backward_forward(void)
{
  QkvShape s22 = QKV_SHAPE(2, 2);
  float dy[] = {1, 2, 3, 4};
  g_autoptr(QkvTensor) t = qkv_tensor_new_f32(&s22, dy);
  QkvTensor *in[] = {t};
  SliceBackward sb = {QKV_SHAPE(2, 4), 1, 1};
  g_autoptr(QkvTensor) y = qkv_test_eval(1, in, build_slice_backward, &sb);
  float want[] = {0, 1, 2, 0, 0, 3, 4, 0};
  assert_shape(y, &sb.shape);
  qkv_assert_values(y, want, 8, 0);

  /* Along the first axis, with a negative start: the last two rows of 3. */
  SliceBackward rows = {QKV_SHAPE(3, 2), 0, -2};
  g_autoptr(QkvTensor) y2 = qkv_test_eval(1, in, build_slice_backward, &rows);
  float want2[] = {0, 0, 1, 2, 3, 4};
  qkv_assert_values(y2, want2, 6, 0);
}

static void
test_slice_backward_grad(void)
{
  QkvShape s = QKV_SHAPE(3, 2, 4);
  g_autoptr(QkvTensor) dy = qkv_test_uniform(&s, 5, -1, 1);
  QkvTensor *in[] = {dy};
  SliceBackward cases[] = {{QKV_SHAPE(3, 5, 4), 1, 2}, {QKV_SHAPE(7, 2, 4), 0, 0}};
  for (guint i = 0; i < G_N_ELEMENTS(cases); i++)
    qkv_test_gradcheck("slice_backward", 1, in, NULL, build_slice_backward, &cases[i]);
}

/* ---- concat ----------------------------------------------------------- */

static QkvValue *
build_concat(QkvGraph *graph, QkvValue *const *in, gpointer user_data, GError **error)
{
  const gint *spec = user_data; /* axis, n */
  return qkv_concat(in, (guint)spec[1], spec[0], error);
}

static void
test_concat_forward(void)
{
  QkvShape s21 = QKV_SHAPE(2, 1), s22 = QKV_SHAPE(2, 2);
  float a[] = {1, 2}, b[] = {3, 4, 5, 6};
  g_autoptr(QkvTensor) ta = qkv_tensor_new_f32(&s21, a);
  g_autoptr(QkvTensor) tb = qkv_tensor_new_f32(&s22, b);
  QkvTensor *in[] = {ta, tb};
  gint axis1[] = {1, 2};
  g_autoptr(QkvTensor) y = qkv_test_eval(2, in, build_concat, axis1);
  QkvShape s23 = QKV_SHAPE(2, 3);
  float want[] = {1, 3, 4, 2, 5, 6};
  assert_shape(y, &s23);
  qkv_assert_values(y, want, 6, 0);

  /* Axis 0 (given as -2), three inputs. */
  QkvShape s12 = QKV_SHAPE(1, 2);
  float c[] = {7, 8};
  g_autoptr(QkvTensor) tc = qkv_tensor_new_f32(&s12, c);
  QkvTensor *in0[] = {tb, tc, tb};
  gint axis0[] = {-2, 3};
  g_autoptr(QkvTensor) y0 = qkv_test_eval(3, in0, build_concat, axis0);
  QkvShape s52 = QKV_SHAPE(5, 2);
  float want0[] = {3, 4, 5, 6, 7, 8, 3, 4, 5, 6};
  assert_shape(y0, &s52);
  qkv_assert_values(y0, want0, 10, 0);

  /* A single input is a copy. */
  QkvTensor *in1[] = {tb};
  gint single[] = {0, 1};
  g_autoptr(QkvTensor) y1 = qkv_test_eval(1, in1, build_concat, single);
  qkv_assert_values(y1, b, 4, 0);
}

static void
test_concat_grad(void)
{
  QkvShape sa = QKV_SHAPE(2, 3, 4), sb = QKV_SHAPE(2, 1, 4), sc = QKV_SHAPE(2, 5, 4);
  g_autoptr(QkvTensor) a = qkv_test_uniform(&sa, 6, -1, 1);
  g_autoptr(QkvTensor) b = qkv_test_uniform(&sb, 7, -1, 1);
  g_autoptr(QkvTensor) c = qkv_test_uniform(&sc, 8, -1, 1);
  QkvTensor *in[] = {a, b, c};
  gint axis1[] = {1, 3};
  qkv_test_gradcheck("concat axis 1", 3, in, NULL, build_concat, axis1);
  gboolean skip_b[] = {TRUE, FALSE, TRUE};
  qkv_test_gradcheck("concat axis 1, b constant", 3, in, skip_b, build_concat, axis1);

  QkvShape sd = QKV_SHAPE(2, 3, 1);
  g_autoptr(QkvTensor) d = qkv_test_uniform(&sd, 9, -1, 1);
  QkvTensor *in2[] = {a, d};
  gint axis_last[] = {-1, 2};
  qkv_test_gradcheck("concat last axis", 2, in2, NULL, build_concat, axis_last);
}

/* ---- bad input -------------------------------------------------------- */

static void
test_bad_input(void)
{
  g_autoptr(QkvGraph) g = qkv_graph_new();
  QkvValue *x = qkv_test_input(g, "x", QKV_F32, QKV_SHAPE(2, 3));
  QkvValue *y = qkv_test_input(g, "y", QKV_F32, QKV_SHAPE(2, 4));
  QkvValue *z = qkv_test_input(g, "z", QKV_F32, QKV_SHAPE(2, 3, 1));
  QkvValue *xi = qkv_test_input(g, "xi", QKV_I32, QKV_SHAPE(2, 3));
  QkvValue *dy = qkv_test_input(g, "dy", QKV_F32, QKV_SHAPE(2, 2));

  /* reshape: wrong element count, two -1, a negative dim. */
  QkvShape s5 = QKV_SHAPE(5), s_two = QKV_SHAPE(-1, -1), s_neg = QKV_SHAPE(-2, -3),
           s_4m = QKV_SHAPE(4, -1);
  assert_op_fails_any_code(g, "reshape", qkv_reshape(x, &s5, &error_));
  assert_op_fails_any_code(g, "reshape", qkv_reshape(x, &s_two, &error_));
  assert_op_fails_any_code(g, "reshape", qkv_reshape(x, &s_neg, &error_));
  assert_op_fails_any_code(g, "reshape", qkv_reshape(x, &s_4m, &error_));
  assert_op_fails_any_code(g, "reshape", qkv_graph_op(g, "reshape", &x, 1, NULL, &error_));

  /* permute: wrong length, repeated axis, axis out of range. */
  gint p_short[] = {0}, p_dup[] = {0, 0}, p_far[] = {0, 2};
  assert_op_fails_any_code(g, "permute", qkv_permute(x, p_short, 1, &error_));
  assert_op_fails_any_code(g, "permute", qkv_permute(x, p_dup, 2, &error_));
  assert_op_fails_any_code(g, "permute", qkv_permute(x, p_far, 2, &error_));
  assert_op_fails_any_code(g, "permute", qkv_transpose(x, 0, 2, &error_));
  assert_op_fails_any_code(g, "permute", qkv_graph_op(g, "permute", &x, 1, NULL, &error_));

  /* slice: past the end, start after end, bad axis, missing attribute. */
  assert_op_fails_any_code(g, "slice", qkv_slice(x, 1, 0, 4, &error_));
  assert_op_fails_any_code(g, "slice", qkv_slice(x, 1, 2, 1, &error_));
  assert_op_fails_any_code(g, "slice", qkv_slice(x, 1, -4, 2, &error_));
  assert_op_fails_any_code(g, "slice", qkv_slice(x, 2, 0, 1, &error_));
  assert_op_fails_any_code(g, "slice", qkv_slice(x, -3, 0, 1, &error_));
  GVariantBuilder attrs;
  g_variant_builder_init(&attrs, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add(&attrs, "{sv}", "axis", g_variant_new_int64(0));
  g_variant_builder_add(&attrs, "{sv}", "start", g_variant_new_int64(0));
  assert_op_fails_any_code(g, "slice",
                           qkv_graph_op(g, "slice", &x, 1, g_variant_builder_end(&attrs), &error_));

  /* concat: other axes differ, ranks differ, dtypes differ, bad axis. */
  QkvValue *xy[] = {x, y}, *xz[] = {x, z}, *xxi[] = {x, xi};
  assert_op_fails_any_code(g, "concat", qkv_concat(xy, 2, 0, &error_));
  assert_op_fails_any_code(g, "concat", qkv_concat(xz, 2, 1, &error_));
  assert_op_fails_any_code(g, "concat", qkv_concat(xxi, 2, 0, &error_));
  assert_op_fails_any_code(g, "concat", qkv_concat(xy, 2, 2, &error_));
  assert_op_fails_any_code(g, "concat", qkv_graph_op(g, "concat", xy, 2, NULL, &error_));

  /* slice_backward: dy does not fit, ranks differ, dy bigger than the input
   * on another axis (smaller is a plan's smaller batch, and is allowed). */
  QkvShape s23 = QKV_SHAPE(2, 3), s3 = QKV_SHAPE(3), s32 = QKV_SHAPE(1, 3);
  assert_op_fails_any_code(g, "slice_backward", qkv_slice_backward(dy, &s23, 1, 2, &error_));
  assert_op_fails_any_code(g, "slice_backward", qkv_slice_backward(dy, &s3, 0, 0, &error_));
  assert_op_fails_any_code(g, "slice_backward", qkv_slice_backward(dy, &s32, 1, 0, &error_));
  assert_op_fails_any_code(g, "slice_backward", qkv_slice_backward(dy, &s23, 2, 0, &error_));

  /* The good forms still work. */
  g_autoptr(GError) error = NULL;
  QkvValue *ok = qkv_concat(xy, 2, 1, &error);
  g_assert_no_error(error);
  QkvShape want = QKV_SHAPE(2, 7);
  g_assert_true(qkv_shape_equal(qkv_value_shape(ok), &want));
  ok = qkv_slice(x, 1, -1, 3, &error);
  g_assert_no_error(error);
  want = QKV_SHAPE(2, 1);
  g_assert_true(qkv_shape_equal(qkv_value_shape(ok), &want));
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  g_test_add_func("/shape/reshape/forward", test_reshape_forward);
  g_test_add_func("/shape/reshape/grad", test_reshape_grad);
  g_test_add_func("/shape/permute/forward", test_permute_forward);
  g_test_add_func("/shape/permute/large", test_permute_large);
  g_test_add_func("/shape/permute/grad", test_permute_grad);
  g_test_add_func("/shape/slice/forward", test_slice_forward);
  g_test_add_func("/shape/slice/grad", test_slice_grad);
  g_test_add_func("/shape/slice_backward/forward", test_slice_backward_forward);
  g_test_add_func("/shape/slice_backward/grad", test_slice_backward_grad);
  g_test_add_func("/shape/concat/forward", test_concat_forward);
  g_test_add_func("/shape/concat/grad", test_concat_grad);
  g_test_add_func("/shape/bad-input", test_bad_input);
  return g_test_run();
}
