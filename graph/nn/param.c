/* param.c: the parameters builders create or reuse, under the builder's
 * scope, and their initialisers: the book's by name, or one chosen as data
 * (QkvInit) per call or per role (QkvBuilderInits). */
#include <math.h>
#include <qkv/qkv.h>

#include "nn/builder-checks.h"
#include "nn/builder-internal.h"
#include "error-private.h"

static const gchar *const initialisers[] = {"zeros",         "ones",        "embedding", "xavier",
                                            "linear_weight", "linear_bias", NULL};

/* The book's initialisers, by qkv_build_param()'s names. */
static gboolean
book_init(QkvBuilder *b, QkvTensor *t, const gchar *init, gint64 fan_in, guint64 seed,
          GError **error)
{
  if (g_str_equal(init, "zeros"))
    return qkv_init_zeros(t, error);
  if (g_str_equal(init, "ones"))
    return qkv_init_ones(t, error);
  if (g_str_equal(init, "embedding"))
    return qkv_init_embedding(t, seed, error);
  if (g_str_equal(init, "xavier"))
    return qkv_init_xavier_uniform(t, 1.0, seed, error);
  if (g_str_equal(init, "linear_weight"))
    return b->xavier_linear ? qkv_init_xavier_uniform(t, 1.0, seed, error)
                            : qkv_init_kaiming_uniform(t, sqrt(5.0), seed, error);
  if (g_str_equal(init, "linear_bias")) {
    double bound = fan_in > 0 ? 1.0 / sqrt((double)fan_in) : 0.0;
    return qkv_init_uniform(t, -bound, bound, seed, error);
  }
  g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT, "unknown initialiser '%s'", init);
  return FALSE;
}

/* The choice b->inits makes for the parameters the book initialises with
 * init, or NULL for the book's. */
static const QkvInit *
role_choice(const QkvBuilder *b, const gchar *init)
{
  if (b->inits == NULL || init == NULL)
    return NULL;
  const QkvInit *choice = g_str_equal(init, "embedding")       ? &b->inits->embedding
                          : g_str_equal(init, "linear_weight") ? &b->inits->weight
                          : g_str_equal(init, "linear_bias")   ? &b->inits->bias
                                                               : NULL;
  return choice != NULL && choice->kind != QKV_INIT_DEFAULT ? choice : NULL;
}

/* A choice that names a kind and whose numbers that kind can use; the fans
 * are checked on the tensor. */
static gboolean
check_choice(const gchar *name, const QkvInit *c, GError **error)
{
  const gchar *why = NULL;
  if ((guint)c->kind > QKV_INIT_KAIMING_NORMAL)
    why = "no such kind";
  else if (!isfinite(c->mean) || !isfinite(c->std) || !isfinite(c->a) || !isfinite(c->b) ||
           !isfinite(c->gain) || !isfinite(c->value))
    why = "a number is not finite";
  else if (c->kind == QKV_INIT_NORMAL && c->std < 0)
    why = "std must be >= 0";
  else if (c->kind == QKV_INIT_UNIFORM && !(c->a < c->b) && !(c->a == 0 && c->b == 0))
    why = "uniform needs a < b";
  if (why == NULL)
    return TRUE;
  g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
              "parameter '%s': initialiser (kind %d, mean %g, std %g, a %g, b %g, gain %g, "
              "value %g): %s",
              name, (gint)c->kind, c->mean, c->std, c->a, c->b, c->gain, c->value, why);
  return FALSE;
}

/* kaiming_normal_(a) in fan_in mode: N(0, gain² / fan_in), gain √(2/(1+a²)). */
static gboolean
kaiming_normal(QkvTensor *t, double a, guint64 seed, GError **error)
{
  gint64 fan_in;
  if (!qkv_init_compute_fans(qkv_tensor_shape(t), &fan_in, NULL, error))
    return FALSE;
  if (fan_in == 0) /* an empty fan, as PyTorch allows: nothing to scale by */
    return qkv_init_zeros(t, error);
  double gain = sqrt(2.0 / (1.0 + a * a));
  return qkv_init_normal(t, 0.0, gain / sqrt((double)fan_in), seed, error);
}

