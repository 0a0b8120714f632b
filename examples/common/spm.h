/* spm.h: subword vocabularies by SentencePiece (libsentencepiece), behind a
 * C API for the examples; spm.cc wraps the C++ library, spm-none.c stands in
 * when qkv was built without it (-Dsentencepiece=disabled, or no
 * libsentencepiece-dev), and every call then fails with a message that says
 * so.
 *
 * The models these functions train keep the examples' reserved ids:
 * <unk> 0, <pad> 1, <bos> 2, <eos> 3, as the word vocabularies of
 * seq2seq/data.c number them, so that a model sees the same special ids
 * whichever vocabulary it was trained on. The text is taken as it is (the
 * "identity" normalisation): the examples preprocess it themselves, and the
 * decoded text must be comparable with theirs. */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

typedef struct Spm Spm;

/* The ids spm_train() gives the reserved pieces. */
enum { SPM_UNK = 0, SPM_PAD = 1, SPM_BOS = 2, SPM_EOS = 3 };

/* Whether this build has SentencePiece. */
gboolean spm_available(void);

/* Train a model on sentences (gchar*, UTF-8), of vocab_size pieces at most
 * (fewer where the text has too few: the limit is soft), type "unigram" or
 * "bpe", on one thread so that the same sentences give the same model. */
Spm *spm_train(GPtrArray *sentences, gint vocab_size, const gchar *type, GError **error);
/* A model from a file spm_save() (or spm_train of the sentencepiece
 * tools) wrote. */
Spm *spm_load(const gchar *path, GError **error);
/* A model from the bytes spm_serialize() gave. */
Spm *spm_load_serialized(const guint8 *data, gsize len, GError **error);
gboolean spm_save(const Spm *spm, const gchar *path, GError **error);
/* The model as bytes (the model file's content); free with g_bytes_unref(). */
GBytes *spm_serialize(const Spm *spm);
void spm_free(Spm *spm);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(Spm, spm_free)

/* The number of pieces; ids are 0 .. size − 1. */
gint spm_size(const Spm *spm);
/* The piece of id ("▁" marks a word's start); free with g_free(). */
gchar *spm_piece(const Spm *spm, gint id);
/* The pieces of text, NULL-terminated; free with g_strfreev(). */
gchar **spm_encode(const Spm *spm, const gchar *text);
/* The text of ids (pieces joined, "▁" back to spaces; <unk> as " ⁇ ");
 * ids out of range fail. Free with g_free(). */
gchar *spm_decode(const Spm *spm, const gint32 *ids, gint n, GError **error);

G_END_DECLS
