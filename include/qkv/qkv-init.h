/* qkv-init.h: parameter initialisers, like torch.nn.init.
 *
 * Every random initialiser takes a seed: the same seed gives the same values,
 * on every machine and thread count. The generator is qkv's own (xoshiro256**
 * seeded through splitmix64, Box-Muller for normals), so the values differ
 * from PyTorch's, but the distributions are the same. Uniform draws lie in
 * [low, high), as torch.nn.init.uniform_'s do.
 *
 * Fans follow torch.nn.init._calculate_fan_in_and_fan_out: for a weight of
 * shape (out, in, k...), fan_in = in·prod(k) and fan_out = out·prod(k); a
 * tensor of rank < 2 has no fans and is a QKV_ERROR_SHAPE.
 *
 * All initialisers write into an existing f32 tensor (for a parameter, pass
 * qkv_param_value(param)), so plans that hold its data pointer see the values.
 */
#pragma once

#include "qkv-api.h"
#include <glib.h>
#include "qkv-tensor.h"

G_BEGIN_DECLS

/**
 * qkv_init_compute_fans:
 * @shape: a #QkvShape
 * @fan_in: (out) (optional): where to store the fan in, or %NULL
 * @fan_out: (out) (optional): where to store the fan out, or %NULL
 * @error: return location for a #GError, or %NULL
 *
 * fan_in and fan_out of a weight of this shape; FALSE for rank < 2.
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_init_compute_fans(const QkvShape *shape, gint64 *fan_in, gint64 *fan_out,
                               GError **error);
/**
 * qkv_init_seed_for_name:
 * @seed: the seed
 * @name: the name
 *
 * A seed for one parameter derived from a base seed and its name, so that a
 * model's initial values do not depend on the order its params are added.
 *
 * Returns: the guint64
 */
QKV_API
guint64 qkv_init_seed_for_name(guint64 seed, const gchar *name);

/**
 * qkv_init_zeros:
 * @tensor: a #QkvTensor
 * @error: return location for a #GError, or %NULL
 *
 * Fill with 0, 1, or value.
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_init_zeros(QkvTensor *tensor, GError **error);
/**
 * qkv_init_ones:
 * @tensor: a #QkvTensor
 * @error: return location for a #GError, or %NULL
 *
 * See qkv_init_zeros().
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_init_ones(QkvTensor *tensor, GError **error);
/**
 * qkv_init_constant:
 * @tensor: a #QkvTensor
 * @value: the value
 * @error: return location for a #GError, or %NULL
 *
 * See qkv_init_zeros().
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_init_constant(QkvTensor *tensor, double value, GError **error);

/**
 * qkv_init_uniform:
 * @tensor: a #QkvTensor
 * @low: the low
 * @high: the high
 * @seed: the seed
 * @error: return location for a #GError, or %NULL
 *
 * U(low, high); low < high.
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_init_uniform(QkvTensor *tensor, double low, double high, guint64 seed, GError **error);
/**
 * qkv_init_normal:
 * @tensor: a #QkvTensor
 * @mean: the mean
 * @std: the std
 * @seed: the seed
 * @error: return location for a #GError, or %NULL
 *
 * N(mean, std²); std >= 0.
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_init_normal(QkvTensor *tensor, double mean, double std, guint64 seed, GError **error);
/**
 * qkv_init_xavier_uniform:
 * @tensor: a #QkvTensor
 * @gain: the gain
 * @seed: the seed
 * @error: return location for a #GError, or %NULL
 *
 * Glorot: U(±gain·√(6/(fan_in+fan_out))), variance gain²·2/(fan_in+fan_out).
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_init_xavier_uniform(QkvTensor *tensor, double gain, guint64 seed, GError **error);
/**
 * qkv_init_xavier_normal:
 * @tensor: a #QkvTensor
 * @gain: the gain
 * @seed: the seed
 * @error: return location for a #GError, or %NULL
 *
 * Glorot: N(0, gain²·2/(fan_in+fan_out)).
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_init_xavier_normal(QkvTensor *tensor, double gain, guint64 seed, GError **error);
/**
 * qkv_init_kaiming_uniform:
 * @tensor: a #QkvTensor
 * @a: the a
 * @seed: the seed
 * @error: return location for a #GError, or %NULL
 *
 * He, fan_in mode, leaky-ReLU gain √(2/(1+a²)): U(±gain·√(3/fan_in)).
 * a = 0 is the ReLU rule; a = √5 is what nn.Linear uses (bound 1/√fan_in).
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_init_kaiming_uniform(QkvTensor *tensor, double a, guint64 seed, GError **error);

/**
 * qkv_init_linear:
 * @weight: a #QkvTensor
 * @bias: (nullable): a #QkvTensor
 * @seed: the seed
 * @error: return location for a #GError, or %NULL
 *
 * PyTorch's default for nn.Linear: weight (out, in) Kaiming-uniform with
 * a = √5, i.e. U(±1/√in); bias (out) U(±1/√in). bias may be NULL. The bias
 * draws from a seed derived from seed, so one seed covers the layer.
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_init_linear(QkvTensor *weight, QkvTensor *bias, guint64 seed, GError **error);
/**
 * qkv_init_embedding:
 * @weight: a #QkvTensor
 * @seed: the seed
 * @error: return location for a #GError, or %NULL
 *
 * PyTorch's default for nn.Embedding: N(0, 1).
 *
 * Returns: %TRUE on success, %FALSE with @error set
 */
