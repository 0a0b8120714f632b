/* text.c: the data files of text.h. */
#include "text.h"

gchar *
text_fra_eng_path(const gchar *installed_dir, const gchar *source_dir)
{
  const gchar *dirs[] = {g_getenv("QKV_DATA_DIR"), installed_dir, source_dir};
  for (guint i = 0; i < G_N_ELEMENTS(dirs); i++) {
    if (dirs[i] == NULL)
      continue;
    gchar *path = g_build_filename(dirs[i], "fra-eng", "fra.txt.gz", NULL);
    if (g_file_test(path, G_FILE_TEST_EXISTS))
      return path;
    g_free(path);
  }
  return g_build_filename(source_dir, "fra-eng", "fra.txt.gz", NULL);
}

GInputStream *
text_open(const gchar *path, GError **error)
{
  g_autoptr(GFile) file = g_file_new_for_path(path);
  g_autoptr(GFileInputStream) raw = g_file_read(file, NULL, error);
  if (raw == NULL)
    return NULL;
  if (!g_str_has_suffix(path, ".gz"))
    return g_object_ref(G_INPUT_STREAM(raw));
  g_autoptr(GZlibDecompressor) z = g_zlib_decompressor_new(G_ZLIB_COMPRESSOR_FORMAT_GZIP);
  return g_converter_input_stream_new(G_INPUT_STREAM(raw), G_CONVERTER(z));
}
