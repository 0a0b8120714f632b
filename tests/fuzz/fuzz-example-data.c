/* fuzz-example-data.c: the examples' readers of tab-separated sentence
 * pairs and their numeric option parser on arbitrary bytes: qkv-seq2seq's
 * seq2seq_data_load_nmt_full() and seq2seq_data_load_pairs(), qkv-classify's
 * classify_data_load(), qkv-gpt's gpt_corpus_load() and gpt_vocab_set(),
 * and the shared options_check_ranges() on option texts. Each either reads
 * what the file holds or fails with a GError; none crashes, leaks or trips
 * a sanitizer.
 *
 * The first 4 bytes choose the sizes (num_examples, num_steps, max_len,
 * min_freq; small, so that a run tries many files), the 5th whether the file
 * is read as gzip (through a symlink named .gz), the rest is the file.
 *
 * QKV_FUZZ_SOURCES: examples/common/text.c examples/common/vocab.c examples/common/batch.c
 * QKV_FUZZ_SOURCES: examples/common/options.c examples/seq2seq/data.c
 * QKV_FUZZ_SOURCES: examples/classify/data.c examples/gpt/data.c
 * QKV_FUZZ_SOURCES: examples/common/spm-none.c
 * (spm-none.c: the subword paths only say that SentencePiece is absent)
 */
#include "fuzz-common.h"

#include <string.h>

#include "../../examples/classify/data.h"
#include "../../examples/common/options.h"
#include "../../examples/gpt/gpt.h"
#include "../../examples/seq2seq/data.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const guint8 *data, size_t size);

static gchar *gz_path;

int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
  fuzz_environment();
  /* text_open() inflates a file whose name ends in .gz */
  g_autofree gchar *dir = g_dir_make_tmp("qkv-fuzz-XXXXXX", NULL);
  if (dir == NULL)
    abort();
  gz_path = g_build_filename(dir, "pairs.txt.gz", NULL);
  if (symlink(fuzz_memfile_path(), gz_path) != 0)
    abort();
  return 0;
}

/* A failure must say why, in UTF-8. */
static void
check_failure(gboolean ok, GError **error)
{
  if (ok) {
    if (*error != NULL)
      abort();
    return;
  }
  if (*error == NULL || !g_utf8_validate((*error)->message, -1, NULL))
    abort();
  g_clear_error(error);
}

static void
check_seq2seq(const gchar *path, const guint8 *p)
{
  gint num_examples = 1 + p[0] % 64, num_steps = 2 + p[1] % 16, max_len = p[2] % 8,
       min_freq = 1 + p[3] % 3;
  Seq2SeqData d = {0};
  Seq2SeqLoadReport report;
  GError *error = NULL;
  gboolean ok = seq2seq_data_load_nmt_full(&d, path, num_examples, num_steps, min_freq, max_len,
                                           &report, &error);
  check_failure(ok, &error);
  if (ok) {
    if (d.n < 1 || d.n > num_examples + 1 || d.num_steps != num_steps)
      abort();
    gint src_size = vocab_size(d.src_vocab), tgt_size = vocab_size(d.tgt_vocab);
    for (gint64 i = 0; i < (gint64)d.n * num_steps; i++)
      if (d.src[i] < 0 || d.src[i] >= src_size || d.tgt[i] < 0 || d.tgt[i] >= tgt_size)
        abort();
    for (gint i = 0; i < d.n; i++)
      if (d.src_valid[i] < 1 || d.src_valid[i] > num_steps || d.tgt_valid[i] < 1 ||
          d.tgt_valid[i] > num_steps)
        abort();
    g_free(seq2seq_load_report_describe(&report, max_len));
    /* a sentence encoded with the vocabulary it was read with */
    gint32 ids[18];
    gint len = seq2seq_encode_sentence(d.src_vocab, "go . <eos> <unk>", num_steps, ids);
    if (len < 1 || len > num_steps)
      abort();
  }
  seq2seq_data_clear(&d);

  GPtrArray *src = NULL, *tgt = NULL;
  ok = seq2seq_data_load_pairs(path, p[0] % 4, 1 + p[1] % 8, &src, &tgt, &error);
  check_failure(ok, &error);
  if (ok) {
    if (src->len != tgt->len || src->len > 1 + p[1] % 8u)
      abort();
    for (guint i = 0; i < src->len; i++)
      if (!g_utf8_validate(g_ptr_array_index(src, i), -1, NULL) ||
          !g_utf8_validate(g_ptr_array_index(tgt, i), -1, NULL))
        abort();
    g_ptr_array_unref(src);
    g_ptr_array_unref(tgt);
  }
}