/* Fill t as c says (checked by check_choice(), not QKV_INIT_DEFAULT). */
static gboolean
apply_choice(QkvTensor *t, const QkvInit *c, guint64 seed, GError **error)
{
  const double gain = c->gain != 0 ? c->gain : 1.0;
  switch (c->kind) {
  case QKV_INIT_ZEROS:
    return qkv_init_zeros(t, error);
  case QKV_INIT_ONES:
    return qkv_init_ones(t, error);
  case QKV_INIT_CONSTANT:
    return qkv_init_constant(t, c->value, error);
  case QKV_INIT_UNIFORM:
    if (c->a == 0 && c->b == 0)
      return qkv_init_uniform(t, 0.0, 1.0, seed, error);
    return qkv_init_uniform(t, c->a, c->b, seed, error);
  case QKV_INIT_NORMAL:
    return qkv_init_normal(t, c->mean, c->std != 0 ? c->std : 1.0, seed, error);
  case QKV_INIT_XAVIER_UNIFORM:
    return qkv_init_xavier_uniform(t, gain, seed, error);
  case QKV_INIT_XAVIER_NORMAL:
    return qkv_init_xavier_normal(t, gain, seed, error);
  case QKV_INIT_KAIMING_UNIFORM:
    return qkv_init_kaiming_uniform(t, c->a, seed, error);
  case QKV_INIT_KAIMING_NORMAL:
    return kaiming_normal(t, c->a, seed, error);
  case QKV_INIT_DEFAULT:
    break;
  }
  g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT, "no initialiser chosen");
  return FALSE;
}

/* Create the parameter full_name and initialise it, all or nothing. */
static QkvValue *
create_param(QkvBuilder *b, const gchar *full_name, const QkvShape *shape, const gchar *init,
             gint64 fan_in, const QkvInit *choice, GError **error)
{
  QkvBuilderMark mark;
  qkv_builder_begin(b, &mark);
  QkvParam *p = qkv_params_add(b->params, full_name, shape, error);
  gboolean filled = FALSE;
  if (p != NULL) {
    QkvTensor *t = qkv_param_value(p);
    guint64 seed = qkv_init_seed_for_name(b->seed, full_name);
    if (choice != NULL) {
      filled = apply_choice(t, choice, seed, error);
      if (!filled)
        g_prefix_error(error, "parameter '%s': ", full_name);
    } else {
      filled = book_init(b, t, init, fan_in, seed, error);
    }
  }
  QkvValue *v = filled ? qkv_graph_param(b->graph, b->params, full_name, error) : NULL;
  return qkv_builder_end(b, &mark, v);
}

QkvValue *
builder_param(QkvBuilder *b, const gchar *name, const QkvShape *shape, const gchar *init,
              gint64 fan_in, const QkvInit *choice, GError **error)
{
  BUILDER_RETURN_IF_INVALID(b, error); /* errors chain: the layers call it in a row */
  g_autofree gchar *full_name = qkv_builder_scoped_name(b, name);
  if (!builder_scope_accepts(b, full_name, error))
    return NULL;
  if (choice == NULL || choice->kind == QKV_INIT_DEFAULT)
    choice = role_choice(b, init);
  if (choice != NULL && !check_choice(full_name, choice, error))
    return NULL;
  if (init == NULL && choice == NULL) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "qkv_build_param_init: parameter '%s': no initialiser chosen (NULL or "
                "QKV_INIT_DEFAULT, which a bare parameter does not have)",
                full_name);
    return NULL;
  }
  QkvParam *p = qkv_params_lookup(b->params, full_name);
  if (p != NULL) {
    if (!qkv_shape_equal(qkv_param_shape(p), shape)) {
      g_autofree gchar *have = qkv_shape_to_string(qkv_param_shape(p));
      g_autofree gchar *want = qkv_shape_to_string(shape);
      g_set_error(error, QKV_ERROR, QKV_ERROR_SHAPE,
                  "parameter '%s' exists with shape %s, the model needs %s", full_name, have, want);
      return NULL;
    }
    return qkv_graph_param(b->graph, b->params, full_name, error);
  }
  if (init != NULL && !g_strv_contains(initialisers, init)) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "qkv_build_param: parameter '%s': unknown initialiser '%s'", full_name, init);
    return NULL;
  }
  return create_param(b, full_name, shape, init, fan_in, choice, error);
}

QkvValue *
qkv_build_param(QkvBuilder *b, const gchar *name, const QkvShape *shape, const gchar *init,
                gint64 fan_in, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  g_return_val_if_fail(name != NULL && shape != NULL && init != NULL, NULL);
  BUILDER_RETURN_IF_INVALID(b, error);
  return builder_param(b, name, shape, init, fan_in, NULL, error);
}

QkvValue *
qkv_build_param_init(QkvBuilder *b, const gchar *name, const QkvShape *shape, const QkvInit *init,
                     GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, NULL);
  g_return_val_if_fail(name != NULL && shape != NULL, NULL);
  BUILDER_RETURN_IF_INVALID(b, error);
  return builder_param(b, name, shape, NULL, 0, init, error);
}
