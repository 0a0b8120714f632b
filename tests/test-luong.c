/* test-luong.c: the Luong attention builders (graph/luong.c). The seq2seq
 * against PyTorch (tests/reference/luong_ref.py) for every score function,
 * alignment and input feeding; the gradients against finite differences on a
 * tiny model; the local windows; refused configs that leave the graph and the
 * store as they were. */
#include "test-util.h"

#include <math.h>
#include <string.h>
#include <qkv/qkv-checkpoint.h>

typedef struct {
  const gchar *name; /* tests/data/luong_<name>_ref_*.safetensors */
  QkvLuongScore score;
  QkvLuongAlign align;
  gint window;
  gboolean feed;
} Variant;

/* as VARIANTS in tests/reference/luong_ref.py */
static const Variant variants[] = {
    {"dot", QKV_LUONG_DOT, QKV_LUONG_GLOBAL, 0, FALSE},
    {"general", QKV_LUONG_GENERAL, QKV_LUONG_GLOBAL, 0, FALSE},
    {"concat", QKV_LUONG_CONCAT, QKV_LUONG_GLOBAL, 0, FALSE},
    {"concat_feed", QKV_LUONG_CONCAT, QKV_LUONG_GLOBAL, 0, TRUE},
    {"local_m", QKV_LUONG_GENERAL, QKV_LUONG_LOCAL_M, 1, FALSE},
    {"local_m_feed", QKV_LUONG_DOT, QKV_LUONG_LOCAL_M, 2, TRUE},
    {"local_p", QKV_LUONG_GENERAL, QKV_LUONG_LOCAL_P, 2, FALSE},
    {"local_p_feed", QKV_LUONG_CONCAT, QKV_LUONG_LOCAL_P, 2, TRUE},
};

static QkvLuongConfig
config_of(const Variant *v, gint64 src_vocab, gint64 tgt_vocab, gint64 embed, gint64 hidden,
          gint layers)
{
  return (QkvLuongConfig){.src_vocab = src_vocab,
                          .tgt_vocab = tgt_vocab,
                          .embed_size = embed,
                          .num_hiddens = hidden,
                          .num_layers = layers,
                          .attention = {.score = v->score, .align = v->align, .window = v->window},
                          .input_feeding = v->feed};
}

/* The training graph: inputs src (B, S), src_valid, dec_in, labels (B, T),
 * tgt_valid; *logits, *weights and the book's loss. */
static QkvGraph *
luong_graph(QkvParams *params, const QkvLuongConfig *cfg, gint B, gint S, gint T, QkvValue **logits,
            QkvValue **weights, QkvValue **loss)
{
  g_autoptr(GError) error = NULL;
  QkvGraph *g = qkv_graph_new();
  QkvShape bs = QKV_SHAPE(B, S), bt = QKV_SHAPE(B, T), b1 = QKV_SHAPE(B);
  QkvValue *src = qkv_graph_input(g, "src", QKV_I32, &bs, &error);
  QkvValue *src_valid = qkv_graph_input(g, "src_valid", QKV_I32, &b1, &error);
  QkvValue *dec_in = qkv_graph_input(g, "dec_in", QKV_I32, &bt, &error);
  QkvValue *labels = qkv_graph_input(g, "labels", QKV_I32, &bt, &error);
  QkvValue *tgt_valid = qkv_graph_input(g, "tgt_valid", QKV_I32, &b1, &error);
  QkvBuilder b = {.graph = g, .params = params, .seed = 7, .xavier_linear = TRUE};
  *logits = qkv_build_luong_seq2seq(&b, cfg, src, src_valid, dec_in, weights, &error);
  *loss = qkv_build_seq2seq_loss_lens(*logits, labels, tgt_valid, NULL, &error);
  g_assert_no_error(error);
  g_assert_true(qkv_graph_backward(g, *loss, &error));
  g_assert_no_error(error);
  return g;
}

