/* test-spm.c: the SentencePiece shim (examples/common/spm.h) and the
 * seq2seq example's subword data: a tiny model trained on the first pairs
 * of the shipped corpus keeps the reserved ids, splits every training
 * sentence into pieces that decode back to it, survives saving and loading,
 * and refuses bad input with a message. In a build without SentencePiece
 * every call must say so instead. */
#include <glib.h>
#include <glib/gstdio.h>
#include <string.h>

#include "../examples/common/spm.h"
#include "../examples/seq2seq/data.h"

static gchar *
corpus_path(void)
{
  const gchar *root = g_getenv("QKV_SOURCE_ROOT");
  g_assert_nonnull(root);
  return g_build_filename(root, "examples", "data", "fra-eng", "fra.txt.gz", NULL);
}

/* The first n pairs' sentences, both languages, preprocessed. */
static GPtrArray *
sentences(gint n)
{
  g_autofree gchar *path = corpus_path();
  GPtrArray *src = NULL, *tgt = NULL;
  g_autoptr(GError) error = NULL;
  g_assert_true(seq2seq_data_load_pairs(path, 0, n, &src, &tgt, &error));
  g_assert_no_error(error);
  g_ptr_array_extend_and_steal(src, tgt);
  return src;
}

static void
test_unavailable(void)
{
  if (spm_available()) {
    g_test_skip("this build has SentencePiece");
    return;
  }
  g_autoptr(GPtrArray) s = sentences(10);
  g_autoptr(GError) error = NULL;
  g_assert_null(spm_train(s, 50, "unigram", &error));
  g_assert_nonnull(strstr(error->message, "SentencePiece"));
}

/* Every sentence: its pieces decode back to it, and the ids of its pieces
 * are below the model's size. */
static void
check_round_trip(const Spm *spm, GPtrArray *s)
{
  for (guint i = 0; i < s->len; i++) {
    const gchar *text = g_ptr_array_index(s, i);
    g_auto(GStrv) pieces = spm_encode(spm, text);
    g_assert_cmpuint(g_strv_length(pieces), >, 0);
    /* the pieces concatenated are the text with "▁" for every space and
     * one before the first word: what decoding inverts */
    g_autofree gchar *joined = g_strjoinv("", pieces);
    g_auto(GStrv) words = g_strsplit(text, " ", -1);
    g_autofree gchar *marked = g_strjoinv("\xe2\x96\x81", words);
    g_autofree gchar *want = g_strconcat("\xe2\x96\x81", marked, NULL);
    g_assert_cmpstr(joined, ==, want);
  }
}

static void
test_train(gconstpointer type)
{
  if (!spm_available()) {
    g_test_skip("built without SentencePiece");
    return;
  }
  g_autoptr(GPtrArray) s = sentences(40); /* 80 sentences */
  g_autoptr(GError) error = NULL;
  g_autoptr(Spm) spm = spm_train(s, 120, type, &error);
  g_assert_no_error(error);
  gint n = spm_size(spm);
  g_assert_cmpint(n, >, 4);
  g_assert_cmpint(n, <=, 120);
  const gchar *reserved[] = {"<unk>", "<pad>", "<bos>", "<eos>"};
  for (gint i = 0; i < 4; i++) {
    g_autofree gchar *piece = spm_piece(spm, i);
    g_assert_cmpstr(piece, ==, reserved[i]);
  }
  g_assert_null(spm_piece(spm, n));
  check_round_trip(spm, s);
  /* the same sentences give the same model (distributed ranks each train
   * one and must agree) */
  g_autoptr(Spm) again = spm_train(s, 120, type, &error);
  g_assert_no_error(error);
  g_autoptr(GBytes) a = spm_serialize(spm), b = spm_serialize(again);
  g_assert_true(g_bytes_equal(a, b));
  /* saved and loaded, from a file and from bytes: the same pieces */
  g_autofree gchar *dir = g_dir_make_tmp("qkv-spm-XXXXXX", &error);
  g_autofree gchar *path = g_build_filename(dir, "m.model", NULL);
  g_assert_true(spm_save(spm, path, &error));
  g_autoptr(Spm) loaded = spm_load(path, &error);
  g_assert_no_error(error);
  gsize len = 0;
  const guint8 *bytes = g_bytes_get_data(a, &len);
  g_autoptr(Spm) from_bytes = spm_load_serialized(bytes, len, &error);
  g_assert_no_error(error);
  const gchar *unseen = "we lost the game at home .";
  g_auto(GStrv) p0 = spm_encode(spm, unseen);
  g_auto(GStrv) p1 = spm_encode(loaded, unseen);
  g_auto(GStrv) p2 = spm_encode(from_bytes, unseen);
  g_assert_true(g_strv_equal((const gchar *const *)p0, (const gchar *const *)p1));
  g_assert_true(g_strv_equal((const gchar *const *)p0, (const gchar *const *)p2));
  /* bad input: a file that is no model, an id out of range, a type */
  g_assert_true(g_file_set_contents(path, "not a model", -1, &error));
  g_assert_null(spm_load(path, &error));
  g_assert_nonnull(strstr(error->message, path));
  g_clear_error(&error);
  g_unlink(path);
  g_rmdir(dir);
  gint32 ids[] = {5, n};
  g_assert_null(spm_decode(spm, ids, 2, &error));
  g_assert_nonnull(strstr(error->message, "outside"));
  g_clear_error(&error);
  g_assert_null(spm_train(s, 120, "wordpiece", &error));
  g_assert_nonnull(strstr(error->message, "unigram or bpe"));
}

