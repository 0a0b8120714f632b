/* initializers.c: seeded parameter initialisers (torch.nn.init). */
#include "core/core-private.h"
#include "qkv/qkv-init.h"

#include <math.h>
#include "error-private.h"

/* xoshiro256** (Blackman & Vigna), state seeded by splitmix64. */
typedef struct {
  guint64 s[4];
} Rng;

static guint64
splitmix64(guint64 *x)
{
  guint64 z = (*x += G_GUINT64_CONSTANT(0x9e3779b97f4a7c15));
  z = (z ^ (z >> 30)) * G_GUINT64_CONSTANT(0xbf58476d1ce4e5b9);
  z = (z ^ (z >> 27)) * G_GUINT64_CONSTANT(0x94d049bb133111eb);
  return z ^ (z >> 31);
}

static inline guint64
rotl(guint64 x, int k)
{
  return (x << k) | (x >> (64 - k));
}

static void
rng_init(Rng *r, guint64 seed)
{
  guint64 x = seed;
  for (int i = 0; i < 4; i++)
    r->s[i] = splitmix64(&x);
}

static inline guint64
rng_next(Rng *r)
{
  guint64 *s = r->s;
  guint64 result = rotl(s[1] * 5, 7) * 9;
  guint64 t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

/* A double in [0, 1) with 53 random bits. */
static inline double
rng_double(Rng *r)
{
  return (double)(rng_next(r) >> 11) * 0x1.0p-53;
}

static gboolean
check_f32(QkvTensor *tensor, const gchar *what, GError **error)
{
  g_return_val_if_fail(tensor != NULL, FALSE);
  if (qkv_tensor_dtype(tensor) != QKV_F32) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_DTYPE, "%s: expected an f32 tensor, got %s", what,
                qkv_dtype_name(qkv_tensor_dtype(tensor)));
    return FALSE;
  }
  return TRUE;
}

gboolean
qkv_init_compute_fans(const QkvShape *shape, gint64 *fan_in, gint64 *fan_out, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  g_return_val_if_fail(shape != NULL, FALSE);
  if (shape->rank < 2) {
    g_autofree gchar *s = qkv_shape_to_string(shape);
    g_set_error(error, QKV_ERROR, QKV_ERROR_SHAPE,
                "fan in and fan out cannot be computed for shape %s (rank < 2)", s);
    return FALSE;
  }
  gint64 receptive = 1;
  for (gint i = 2; i < shape->rank; i++)
    receptive *= shape->dims[i];
  if (fan_in != NULL)
    *fan_in = shape->dims[1] * receptive;
  if (fan_out != NULL)
    *fan_out = shape->dims[0] * receptive;
  return TRUE;
}

guint64
qkv_init_seed_for_name(guint64 seed, const gchar *name)
{
  g_return_val_if_fail(name != NULL, seed);
  /* FNV-1a over the name, mixed with the seed */
  guint64 h = G_GUINT64_CONSTANT(0xcbf29ce484222325);
  for (const guchar *p = (const guchar *)name; *p; p++) {
    h ^= *p;
    h *= G_GUINT64_CONSTANT(0x100000001b3);
  }
  guint64 x = seed ^ h;
  return splitmix64(&x);
}

gboolean
qkv_init_constant(QkvTensor *tensor, double value, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  if (!check_f32(tensor, "init constant", error))
    return FALSE;
  qkv_tensor_fill(tensor, value);
  return TRUE;
}

gboolean
qkv_init_zeros(QkvTensor *tensor, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  return qkv_init_constant(tensor, 0.0, error);
}

gboolean
qkv_init_ones(QkvTensor *tensor, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  return qkv_init_constant(tensor, 1.0, error);
}

static void
fill_uniform(QkvTensor *tensor, double low, double high, guint64 seed)
{
  Rng r;
  rng_init(&r, seed);
  float *d = qkv_tensor_f32(tensor);
  gint64 n = qkv_tensor_numel(tensor);
  for (gint64 i = 0; i < n; i++) {
    float v = (float)(low + (high - low) * rng_double(&r));
    /* rounding to float may land on high itself; keep the interval half-open */
    d[i] = v < (float)high ? v : nextafterf((float)high, -INFINITY);
  }
}

static void
fill_normal(QkvTensor *tensor, double mean, double std, guint64 seed)
{
  Rng r;
  rng_init(&r, seed);
  float *d = qkv_tensor_f32(tensor);
  gint64 n = qkv_tensor_numel(tensor);
  for (gint64 i = 0; i < n; i += 2) {
    /* Box-Muller; 1 - u lies in (0, 1], so the log is finite */
    double radius = sqrt(-2.0 * log(1.0 - rng_double(&r)));
    double angle = 2.0 * G_PI * rng_double(&r);
    d[i] = (float)(mean + std * radius * cos(angle));
    if (i + 1 < n)
      d[i + 1] = (float)(mean + std * radius * sin(angle));
  }
}

