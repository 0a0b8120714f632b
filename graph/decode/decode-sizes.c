/* decode-sizes.c: the sizes and configs a step decoder is asked for,
 * checked where they enter graph/decode/ and before anything is built, so
 * that no shape, count or byte size computed from them downstream (in
 * builders, shape rules, kernels, the step loop) overflows. */
#include <qkv/qkv.h>

#include "decode/decode-internal.h"

static gboolean
check_positive(const gchar *me, gint max_rows, gint64 src_len, gint max_len, GError **error)
{
  const gchar *bad = max_rows < 1  ? "max_rows must be at least 1"
                     : src_len < 1 ? "src_len must be at least 1"
                     : max_len < 1 ? "max_len must be at least 1"
                                   : NULL;
  if (bad != NULL)
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT, "%s: %s", me, bad);
  return bad == NULL;
}

/* 4 · a · b · c bytes fit a gssize (what a tensor may have); no overflow on
 * the way. */
static gboolean
f32_bytes_fit(guint64 a, guint64 b, guint64 c)
{
  guint64 n;
  return g_uint64_checked_mul(&n, a, b) && g_uint64_checked_mul(&n, n, c) &&
         g_uint64_checked_mul(&n, n, sizeof(float)) && n <= G_MAXSSIZE;
}

/* The largest buffers of a decoder's plans:
 *  - per source position of every row, src_width floats of activations and
 *    src_scores × src_len attention scores (the Transformer encoder's
 *    heads × src_len);
 *  - per cached position of every row, tgt_width floats (the Transformer's
 *    self-attention caches, max_len + 1 positions with the new token);
 *  - vocab logits per row.
 * Each must fit a gssize in bytes, else QKV_ERROR_MEMORY naming the sizes. */
static gboolean
check_memory(const gchar *me, gint max_rows, gint64 src_len, gint max_len, guint64 src_width,
             guint64 src_scores, guint64 tgt_width, gint64 vocab, GError **error)
{
  guint64 width;
  if (!g_uint64_checked_mul(&width, src_scores, (guint64)src_len) ||
      !g_uint64_checked_add(&width, width, src_width) ||
      !f32_bytes_fit((guint64)max_rows, (guint64)src_len, width)) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_MEMORY,
                "%s: max_rows %d and src_len %" G_GINT64_FORMAT " need buffers larger than the "
                "address space",
                me, max_rows, src_len);
    return FALSE;
  }
  if (!f32_bytes_fit((guint64)max_rows, (guint64)max_len + 1, tgt_width)) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_MEMORY,
                "%s: max_rows %d and max_len %d need self-attention caches larger than the "
                "address space",
                me, max_rows, max_len);
    return FALSE;
  }
  if (!f32_bytes_fit((guint64)max_rows, (guint64)vocab, 1)) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_MEMORY,
                "%s: max_rows %d and tgt_vocab %" G_GINT64_FORMAT " need logits larger than "
                "the address space",
                me, max_rows, vocab);
    return FALSE;
  }
  return TRUE;
}

gboolean
decode_check_transformer(const gchar *me, const QkvTransformerConfig *config, gint max_rows,
                         gint64 src_len, gint max_len, GError **error)
{
  if (!check_positive(me, max_rows, src_len, max_len, error))
    return FALSE;
  if (config->num_layers < 1 || config->num_heads < 1 || config->num_hiddens < 1 ||
      config->num_hiddens % config->num_heads != 0 || config->tgt_vocab < 1) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "%s: config needs num_layers, num_heads, tgt_vocab ≥ 1 and num_hiddens a "
                "multiple of num_heads",
                me);
    return FALSE;
  }
  /* a step attends to max_len + 1 keys, a count that must be a gint */
  if (max_len == G_MAXINT) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "%s: max_len %d is too large: at most %d (a step attends to max_len + 1 keys)", me,
                max_len, G_MAXINT - 1);
    return FALSE;
  }
  return check_memory(
      me, max_rows, src_len, max_len, (guint64)MAX(config->num_hiddens, config->ffn_hiddens),
      (guint64)config->num_heads, (guint64)config->num_hiddens, config->tgt_vocab, error);
}

/* Source positions × layers a GRU decoder's unrolled encoder may have: a
 * cell is some twenty graph values, whose ids must stay within a guint. */
#define GRU_MAX_CELLS (G_MAXUINT / 32)

gboolean
decode_check_gru(const gchar *me, const QkvGruSeq2SeqConfig *config, gint max_rows, gint64 src_len,
                 gint max_len, GError **error)
{
  if (!check_positive(me, max_rows, src_len, max_len, error))
    return FALSE;
  if (config->num_layers < 1 || config->num_hiddens < 1 || config->embed_size < 1 ||
      config->tgt_vocab < 1 || config->src_vocab < 1) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "%s: config needs num_layers, num_hiddens, embed_size and the vocabularies ≥ 1",
                me);
    return FALSE;
  }
  guint64 cells;
  if (!g_uint64_checked_mul(&cells, (guint64)src_len, (guint64)config->num_layers) ||
      cells > GRU_MAX_CELLS) {
    g_set_error(error, QKV_ERROR, QKV_ERROR_INVALID_ARGUMENT,
                "%s: src_len %" G_GINT64_FORMAT " with %d layers is too long: the GRU encoder is "
                "unrolled over the source (one cell per position and layer), at most %u cells",
                me, src_len, config->num_layers, GRU_MAX_CELLS);
    return FALSE;
  }
  /* per source position: the GRU's input and its three gates; max_len only
   * bounds the steps (no cache grows with it) */
  guint64 width;
  if (!g_uint64_checked_mul(&width, 3, (guint64)config->num_hiddens) ||
      !g_uint64_checked_add(&width, width, (guint64)config->embed_size))
    width = G_MAXUINT64;
  return check_memory(me, max_rows, src_len, max_len, width, 0, 0, config->tgt_vocab, error);
}