/* The example's data in subwords: ids of the model, decoding back to the
 * preprocessed pairs, which encode as seq2seq_encode_sentence does. */
static void
test_data(void)
{
  if (!spm_available()) {
    g_test_skip("built without SentencePiece");
    return;
  }
  g_autofree gchar *path = corpus_path();
  Seq2SeqData d;
  Seq2SeqSubwords sw = {.vocab_size = 150, .type = "bpe"};
  g_autoptr(GError) error = NULL;
  const gint T = 32; /* long enough for every piece of the first pairs */
  g_assert_true(seq2seq_data_load_nmt_subwords(&d, path, 50, T, 0, &sw, NULL, &error));
  g_assert_no_error(error);
  g_assert_nonnull(d.subwords);
  g_assert_true(d.src_vocab->subwords == d.subwords && d.tgt_vocab->subwords == d.subwords);
  g_assert_cmpint(vocab_size(d.src_vocab), ==, spm_size(d.subwords));
  g_assert_cmpint(d.tgt_vocab->eos, ==, SPM_EOS);
  GPtrArray *src = NULL, *tgt = NULL;
  g_assert_true(seq2seq_data_load_pairs(path, 0, 51, &src, &tgt, &error));
  g_assert_cmpint(d.n, ==, (gint)src->len);
  g_autofree gint32 *ids = g_new(gint32, T);
  for (gint i = 0; i < d.n; i++) {
    const gint32 *row = d.tgt + (gsize)i * T;
    gint valid = d.tgt_valid[i];
    g_assert_cmpint(valid, <, T); /* nothing cut */
    g_assert_cmpint(row[valid - 1], ==, SPM_EOS);
    g_autofree gchar *text = seq2seq_decode_ids(d.tgt_vocab, row, valid - 1);
    g_assert_cmpstr(text, ==, g_ptr_array_index(tgt, i));
    gint v2 = seq2seq_encode_sentence(d.src_vocab, g_ptr_array_index(src, i), T, ids);
    g_assert_cmpint(v2, ==, d.src_valid[i]);
    g_assert_cmpmem(ids, v2 * sizeof(gint32), d.src + (gsize)i * T, v2 * sizeof(gint32));
  }
  g_ptr_array_unref(src);
  g_ptr_array_unref(tgt);
  seq2seq_data_clear(&d);
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  g_test_add_func("/spm/unavailable", test_unavailable);
  g_test_add_data_func("/spm/train-unigram", "unigram", test_train);
  g_test_add_data_func("/spm/train-bpe", "bpe", test_train);
  g_test_add_func("/spm/data", test_data);
  return g_test_run();
}