static const gchar *const io_inputs[] = {"src", "src_valid", "dec_in", "labels", "tgt_valid"};

/* max |got - want| over the elements, and that over max(1, max |want|): the
 * error on the tensor's own scale. Gradients have elements near zero whose
 * relative error means nothing, so the bound is on the scale of the tensor,
 * with 1 as its floor for tensors that are all small. */
static double
scaled_error(const QkvTensor *got, const QkvTensor *want, double *abs_err)
{
  g_assert_cmpint(qkv_tensor_numel(got), ==, qkv_tensor_numel(want));
  const float *a = qkv_tensor_const_data(got), *b = qkv_tensor_const_data(want);
  double err = 0;
  for (gint64 i = 0; i < qkv_tensor_numel(want); i++)
    err = MAX(err, fabs((double)a[i] - (double)b[i]));
  *abs_err = err;
  return err / MAX(1.0, qkv_test_max_abs(want));
}

/* The same on the tensor's own scale, without the floor: what the figures
 * look like for gradients much smaller than 1 (reported, not asserted). */
static double
own_scale_error(const QkvTensor *want, double abs_err)
{
  double scale = qkv_test_max_abs(want);
  return scale > 0 ? abs_err / scale : abs_err;
}

#define PYTORCH_TOL 1e-4

static void
test_matches_pytorch(gconstpointer data)
{
  const Variant *v = data;
  g_autoptr(GError) error = NULL;
  g_autofree gchar *pfile = g_strdup_printf("luong_%s_ref_params.safetensors", v->name);
  g_autofree gchar *iofile = g_strdup_printf("luong_%s_ref_io.safetensors", v->name);
  g_autofree gchar *ppath = qkv_test_data_path(pfile);
  g_autofree gchar *iopath = qkv_test_data_path(iofile);
  g_autoptr(GHashTable) io = qkv_safetensors_read(iopath, NULL, &error);
  g_assert_no_error(error);
  const QkvTensor *src = qkv_test_ref(io, "src"), *dec_in = qkv_test_ref(io, "dec_in");
  const QkvTensor *ref_logits = qkv_test_ref(io, "logits");
  gint B = (gint)qkv_tensor_dim(src, 0), S = (gint)qkv_tensor_dim(src, 1);
  gint T = (gint)qkv_tensor_dim(dec_in, 1);
  QkvLuongConfig cfg = config_of(v, 13, qkv_tensor_dim(ref_logits, -1), 8, 10, 2);
  g_autoptr(QkvParams) params = qkv_params_new();
  QkvValue *logits, *weights, *loss;
  g_autoptr(QkvGraph) g = luong_graph(params, &cfg, B, S, T, &logits, &weights, &loss);
  /* strict: the builder's parameter names and shapes are PyTorch's, no more,
   * no fewer */
  g_assert_true(
      qkv_checkpoint_load(ppath, params, NULL, NULL, QKV_CHECKPOINT_STRICT, NULL, NULL, &error));
  g_assert_no_error(error);
  QkvValue *outs[] = {loss, logits, weights};
  QkvPlanOptions o = qkv_plan_options_default();
  o.training = TRUE;
  g_autoptr(QkvPlan) plan = qkv_graph_compile(g, outs, 3, &o, &error);
  g_assert_no_error(error);
  for (guint i = 0; i < G_N_ELEMENTS(io_inputs); i++)
    g_assert_true(qkv_plan_bind(plan, io_inputs[i], qkv_test_ref(io, io_inputs[i]), &error));
  g_assert_true(qkv_plan_run(plan, &error));
  g_assert_no_error(error);

  double abs_err, worst_abs = 0, worst = 0, worst_own = 0;
  const gchar *worst_name = "loss";
  double want_loss = qkv_tensor_get(qkv_test_ref(io, "loss"), 0);
  double loss_err = fabs(qkv_plan_output_scalar(plan, 0) - want_loss);
  g_assert_cmpfloat(loss_err, <=, PYTORCH_TOL * MAX(1.0, fabs(want_loss)));
  double logits_err = scaled_error(qkv_plan_output(plan, 1), ref_logits, &abs_err);
  g_assert_cmpfloat(logits_err, <=, PYTORCH_TOL);
  double weights_err =
      scaled_error(qkv_plan_output(plan, 2), qkv_test_ref(io, "weights"), &abs_err);
  g_assert_cmpfloat(weights_err, <=, PYTORCH_TOL);
  for (guint i = 0; i < qkv_params_size(params); i++) {
    QkvParam *p = qkv_params_nth(params, i);
    g_autofree gchar *gname = g_strconcat("grad.", qkv_param_name(p), NULL);
    double err = scaled_error(qkv_param_grad(p), qkv_test_ref(io, gname), &abs_err);
    if (err > PYTORCH_TOL)
      g_error("%s: %s differs from PyTorch's by %.3g (abs %.3g)", v->name, gname, err, abs_err);
    if (err > worst)
      worst = err, worst_abs = abs_err, worst_name = qkv_param_name(p);
    worst_own = MAX(worst_own, own_scale_error(qkv_test_ref(io, gname), abs_err));
  }
  /* the figures the README quotes */
  g_print("# luong %-13s loss %.7f (PyTorch %.7f, |diff| %.2g); max scaled error: logits %.2g, "
          "weights %.2g, gradients %.2g (%s, abs %.2g); gradients on their own scale %.2g\n",
          v->name, qkv_plan_output_scalar(plan, 0), want_loss, loss_err, logits_err, weights_err,
          worst, worst_name, worst_abs, worst_own);
}

