/* spm-none.c: spm.h in a build without SentencePiece; every call fails with
 * the reason (the program refuses --vocab sentencepiece before it gets
 * here, so these only guard against a missed check). */
#include "spm.h"

#include <gio/gio.h>

#define NO_SPM                                                                                     \
  "this build has no SentencePiece (install libsentencepiece-dev and build with "                  \
  "-Dsentencepiece=enabled)"

gboolean
spm_available(void)
{
  return FALSE;
}

Spm *
spm_train(GPtrArray *sentences, gint vocab_size, const gchar *type, GError **error)
{
  g_set_error_literal(error, G_IO_ERROR, G_IO_ERROR_NOT_SUPPORTED, NO_SPM);
  return NULL;
}

Spm *
spm_load(const gchar *path, GError **error)
{
  g_set_error_literal(error, G_IO_ERROR, G_IO_ERROR_NOT_SUPPORTED, NO_SPM);
  return NULL;
}

Spm *
spm_load_serialized(const guint8 *data, gsize len, GError **error)
{
  g_set_error_literal(error, G_IO_ERROR, G_IO_ERROR_NOT_SUPPORTED, NO_SPM);
  return NULL;
}

gboolean
spm_save(const Spm *spm, const gchar *path, GError **error)
{
  g_set_error_literal(error, G_IO_ERROR, G_IO_ERROR_NOT_SUPPORTED, NO_SPM);
  return FALSE;
}

GBytes *
spm_serialize(const Spm *spm)
{
  return NULL;
}

void
spm_free(Spm *spm)
{
}

gint
spm_size(const Spm *spm)
{
  return 0;
}

gchar *
spm_piece(const Spm *spm, gint id)
{
  return NULL;
}

gchar **
spm_encode(const Spm *spm, const gchar *text)
{
  return g_new0(gchar *, 1);
}

gchar *
spm_decode(const Spm *spm, const gint32 *ids, gint n, GError **error)
{
  g_set_error_literal(error, G_IO_ERROR, G_IO_ERROR_NOT_SUPPORTED, NO_SPM);
  return NULL;
}
