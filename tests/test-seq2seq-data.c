/* test-seq2seq-data.c: the seq2seq example's data pipeline against the
 * numbers the book's code prints (../shared/reference/d2l/run017_*.txt). */
#include <glib.h>
#include <glib/gstdio.h>
#include <math.h>
#include <string.h>

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

/* Your own data: three or more columns (the first two are the pair), a
 * "\r" before the newline, lines that are no pair counted by kind, pairs
 * over --max-len skipped, --min-freq for the vocabularies. */
static void
test_own_data(void)
{
  g_autofree gchar *dir = g_dir_make_tmp("qkv-seq2seq-data-XXXXXX", NULL);
  g_autofree gchar *path = g_build_filename(dir, "pairs.txt", NULL);
  const gchar *text = "Go.\tVa !\tCC-BY 2.0 (France) Attribution: tatoeba.org #2877272\n"
                      "Hi.\tSalut !\r\n"
                      "no tab\n"
                      "\n"
                      "Go on, go on, go on.\tContinue.\tattribution\textra\n"
                      "Go.\tVa !\n";
  g_assert_true(g_file_set_contents(path, text, -1, NULL));
  Seq2SeqData d;
  Seq2SeqLoadReport r;
  g_autoptr(GError) error = NULL;
  g_assert_true(seq2seq_data_load_nmt_full(&d, path, 100, 10, 1, 0, &r, &error));
  g_assert_no_error(error);
  g_assert_cmpint(d.n, ==, 4);
  g_assert_cmpint(r.lines, ==, 6);
  g_assert_cmpint(r.no_tab, ==, 1);
  g_assert_cmpint(r.blank, ==, 1);
  g_assert_cmpint(r.too_long, ==, 0);
  g_assert_cmpint(r.more_columns, ==, 2);
  /* "salut !" without the \r: both its words are in the vocabulary */
  g_assert_cmpint(vocab_lookup(d.tgt_vocab, "!"), !=, d.tgt_vocab->unk);
  g_assert_cmpint(vocab_lookup(d.tgt_vocab, "salut"), !=, d.tgt_vocab->unk);
  g_autofree gchar *said = seq2seq_load_report_describe(&r, 0);
  g_assert_cmpstr(said, ==,
                  "skipped 2 of 6 lines: 1 without a tab (not a pair), 1 blank; 2 lines with "
                  "more than two columns: the first two taken");
  seq2seq_data_clear(&d);

  /* --max-len 3: "go on , go on , go on ." (10 words) is skipped; --min-freq
   * 2 keeps only the words of the two "go ." pairs */
  g_assert_true(seq2seq_data_load_nmt_full(&d, path, 100, 10, 2, 3, &r, &error));
  g_assert_cmpint(d.n, ==, 3);
  g_assert_cmpint(r.too_long, ==, 1);
  g_assert_cmpint(vocab_size(d.src_vocab), ==, 4 + 2); /* <unk> <pad> <bos> <eos> go . */
  g_autofree gchar *said2 = seq2seq_load_report_describe(&r, 3);
  g_assert_nonnull(strstr(said2, "1 with more than 3 words on a side (--max-len)"));
  seq2seq_data_clear(&d);

  /* the held-out reader takes the same lines as pairs */
  GPtrArray *src = NULL, *tgt = NULL;
  g_assert_true(seq2seq_data_load_pairs(path, 0, 10, &src, &tgt, &error));
  g_assert_cmpuint(src->len, ==, 4);
  g_assert_cmpstr(g_ptr_array_index(src, 0), ==, "go .");
  g_assert_cmpstr(g_ptr_array_index(tgt, 0), ==, "va !");
  g_assert_cmpstr(g_ptr_array_index(tgt, 1), ==, "salut !");
  g_assert_cmpstr(g_ptr_array_index(tgt, 2), ==, "continue .");
  g_ptr_array_unref(src);
  g_ptr_array_unref(tgt);

  /* nothing but skipped lines: the error says why */
  g_assert_true(g_file_set_contents(path, "no tab\n\n", -1, NULL));
  g_assert_false(seq2seq_data_load_nmt_full(&d, path, 100, 10, 2, 0, &r, &error));
  g_assert_nonnull(strstr(error->message, "1 without a tab (not a pair), 1 blank"));
  g_unlink(path);
  g_rmdir(dir);
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
  g_test_add_func("/seq2seq-data/own-data", test_own_data);
  return g_test_run();
}
