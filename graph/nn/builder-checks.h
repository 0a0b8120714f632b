/* builder-checks.h: config checks shared by the builders (not installed).
 * Each names the builder and the field in its message. */
#pragma once

#include <qkv/qkv.h>

static inline gboolean
builder_check_positive(const gchar *builder, const gchar *field, gint64 value, GError **error)
{
  if (value > 0)
    return TRUE;
  g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
              "%s: %s is %" G_GINT64_FORMAT ", it must be > 0", builder, field, value);
  return FALSE;
}

static inline gboolean
builder_check_dropout(const gchar *builder, const gchar *field, double p, GError **error)
{
  if (p >= 0.0 && p < 1.0)
    return TRUE;
  g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT, "%s: %s is %g, it must be in [0, 1)",
              builder, field, p);
  return FALSE;
}

/* heads > 0 and dividing hiddens (each head gets hiddens / heads features). */
static inline gboolean
builder_check_heads(const gchar *builder, const gchar *heads_field, gint heads,
                    const gchar *hiddens_field, gint64 hiddens, GError **error)
{
  if (!builder_check_positive(builder, heads_field, heads, error) ||
      !builder_check_positive(builder, hiddens_field, hiddens, error))
    return FALSE;
  if (hiddens % heads == 0)
    return TRUE;
  g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
              "%s: %s (%d) does not divide %s (%" G_GINT64_FORMAT ")", builder, heads_field, heads,
              hiddens_field, hiddens);
  return FALSE;
}

static inline gboolean
builder_check_activation(const gchar *builder, const gchar *field, QkvActivation act,
                         GError **error)
{
  if ((guint)act <= QKV_ACTIVATION_SILU)
    return TRUE;
  g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
              "%s: %s is %d, it must be QKV_ACTIVATION_RELU, QKV_ACTIVATION_GELU, "
              "QKV_ACTIVATION_GELU_TANH or QKV_ACTIVATION_SILU",
              builder, field, (gint)act);
  return FALSE;
}

/* The checks every builder makes of its QkvBuilder. */
/* A builder's first line: a broken QkvBuilder is a programming error; an
 * error already set means an earlier call of a chain failed, so add nothing
 * and keep that first error (see "Errors chain" in qkv-graph.h). */
#define BUILDER_RETURN_IF_INVALID(b, error)                                                        \
  G_STMT_START                                                                                     \
  {                                                                                                \
    g_return_val_if_fail((b) != NULL && (b)->graph != NULL && (b)->params != NULL, NULL);          \
    if ((error) != NULL && *(error) != NULL)                                                       \
      return NULL;                                                                                 \
  }                                                                                                \
  G_STMT_END