gboolean
qkv_init_uniform(QkvTensor *tensor, double low, double high, guint64 seed, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  if (!check_f32(tensor, "init uniform", error))
    return FALSE;
  if (!(low < high) || !isfinite(low) || !isfinite(high)) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "init uniform: need finite low < high, got [%g, %g)", low, high);
    return FALSE;
  }
  fill_uniform(tensor, low, high, seed);
  return TRUE;
}

gboolean
qkv_init_normal(QkvTensor *tensor, double mean, double std, guint64 seed, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  if (!check_f32(tensor, "init normal", error))
    return FALSE;
  if (!(std >= 0) || !isfinite(std) || !isfinite(mean)) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "init normal: need finite mean and std >= 0, got mean %g, std %g", mean, std);
    return FALSE;
  }
  fill_normal(tensor, mean, std, seed);
  return TRUE;
}

/* U(±bound); bound 0 gives zeros (an empty fan, as PyTorch allows). */
static void
fill_symmetric(QkvTensor *tensor, double bound, guint64 seed)
{
  if (bound > 0)
    fill_uniform(tensor, -bound, bound, seed);
  else
    qkv_tensor_fill(tensor, 0.0);
}

gboolean
qkv_init_xavier_uniform(QkvTensor *tensor, double gain, guint64 seed, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  gint64 fan_in, fan_out;
  if (!check_f32(tensor, "init xavier_uniform", error) ||
      !qkv_init_compute_fans(qkv_tensor_shape(tensor), &fan_in, &fan_out, error))
    return FALSE;
  double std = fan_in + fan_out > 0 ? gain * sqrt(2.0 / (double)(fan_in + fan_out)) : 0.0;
  fill_symmetric(tensor, sqrt(3.0) * std, seed);
  return TRUE;
}

gboolean
qkv_init_xavier_normal(QkvTensor *tensor, double gain, guint64 seed, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  gint64 fan_in, fan_out;
  if (!check_f32(tensor, "init xavier_normal", error) ||
      !qkv_init_compute_fans(qkv_tensor_shape(tensor), &fan_in, &fan_out, error))
    return FALSE;
  double std = fan_in + fan_out > 0 ? gain * sqrt(2.0 / (double)(fan_in + fan_out)) : 0.0;
  fill_normal(tensor, 0.0, std, seed);
  return TRUE;
}

gboolean
qkv_init_kaiming_uniform(QkvTensor *tensor, double a, guint64 seed, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  gint64 fan_in;
  if (!check_f32(tensor, "init kaiming_uniform", error) ||
      !qkv_init_compute_fans(qkv_tensor_shape(tensor), &fan_in, NULL, error))
    return FALSE;
  double gain = sqrt(2.0 / (1.0 + a * a));
  double bound = fan_in > 0 ? gain * sqrt(3.0 / (double)fan_in) : 0.0;
  fill_symmetric(tensor, bound, seed);
  return TRUE;
}

gboolean
qkv_init_linear(QkvTensor *weight, QkvTensor *bias, guint64 seed, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  gint64 fan_in;
  if (!check_f32(weight, "init linear weight", error) ||
      !qkv_init_compute_fans(qkv_tensor_shape(weight), &fan_in, NULL, error))
    return FALSE;
  if (bias != NULL) {
    if (!check_f32(bias, "init linear bias", error))
      return FALSE;
    if (qkv_tensor_numel(bias) != qkv_tensor_dim(weight, 0)) {
      g_autofree gchar *ws = qkv_shape_to_string(qkv_tensor_shape(weight));
      g_autofree gchar *bs = qkv_shape_to_string(qkv_tensor_shape(bias));
      g_set_error(error, QKV_ERROR, QKV_ERROR_SHAPE,
                  "init linear: bias %s does not match weight %s (out, in)", bs, ws);
      return FALSE;
    }
  }
  if (!qkv_init_kaiming_uniform(weight, sqrt(5.0), seed, error))
    return FALSE;
  if (bias != NULL) {
    guint64 x = seed ^ G_GUINT64_CONSTANT(0x6a09e667f3bcc909);
    fill_symmetric(bias, fan_in > 0 ? 1.0 / sqrt((double)fan_in) : 0.0, splitmix64(&x));
  }
  return TRUE;
}

gboolean
qkv_init_embedding(QkvTensor *weight, guint64 seed, GError **error)
{
  QKV_RETURN_IF_ERROR_SET(error, FALSE);
  return qkv_init_normal(weight, 0.0, 1.0, seed, error);
}
