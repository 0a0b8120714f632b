/* fuzz-safetensors.c: qkv_safetensors_read() and
 * qkv_checkpoint_read_metadata() on arbitrary bytes. A file either reads
 * into tensors that match its header or is refused with a QKV_ERROR; it
 * never crashes, leaks or trips a sanitizer.
 *
 * QKV_FUZZ_SEEDS: checkpoints (run.sh seeds it with files qkv saves) */
#include "fuzz-common.h"

#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const guint8 *data, size_t size);

int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
  fuzz_environment();
  return 0;
}

int
LLVMFuzzerTestOneInput(const guint8 *data, size_t size)
{
  const gchar *path = fuzz_write_input(data, size);
  GError *error = NULL;
  GHashTable *meta = NULL;
  GHashTable *tensors = qkv_safetensors_read(path, &meta, &error);
  gboolean read_ok = tensors != NULL;
  if (tensors == NULL) {
    if (error == NULL || error->domain != QKV_ERROR || !g_utf8_validate(error->message, -1, NULL))
      abort();
    g_clear_error(&error);
  } else {
    if (error != NULL || meta == NULL)
      abort();
    /* every name and metadata string is UTF-8 without NULs cut short */
    GHashTableIter it;
    gpointer k, v;
    g_hash_table_iter_init(&it, tensors);
    guint64 total = 0;
    while (g_hash_table_iter_next(&it, &k, &v)) {
      if (!g_utf8_validate(k, -1, NULL))
        abort();
      total += (guint64)qkv_tensor_numel(v);
    }
    /* the tensors tile the data, and every element takes 2 bytes of it at
     * least (F16, BF16; they read as 4-byte f32) */
    if (2 * total > size)
      abort();
    g_hash_table_iter_init(&it, meta);
    while (g_hash_table_iter_next(&it, &k, &v))
      if (!g_utf8_validate(k, -1, NULL) || !g_utf8_validate(v, -1, NULL))
        abort();
    g_hash_table_unref(tensors);
    g_hash_table_unref(meta);
  }
  GHashTable *m = qkv_checkpoint_read_metadata(path, &error);
  /* both readers share one parser: a file whose tensors read has a header
   * the metadata reader accepts (the converse need not hold: an I64 value
   * outside i32 fails only the tensor read) */
  if (read_ok && m == NULL)
    abort();
  if (m != NULL)
    g_hash_table_unref(m);
  g_clear_error(&error);
  return 0;
}