/* ---- finite differences on a tiny model ------------------------------------ */

static void
fill_batch(QkvTensor **t, gint B, gint S, gint T, gint V, guint32 seed)
{
  QkvShape bs = QKV_SHAPE(B, S), bt = QKV_SHAPE(B, T), b1 = QKV_SHAPE(B);
  t[0] = qkv_test_randint(&bs, seed, 3, V);
  t[1] = qkv_test_randint(&b1, seed + 1, 1, S + 1);
  t[2] = qkv_test_randint(&bt, seed + 2, 3, V);
  t[3] = qkv_test_randint(&bt, seed + 3, 3, V);
  t[4] = qkv_test_randint(&b1, seed + 4, 1, T + 1);
}

/* Every parameter element's gradient against central differences of the
 * loss, f32 throughout: with eps 1e-2 the truncation error is ~eps² of the
 * third derivative and the rounding ~u |loss| / eps, both well under the
 * tolerance, |analytic - numeric| ≤ 2e-2 max(|numeric|, 1e-2). */
static void
test_finite_differences(gconstpointer data)
{
  const Variant *v = data;
  const gint B = 2, S = 4, T = 3, V = 6;
  QkvLuongConfig cfg = config_of(v, V, V, 3, 4, 2);
  g_autoptr(QkvParams) params = qkv_params_new();
  QkvValue *logits, *loss;
  g_autoptr(QkvGraph) g = luong_graph(params, &cfg, B, S, T, &logits, NULL, &loss);
  g_autoptr(GError) error = NULL;
  QkvPlanOptions o = qkv_plan_options_default();
  o.training = TRUE;
  o.n_threads = 1;
  g_autoptr(QkvPlan) plan = qkv_graph_compile(g, &loss, 1, &o, &error);
  g_assert_no_error(error);
  QkvTensor *batch[5];
  fill_batch(batch, B, S, T, V, 31);
  for (guint i = 0; i < 5; i++)
    g_assert_true(qkv_plan_bind(plan, io_inputs[i], batch[i], &error));
  g_assert_true(qkv_plan_run(plan, &error));
  g_assert_no_error(error);
  g_autoptr(GPtrArray) grads = g_ptr_array_new_with_free_func((GDestroyNotify)qkv_tensor_free);
  for (guint i = 0; i < qkv_params_size(params); i++)
    g_ptr_array_add(grads, qkv_tensor_copy(qkv_param_grad(qkv_params_nth(params, i))));

  const double eps = 1e-2;
  double worst = 0;
  guint checked = 0;
  for (guint i = 0; i < qkv_params_size(params); i++) {
    QkvParam *p = qkv_params_nth(params, i);
    float *x = qkv_tensor_f32(qkv_param_value(p));
    const float *an = qkv_tensor_const_data(g_ptr_array_index(grads, i));
    for (gint64 k = 0; k < qkv_tensor_numel(qkv_param_value(p)); k++) {
      float saved = x[k];
      x[k] = saved + (float)eps;
      g_assert_true(qkv_plan_run(plan, NULL));
      double up = qkv_plan_output_scalar(plan, 0);
      x[k] = saved - (float)eps;
      g_assert_true(qkv_plan_run(plan, NULL));
      double down = qkv_plan_output_scalar(plan, 0);
      x[k] = saved;
      double numeric = (up - down) / (2 * eps);
      double err = fabs(an[k] - numeric) / MAX(fabs(numeric), 1e-2);
      if (err > 2e-2)
        g_error("%s: d loss / d %s[%" G_GINT64_FORMAT "]: autodiff %.6g, finite differences %.6g",
                v->name, qkv_param_name(p), k, an[k], numeric);
      worst = MAX(worst, err);
      checked++;
    }
  }
  g_test_message("%s: %u parameter elements, max relative error %.3g", v->name, checked, worst);
  for (guint i = 0; i < 5; i++)
    qkv_tensor_free(batch[i]);
}

