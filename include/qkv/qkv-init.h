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

#include <glib.h>
#include "qkv-tensor.h"

G_BEGIN_DECLS

/* fan_in and fan_out of a weight of this shape; FALSE for rank < 2. */
gboolean qkv_init_compute_fans(const QkvShape *shape, gint64 *fan_in, gint64 *fan_out,
                               GError **error);
/* A seed for one parameter derived from a base seed and its name, so that a
 * model's initial values do not depend on the order its params are added. */
guint64 qkv_init_seed_for_name(guint64 seed, const gchar *name);

/* Fill with 0, 1, or value. */
gboolean qkv_init_zeros(QkvTensor *tensor, GError **error);
gboolean qkv_init_ones(QkvTensor *tensor, GError **error);
gboolean qkv_init_constant(QkvTensor *tensor, double value, GError **error);

/* U(low, high); low < high. */
gboolean qkv_init_uniform(QkvTensor *tensor, double low, double high, guint64 seed, GError **error);
/* N(mean, std²); std >= 0. */
gboolean qkv_init_normal(QkvTensor *tensor, double mean, double std, guint64 seed, GError **error);
/* Glorot: U(±gain·√(6/(fan_in+fan_out))), variance gain²·2/(fan_in+fan_out). */
gboolean qkv_init_xavier_uniform(QkvTensor *tensor, double gain, guint64 seed, GError **error);
/* Glorot: N(0, gain²·2/(fan_in+fan_out)). */
gboolean qkv_init_xavier_normal(QkvTensor *tensor, double gain, guint64 seed, GError **error);
/* He, fan_in mode, leaky-ReLU gain √(2/(1+a²)): U(±gain·√(3/fan_in)).
 * a = 0 is the ReLU rule; a = √5 is what nn.Linear uses (bound 1/√fan_in). */
gboolean qkv_init_kaiming_uniform(QkvTensor *tensor, double a, guint64 seed, GError **error);

/* PyTorch's default for nn.Linear: weight (out, in) Kaiming-uniform with
 * a = √5, i.e. U(±1/√in); bias (out) U(±1/√in). bias may be NULL. The bias
 * draws from a seed derived from seed, so one seed covers the layer. */
gboolean qkv_init_linear(QkvTensor *weight, QkvTensor *bias, guint64 seed, GError **error);
/* PyTorch's default for nn.Embedding: N(0, 1). */
gboolean qkv_init_embedding(QkvTensor *weight, guint64 seed, GError **error);

G_END_DECLS
