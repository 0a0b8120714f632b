/* test-seq2seq-data.c: the seq2seq example's data pipeline against the
 * numbers the book's code prints (../shared/reference/d2l/run017_*.txt). */
#include <glib.h>
#include <math.h>

#include "../examples/seq2seq/bleu.h"
#include "../examples/seq2seq/data.h"

static gchar *
fra_path(void)
{
  return g_build_filename(g_getenv("QKV_SOURCE_ROOT"), "examples", "data", "fra-eng", "fra.txt.gz",
                          NULL);
}

static void
test_nmt_like_the_book(void)
{
  g_autofree gchar *path = fra_path();
  Seq2SeqData d;
  g_autoptr(GError) error = NULL;
  g_assert_true(seq2seq_data_load_nmt(&d, path, 600, 10, &error));
  g_assert_no_error(error);
  g_assert_cmpint(d.n, ==, 601);
  g_assert_cmpint(vocab_size(d.src_vocab), ==, 184);
  g_assert_cmpint(vocab_size(d.tgt_vocab), ==, 201);
  const gchar *src_first[] = {"<unk>", "<pad>", "<bos>", "<eos>", ".", "!", "i", "i'm", "it", "go"};
  const gchar *tgt_first[] = {"<unk>", "<pad>", "<bos>", "<eos>", ".",
                              "!",     "je",    "suis",  "tom",   "?"};
  for (int i = 0; i < 10; i++) {
    g_assert_cmpstr(vocab_token(d.src_vocab, i), ==, src_first[i]);
    g_assert_cmpstr(vocab_token(d.tgt_vocab, i), ==, tgt_first[i]);
  }
  /* "go ." → go . <eos> <pad>…; "va !" → va ! <eos> */
  g_assert_cmpint(d.src[0], ==, vocab_lookup(d.src_vocab, "go"));
  g_assert_cmpint(d.src[1], ==, 4);
  g_assert_cmpint(d.src[2], ==, 3);
  g_assert_cmpint(d.src[3], ==, 1);
  g_assert_cmpint(d.src_valid[0], ==, 3);
  g_assert_cmpint(d.tgt[0], ==, vocab_lookup(d.tgt_vocab, "va"));
  g_assert_cmpint(d.tgt_valid[0], ==, 3);
  seq2seq_data_clear(&d);
}

static void
test_preprocess(void)
{
  g_autofree gchar *a = nmt_preprocess("Go.\tVa\u202f!\nHi!");
  g_assert_cmpstr(a, ==, "go .\tva !\nhi !");
  g_autofree gchar *b = nmt_preprocess("Wait, I'M\u00a0HERE?");
  g_assert_cmpstr(b, ==, "wait , i'm here ?");
}

static void
test_bleu(void)
{
  g_assert_cmpfloat(fabs(bleu("va !", "va !", 2) - 1.0), <, 1e-12);
  g_assert_cmpfloat(fabs(bleu("je suis calme .", "il est calme .", 2) - 0.537), <, 5e-4);
  g_assert_cmpfloat(fabs(bleu("il est paresseux .", "il est calme .", 2) - 0.658), <, 5e-4);
  g_assert_cmpfloat(bleu("x", "il est calme .", 2), ==, 0.0);
}

/* The pairs after the training lines are the file's next lines, processed
 * as training data is. */
static void
test_heldout_pairs(void)
{
  g_autofree gchar *path = fra_path();
  g_autoptr(GError) error = NULL;
  GPtrArray *src = NULL, *tgt = NULL, *all_src = NULL, *all_tgt = NULL;
  g_assert_true(seq2seq_data_load_pairs(path, 601, 1000, &src, &tgt, &error));
  g_assert_no_error(error);
  g_assert_true(seq2seq_data_load_pairs(path, 0, 1601, &all_src, &all_tgt, &error));
  g_assert_cmpuint(src->len, ==, 1000);
  g_assert_cmpuint(all_src->len, ==, 1601);
  for (guint i = 0; i < src->len; i++) {
    g_assert_cmpstr(g_ptr_array_index(src, i), ==, g_ptr_array_index(all_src, 601 + i));
    g_assert_cmpstr(g_ptr_array_index(tgt, i), ==, g_ptr_array_index(all_tgt, 601 + i));
  }
  /* the first 601 are the book's training pairs, token for token */
  Seq2SeqData d;
  g_assert_true(seq2seq_data_load_nmt(&d, path, 600, 10, &error));
  for (gint i = 0; i < d.n; i += 100) {
    gint32 ids[10];
    gint valid = seq2seq_encode_sentence(d.src_vocab, g_ptr_array_index(all_src, i), 10, ids);
    g_assert_cmpint(valid, ==, d.src_valid[i]);
    g_assert_cmpmem(ids, sizeof ids, d.src + i * 10, sizeof ids);
  }
  seq2seq_data_clear(&d);
  g_ptr_array_unref(src);
  g_ptr_array_unref(tgt);
  g_ptr_array_unref(all_src);
  g_ptr_array_unref(all_tgt);

  /* past the end of the file: no pairs, and no error */
  g_assert_true(seq2seq_data_load_pairs(path, 300000, 10, &src, &tgt, &error));
  g_assert_no_error(error);
  g_assert_cmpuint(src->len, ==, 0);
  g_ptr_array_unref(src);
  g_ptr_array_unref(tgt);
}

static void
test_reverse_task(void)
{
  /* bench/peers/ref_S_seed0/first_batch.json: splitmix64(0) stream, T = 10 */
  Seq2SeqData d;
  g_assert_true(seq2seq_data_reverse(&d, 4, 10, 200, 0, NULL));
  const gint32 row0[] = {176, 110, 20, 135, 121, 2, 0, 0, 0, 0};
  const gint32 row1[] = {74, 100, 60, 53, 147, 161, 97, 162, 117, 2};
  for (int i = 0; i < 10; i++) {
    g_assert_cmpint(d.src[i], ==, row0[i]);
    g_assert_cmpint(d.src[10 + i], ==, row1[i]);
  }
  for (int s = 0; s < 4; s++) {
    gint len = d.src_valid[s];
    g_assert_cmpint(len, >=, 5);
    g_assert_cmpint(len, <=, 10);
    g_assert_cmpint(d.src[s * 10 + len - 1], ==, 2);
    for (int i = 0; i < len - 1; i++)
      g_assert_cmpint(d.tgt[s * 10 + i], ==, d.src[s * 10 + len - 2 - i]);
  }
  seq2seq_data_clear(&d);
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  g_test_add_func("/seq2seq-data/nmt-like-the-book", test_nmt_like_the_book);
  g_test_add_func("/seq2seq-data/preprocess", test_preprocess);
  g_test_add_func("/seq2seq-data/bleu", test_bleu);
  g_test_add_func("/seq2seq-data/heldout-pairs", test_heldout_pairs);
  g_test_add_func("/seq2seq-data/reverse-task", test_reverse_task);
  return g_test_run();
}