/* ---- the local windows ---------------------------------------------------- */

/* Attention alone on random states: local-m's weights vanish outside
 * |s − min(t, S − 1)| ≤ D and past the valid length, and each row sums to
 * one; local-p's are the window's softmax times the Gaussian, so a row sums
 * to at most one and no weight lies outside the window around some p_t in
 * [0, S]. */
static void
test_local_windows(void)
{
  const gint B = 3, n = 6, S = 5, H = 4, D = 1;
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  g_autoptr(QkvParams) params = qkv_params_new();
  QkvShape qs = QKV_SHAPE(B, n, H), ss = QKV_SHAPE(B, S, H), bs = QKV_SHAPE(B);
  QkvValue *q = qkv_graph_input(g, "q", QKV_F32, &qs, &error);
  QkvValue *src = qkv_graph_input(g, "src", QKV_F32, &ss, &error);
  QkvValue *valid = qkv_graph_input(g, "valid", QKV_I32, &bs, &error);
  QkvBuilder b = {.graph = g, .params = params, .seed = 1};
  QkvLuongAttentionConfig m = {.score = QKV_LUONG_DOT, .align = QKV_LUONG_LOCAL_M, .window = D};
  QkvLuongAttentionConfig p = {.score = QKV_LUONG_GENERAL, .align = QKV_LUONG_LOCAL_P, .window = D};
  QkvValue *wm, *wp;
  QkvValue *cm = qkv_build_luong_attention(&b, "m", &m, q, src, valid, 1, &wm, &error);
  QkvValue *cp = qkv_build_luong_attention(&b, "p", &p, q, src, valid, 0, &wp, &error);
  /* no valid lengths: S is the source's T, every position a candidate */
  QkvValue *wn;
  QkvValue *cn = qkv_build_luong_attention(&b, "n", &p, q, src, NULL, 0, &wn, &error);
  g_assert_no_error(error);
  g_assert_nonnull(cm);
  g_assert_nonnull(cp);
  g_assert_nonnull(cn);
  QkvValue *outs[] = {wm, wp, wn};
  g_autoptr(QkvPlan) plan = qkv_graph_compile(g, outs, 3, NULL, &error);
  g_assert_no_error(error);
  g_autoptr(QkvTensor) tq = qkv_test_uniform(&qs, 5, -2, 2);
  g_autoptr(QkvTensor) ts = qkv_test_uniform(&ss, 6, -2, 2);
  const gint32 lens[] = {5, 2, 1};
  g_autoptr(QkvTensor) tv = qkv_tensor_new(QKV_I32, &bs);
  memcpy(qkv_tensor_i32(tv), lens, sizeof lens);
  g_assert_true(qkv_plan_bind(plan, "q", tq, &error) && qkv_plan_bind(plan, "src", ts, &error) &&
                qkv_plan_bind(plan, "valid", tv, &error));
  g_assert_true(qkv_plan_run(plan, &error));
  g_assert_no_error(error);
  const float *am = qkv_tensor_const_data(qkv_plan_output(plan, 0));
  const float *ap = qkv_tensor_const_data(qkv_plan_output(plan, 1));
  const float *an = qkv_tensor_const_data(qkv_plan_output(plan, 2));
  for (gint bi = 0; bi < B; bi++)
    for (gint i = 0; i < n; i++) {
      gint centre = MIN(1 + i, lens[bi] - 1); /* first_position 1 */
      double sum_m = 0, sum_p = 0, sum_n = 0;
      gint lo = S, hi = -1;
      for (gint s = 0; s < S; s++) {
        double w = am[(bi * n + i) * S + s], wgt = ap[(bi * n + i) * S + s];
        gboolean inside = s < lens[bi] && ABS(s - centre) <= D;
        if (!inside)
          g_assert_cmpfloat(w, ==, 0.0);
        sum_m += w;
        sum_p += wgt;
        sum_n += an[(bi * n + i) * S + s];
        if (s >= lens[bi])
          g_assert_cmpfloat(wgt, ==, 0.0);
        if (wgt > 0)
          lo = MIN(lo, s), hi = MAX(hi, s);
      }
      g_assert_cmpfloat(fabs(sum_m - 1.0), <=, 1e-6);
      g_assert_cmpfloat(sum_p, <=, 1.0 + 1e-6);
      g_assert_cmpfloat(sum_p, >, 0.0);
      g_assert_cmpfloat(sum_n, <=, 1.0 + 1e-6);
      g_assert_cmpfloat(sum_n, >, 0.0);
      /* the window |s - p| ≤ D spans at most 2D + 1 positions */
      g_assert_cmpint(hi - lo, <=, 2 * D);
    }
}

