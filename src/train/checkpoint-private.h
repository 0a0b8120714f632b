/* checkpoint-private.h: what the checkpoint files share. checkpoint-format.c
 * reads and checks a safetensors file into an StFile; checkpoint-load.c
 * matches one against a store and copies it in; checkpoint-save.c writes
 * one. */
#pragma once

#include "core/core-private.h"
#include "qkv/qkv-checkpoint.h"

#define OPTIM_PREFIX "__optim__."
#define METADATA_KEY "__metadata__"
/* "qkv.optimizer.group_of.<param>": the parameter group of a param that is
 * not in group 0 */
#define GROUP_OF_PREFIX "qkv.optimizer.group_of."

#define CORRUPT(...) g_set_error(error, QKV_ERROR, QKV_ERROR_CORRUPT, __VA_ARGS__)

/* The dtypes qkv reads. The floating-point ones load into f32 tensors, the
 * integer ones into i32. */
typedef enum {
  ST_F32,
  ST_I32,
  ST_I64,
  ST_F16,
  ST_BF16,
  ST_F64,
} StDType;

typedef struct {
  gchar *name;
  StDType dtype;
  QkvShape shape;
  guint64 begin, end; /* relative to the data section */
} Entry;

/* A parsed, fully checked file. */
typedef struct {
  gchar *path;
  gchar *contents;
  gsize size;
  guint64 data_start;   /* 8 + header length */
  GPtrArray *entries;   /* Entry*, header order */
  GHashTable *by_name;  /* name -> Entry* */
  GHashTable *metadata; /* gchar* -> gchar* */
} StFile;

void qkv_st_file_free(StFile *f);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(StFile, qkv_st_file_free)

/* Reads path and checks everything the format demands; NULL with a
 * QKV_ERROR_IO or QKV_ERROR_CORRUPT (naming the byte offset) otherwise. */
StFile *qkv_st_file_open(const gchar *path, GError **error);

const gchar *qkv_st_dtype_name(StDType d);
gsize qkv_st_dtype_size(StDType d);
gboolean qkv_st_dtype_is_float(StDType d);
const guchar *qkv_st_entry_data(const StFile *f, const Entry *e);
void qkv_st_copy_le32(gpointer dst, const guchar *src, gsize n);
/* A floating-point entry into f32: F32, BF16 and F16 exactly, F64 rounded
 * to nearest. */
void qkv_st_copy_to_f32(const StFile *f, const Entry *e, float *dst);
gboolean qkv_st_copy_i64_to_i32(const StFile *f, const Entry *e, gint32 *dst, GError **error);