QKV_API
gboolean qkv_init_embedding(QkvTensor *weight, guint64 seed, GError **error);

/**
 * QkvInitKind:
 * @QKV_INIT_DEFAULT: the builder's own choice for the parameter: the book's (see QkvBuilderInits);
 *   has no meaning where there is no builder's choice
 * @QKV_INIT_ZEROS: 0
 * @QKV_INIT_ONES: 1
 * @QKV_INIT_CONSTANT: value
 * @QKV_INIT_UNIFORM: U(a, b), uniform_(a, b)
 * @QKV_INIT_NORMAL: N(mean, std²), normal_(mean, std)
 * @QKV_INIT_XAVIER_UNIFORM: xavier_uniform_(gain)
 * @QKV_INIT_XAVIER_NORMAL: xavier_normal_(gain)
 * @QKV_INIT_KAIMING_UNIFORM: kaiming_uniform_(a), fan_in mode: U(±√(2/(1+a²))·√(3/fan_in))
 * @QKV_INIT_KAIMING_NORMAL: kaiming_normal_(a), fan_in mode: N(0, 2/((1+a²)·fan_in))
 *
 * An initialiser chosen as data, for the builders (qkv-builders.h:
 * qkv_build_param_init(), qkv_build_linear_init(), qkv_build_embedding_init()
 * and QkvBuilderInits), as one would pick a torch.nn.init function.
 */
typedef enum {
  /* the builder's own choice for the parameter: the book's (see
   * QkvBuilderInits); has no meaning where there is no builder's choice */
  QKV_INIT_DEFAULT = 0,
  QKV_INIT_ZEROS,           /* 0 */
  QKV_INIT_ONES,            /* 1 */
  QKV_INIT_CONSTANT,        /* value */
  QKV_INIT_UNIFORM,         /* U(a, b), uniform_(a, b) */
  QKV_INIT_NORMAL,          /* N(mean, std²), normal_(mean, std) */
  QKV_INIT_XAVIER_UNIFORM,  /* xavier_uniform_(gain) */
  QKV_INIT_XAVIER_NORMAL,   /* xavier_normal_(gain) */
  QKV_INIT_KAIMING_UNIFORM, /* kaiming_uniform_(a), fan_in mode: U(±√(2/(1+a²))·√(3/fan_in)) */
  QKV_INIT_KAIMING_NORMAL,  /* kaiming_normal_(a), fan_in mode: N(0, 2/((1+a²)·fan_in)) */
} QkvInitKind;

/**
 * QkvInit:
 *
 * Zero-initialise it and set what the kind reads (designated initialisers:
 * (QkvInit){.kind = QKV_INIT_NORMAL, .std = 0.02}). A field left at zero
 * where zero would make no sense takes torch.nn.init's default: std 0 is 1,
 * gain 0 is 1, and a = b = 0 for QKV_INIT_UNIFORM is U(0, 1). A zero a for
 * Kaiming is the ReLU rule, as in PyTorch. Xavier and Kaiming need fans: a
 * parameter of rank < 2 (a bias) is refused with QKV_ERROR_SHAPE; a uniform
 * with a >= b, a negative std or a non-finite number with
 * QKV_ERROR_INVALID_ARGUMENT (the qkv_init_* functions' errors). Random
 * kinds draw from the parameter's seed (qkv_init_seed_for_name()).
 */
typedef struct {
  QkvInitKind kind;
  double mean;  /* QKV_INIT_NORMAL */
  double std;   /* QKV_INIT_NORMAL; 0 means 1 */
  double a, b;  /* QKV_INIT_UNIFORM: [a, b); Kaiming: a is the leaky-ReLU slope */
  double gain;  /* Xavier; 0 means 1 */
  double value; /* QKV_INIT_CONSTANT */
  gpointer reserved[2];
} QkvInit;

G_END_DECLS