/* ---- refused configs ------------------------------------------------------- */

static gchar *
param_names(QkvParams *params)
{
  GString *s = g_string_new(NULL);
  for (guint i = 0; i < qkv_params_size(params); i++)
    g_string_append_printf(s, "%s\n", qkv_param_name(qkv_params_nth(params, i)));
  return g_string_free(s, FALSE);
}

static void
test_refused(void)
{
  g_autoptr(GError) error = NULL;
  g_autoptr(QkvGraph) g = qkv_graph_new();
  g_autoptr(QkvParams) params = qkv_params_new();
  QkvShape bt = QKV_SHAPE(2, 5), bs = QKV_SHAPE(2), bth = QKV_SHAPE(2, 5, 8);
  QkvValue *src = qkv_graph_input(g, "src", QKV_I32, &bt, &error);
  QkvValue *valid = qkv_graph_input(g, "valid", QKV_I32, &bs, &error);
  QkvValue *dec = qkv_graph_input(g, "dec", QKV_I32, &bt, &error);
  QkvValue *x = qkv_graph_input(g, "x", QKV_F32, &bth, &error);
  QkvBuilder b = {.graph = g, .params = params, .seed = 1};
  const Variant ok = {"", QKV_LUONG_CONCAT, QKV_LUONG_LOCAL_P, 2, TRUE};
  QkvLuongConfig good = config_of(&ok, 11, 13, 6, 8, 2);
  struct {
    QkvLuongConfig cfg;
    const gchar *message;
  } bad[] = {
      {good, "qkv_build_luong_seq2seq: cfg->attention.window is 0, it must be > 0*"},
      {good, "qkv_build_luong_seq2seq: cfg->attention has score 3*"},
      {good, "qkv_build_luong_seq2seq: cfg->num_hiddens is 0, it must be > 0"},
      {good, "qkv_build_luong_seq2seq: cfg->dropout is 1, it must be in [0, 1)"},
      {good, "parameter 'decoder.attention.v_p.weight' exists*"},
  };
  bad[0].cfg.attention.window = 0;
  bad[1].cfg.attention.score = 3;
  bad[2].cfg.num_hiddens = 0;
  bad[3].cfg.dropout = 1.0;
  QkvShape odd = QKV_SHAPE(97);
  for (guint i = 0; i < G_N_ELEMENTS(bad); i++) {
    g_clear_error(&error);          /* errors are sticky: each case starts without one */
    if (i == G_N_ELEMENTS(bad) - 1) /* fails midway: everything before is rolled back */
      g_assert_nonnull(qkv_params_add(params, "decoder.attention.v_p.weight", &odd, &error));
    guint nodes = qkv_graph_n_nodes(g), values = qkv_graph_n_values(g);
    g_autofree gchar *names = param_names(params);
    QkvValue *w = x;
    g_assert_null(qkv_build_luong_seq2seq(&b, &bad[i].cfg, src, valid, dec, &w, &error));
    g_assert_nonnull(error);
    g_test_message("%s", error->message);
    if (!g_pattern_match_simple(bad[i].message, error->message))
      g_error("'%s' does not match '%s'", error->message, bad[i].message);
    g_assert_null(w);
    g_assert_cmpuint(qkv_graph_n_nodes(g), ==, nodes);
    g_assert_cmpuint(qkv_graph_n_values(g), ==, values);
    g_autofree gchar *after = param_names(params);
    g_assert_cmpstr(after, ==, names);
  }
  /* a source of another width; f32 valid lengths */
  g_clear_error(&error);
  QkvShape other = QKV_SHAPE(2, 5, 4);
  QkvValue *y = qkv_graph_input(g, "y", QKV_F32, &other, &error);
  g_assert_no_error(error);
  QkvLuongAttentionConfig dot = {.score = QKV_LUONG_DOT, .align = QKV_LUONG_GLOBAL};
  g_assert_null(qkv_build_luong_attention(&b, "a", &dot, x, y, NULL, 0, NULL, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_SHAPE);
  g_clear_error(&error);
  g_assert_null(qkv_build_luong_attention(&b, "a", &dot, x, x, x, 0, NULL, &error));
  g_assert_error(error, QKV_ERROR, QKV_ERROR_SHAPE);
  g_clear_error(&error);
  /* a NULL input chains: NULL back, the error left alone */
  g_assert_null(qkv_build_luong_attention(&b, "a", &dot, NULL, x, NULL, 0, NULL, &error));
  g_assert_no_error(error);
  g_assert_null(qkv_build_luong_seq2seq(&b, &good, src, valid, NULL, NULL, &error));
  g_assert_no_error(error);
  /* and the good config builds, in a store without the odd parameter */
  g_autoptr(QkvParams) fresh = qkv_params_new();
  b.params = fresh;
  g_assert_nonnull(qkv_build_luong_seq2seq(&b, &good, src, valid, dec, NULL, &error));
  g_assert_no_error(error);
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  for (guint i = 0; i < G_N_ELEMENTS(variants); i++) {
    g_autofree gchar *path = g_strdup_printf("/luong/matches-pytorch/%s", variants[i].name);
    g_test_add_data_func(path, &variants[i], test_matches_pytorch);
  }
  for (guint i = 0; i < G_N_ELEMENTS(variants); i++) {
    g_autofree gchar *path = g_strdup_printf("/luong/finite-differences/%s", variants[i].name);
    g_test_add_data_func(path, &variants[i], test_finite_differences);
  }
  g_test_add_func("/luong/local-windows", test_local_windows);
  g_test_add_func("/luong/refused", test_refused);
  return g_test_run();
}