static void
check_classify(const gchar *path, const guint8 *p)
{
  ClassifyData d;
  GError *error = NULL;
  gint max_len = 1 + p[2] % 8, n_valid = p[3] % 3;
  gboolean ok =
      classify_data_load(&d, path, p[0] % 8, 0.25, n_valid, max_len, 1 + p[3] % 2, p[1], &error);
  check_failure(ok, &error);
  if (ok) {
    gint size = vocab_size(d.vocab);
    const Split *splits[] = {&d.train, &d.valid, &d.held_out};
    for (guint s = 0; s < G_N_ELEMENTS(splits); s++)
      for (gint i = 0; i < splits[s]->n; i++) {
        if (splits[s]->lens[i] < 0 || splits[s]->lens[i] > max_len || splits[s]->labels[i] < 0 ||
            splits[s]->labels[i] >= N_CLASSES)
          abort();
        for (gint j = 0; j < max_len; j++) {
          gint32 id = splits[s]->ids[(gint64)i * max_len + j];
          if (id < 0 || id >= size)
            abort();
        }
      }
  }
  classify_data_clear(&d);
}

static void
check_gpt(const gchar *path, const guint8 *data, size_t size, const guint8 *p)
{
  GptCorpus c = {0};
  GError *error = NULL;
  gboolean ok = gpt_corpus_load(&c, path, p[0] % 16, 0.25, &error);
  check_failure(ok, &error);
  if (ok) {
    for (gint64 i = 0; i < c.train.n; i++)
      if (c.train.ids[i] < 0 || c.train.ids[i] >= c.vocab)
        abort();
    for (gint64 i = 0; i < c.val.n; i++)
      if (c.val.ids[i] < 0 || c.val.ids[i] >= c.vocab)
        abort();
  }
  gpt_corpus_clear(&c);
  /* a checkpoint's vocabulary string */
  g_autofree gchar *chars = g_strndup((const gchar *)data, size);
  GptCorpus v = {0};
  ok = gpt_vocab_set(&v, chars, &error);
  check_failure(ok, &error);
  if (ok) {
    gint n = 0;
    g_autofree gint32 *ids = gpt_encode(&v, chars, &n, &error);
    check_failure(ids != NULL, &error);
    if (ids != NULL) {
      g_autofree gchar *back = gpt_decode(&v, ids, n);
      if (back == NULL)
        abort();
    }
  }
  gpt_corpus_clear(&v);
}

/* The file's first line as the texts of an int, an int64 and a double
 * option: parsed in full and within range, or refused. */
static void
check_options(const guint8 *data, size_t size)
{
  const guint8 *nl = memchr(data, '\n', size);
  g_autofree gchar *text = g_strndup((const gchar *)data, nl ? (gsize)(nl - data) : size);
  gint i = 7;
  gint64 i64 = 7;
  double d = 7;
  gchar *texts[] = {text, text, text};
  const OptionRange ranges[] = {
      {"int", OPTION_RANGE_INT, &i, -5, 1000, 0, 0, FALSE, FALSE, &texts[0], NULL},
      {"int64", OPTION_RANGE_INT64, &i64, G_MININT64, G_MAXINT64, 0, 0, FALSE, FALSE, &texts[1],
       NULL},
      {"double", OPTION_RANGE_DOUBLE, &d, 0, 1, 0, 0, TRUE, FALSE, &texts[2], NULL},
  };
  for (guint k = 0; k < G_N_ELEMENTS(ranges); k++) {
    GError *error = NULL;
    gboolean ok = options_check_ranges(&ranges[k], 1, &error);
    check_failure(ok, &error);
    if (ok && ((k == 0 && (i < -5 || i > 1000)) || (k == 2 && !(d > 0 && d <= 1))))
      abort();
  }
}

int
LLVMFuzzerTestOneInput(const guint8 *data, size_t size)
{
  if (size < 5)
    return 0;
  const guint8 *params = data;
  gboolean gz = data[4] & 1;
  data += 5;
  size -= 5;
  const gchar *path = fuzz_write_input(data, size);
  if (gz)
    path = gz_path;
  check_seq2seq(path, params);
  check_classify(path, params);
  check_gpt(path, data, size, params);
  check_options(data, size);
  return 0;
}
