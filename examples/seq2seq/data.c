/* data.c: the book's fra-eng pipeline (d2l 0.17 load_data_nmt), a synthetic
 * reverse task, and BLEU. */
#include "data.h"

#include <gio/gio.h>
#include <math.h>
#include <string.h>

#include "../common/spm.h"
#include "../common/text.h"

/* The book's Vocab(tokens, min_freq, ['<pad>', '<bos>', '<eos>']): <unk> first,
 * then the reserved tokens, then tokens by falling frequency, ties in order of
 * first appearance. */
static Vocab *
vocab_build(GPtrArray *lines, gint min_freq)
{
  TokenCounter counter;
  token_counter_init(&counter);
  for (guint i = 0; i < lines->len; i++)
    token_counter_add(&counter, g_ptr_array_index(lines, i));
  token_counter_sort_by_count(&counter);
  Vocab *v = vocab_new();
  v->unk = vocab_add(v, "<unk>");
  v->pad = vocab_add(v, "<pad>");
  v->bos = vocab_add(v, "<bos>");
  v->eos = vocab_add(v, "<eos>");
  vocab_add_counted(v, &counter, min_freq);
  token_counter_clear(&counter);
  return v;
}

gchar *
nmt_preprocess(const gchar *text)
{
  g_autofree gchar *lower = g_utf8_strdown(text, -1);
  GString *out = g_string_sized_new(strlen(lower) + strlen(lower) / 4);
  gunichar prev = 0;
  for (const gchar *p = lower; *p; p = g_utf8_next_char(p)) {
    gunichar c = g_utf8_get_char(p);
    if (c == 0x202F || c == 0x00A0)
      c = ' ';
    if ((c == ',' || c == '.' || c == '!' || c == '?') && p != lower && prev != ' ')
      g_string_append_c(out, ' ');
    g_string_append_unichar(out, c);
    prev = c;
  }
  return g_string_free(out, FALSE);
}

/* Longest line read_lines accepts: fra.txt's lines are under 400 bytes, so a
 * longer one means a file of another kind, and the cap keeps a file without
 * newlines from being read whole into memory. */
#define MAX_LINE_BYTES 65536

/* The first max_lines lines of a file (max_lines >= 1), inflating it if its
 * name ends in .gz; reading stops once enough lines are in, so the book's 600
 * pairs do not cost a pass over the whole corpus. The lines kept must be
 * text: no NUL byte (the parsing below works on C strings and would drop
 * whatever follows one) and none longer than MAX_LINE_BYTES. */
static gchar *
read_lines(const gchar *path, gint max_lines, GError **error)
{
  g_autoptr(GInputStream) in = text_open(path, error);
  if (in == NULL)
    return NULL;
  GString *text = g_string_new(NULL);
  gint lines = 0;
  gsize line_bytes = 0;
  gchar buf[65536];
  while (lines < max_lines) {
    gssize n = g_input_stream_read(in, buf, sizeof buf, NULL, error);
    if (n < 0) {
      g_string_free(text, TRUE);
      return NULL;
    }
    if (n == 0)
      break;
    gssize keep = n;
    for (gssize i = 0; i < n; i++) {
      if (buf[i] == '\0') {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                    "line %d holds a NUL byte (byte %" G_GSIZE_FORMAT "); not a text file",
                    lines + 1, text->len + (gsize)i);
        g_string_free(text, TRUE);
        return NULL;
      }
      if (buf[i] == '\n') {
        line_bytes = 0;
        if (++lines == max_lines) {
          keep = i + 1;
          break;
        }
      } else if (++line_bytes > MAX_LINE_BYTES) {
        g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                    "line %d is longer than %d bytes; not a file of tab-separated sentence pairs",
                    lines + 1, MAX_LINE_BYTES);
        g_string_free(text, TRUE);
        return NULL;
      }
    }
    g_string_append_len(text, buf, keep);
  }
  return g_string_free(text, FALSE);
}

/* The text after its first n lines (its end when it has fewer). */
static const gchar *
skip_lines(const gchar *text, gint n)
{
  for (gint i = 0; i < n && *text; i++) {
    const gchar *nl = strchr(text, '\n');
    text = nl ? nl + 1 : text + strlen(text);
  }
  return text;
}

static void
fill_array(GPtrArray *lines, const Vocab *v, gint num_steps, gint32 *ids, gint32 *valid)
{
  for (guint i = 0; i < lines->len; i++)
    valid[i] = vocab_encode(v, g_ptr_array_index(lines, i), num_steps, TRUE, ids + i * num_steps);
}

/* One line's pair: its first two tab-separated columns (a trailing "\r"
 * dropped), or FALSE with why it is none. */
typedef enum { LINE_PAIR, LINE_BLANK, LINE_NO_TAB } LineKind;

static LineKind
line_pair(gchar *line, gchar **src, gchar **tgt, gboolean *more_columns)
{
  gsize len = strlen(line);
  if (len > 0 && line[len - 1] == '\r')
    line[--len] = '\0';
  if (len == 0)
    return LINE_BLANK;
  gchar *tab = strchr(line, '\t');
  if (tab == NULL)
    return LINE_NO_TAB;
  *tab = '\0';
  gchar *second = tab + 1, *third = strchr(second, '\t');
  *more_columns = third != NULL;
  if (third != NULL)
    *third = '\0';
  *src = line;
  *tgt = second;
  return LINE_PAIR;
}

/* The training pairs as token arrays, lines 0..num_examples of text, with
 * what was skipped counted in r. */
static void
collect_pairs(gchar **lines, gint num_examples, gint max_len, GPtrArray *src, GPtrArray *tgt,
              Seq2SeqLoadReport *r)
{
  for (gint i = 0; lines[i] != NULL && i <= num_examples; i++) {
    /* the piece after a final newline is not a line */
    if (lines[i][0] == '\0' && lines[i + 1] == NULL)
      break;
    r->lines++;
    gchar *a = NULL, *b = NULL;
    gboolean more = FALSE;
    LineKind kind = line_pair(lines[i], &a, &b, &more);
    if (kind != LINE_PAIR) {
      r->blank += kind == LINE_BLANK;
      r->no_tab += kind == LINE_NO_TAB;
      continue;
    }
    gchar **s = g_strsplit(a, " ", -1), **t = g_strsplit(b, " ", -1);
    if (max_len > 0 && (g_strv_length(s) > (guint)max_len || g_strv_length(t) > (guint)max_len)) {
      r->too_long++;
      g_strfreev(s);
      g_strfreev(t);
      continue;
    }
    r->more_columns += more;
    g_ptr_array_add(src, s);
    g_ptr_array_add(tgt, t);
  }
}

gchar *
seq2seq_load_report_describe(const Seq2SeqLoadReport *r, gint max_len)
{
  gint skipped = r->no_tab + r->blank + r->too_long;
  if (skipped == 0 && r->more_columns == 0)
    return NULL;
  GString *s = g_string_new(NULL);
  if (skipped > 0) {
    g_string_append_printf(s, "skipped %d of %d lines:", skipped, r->lines);
    const gchar *sep = " ";
    if (r->no_tab > 0) {
      g_string_append_printf(s, "%s%d without a tab (not a pair)", sep, r->no_tab);
      sep = ", ";
    }
    if (r->blank > 0) {
      g_string_append_printf(s, "%s%d blank", sep, r->blank);
      sep = ", ";
    }
    if (r->too_long > 0)
      g_string_append_printf(s, "%s%d with more than %d words on a side (--max-len)", sep,
                             r->too_long, max_len);
  }
  if (r->more_columns > 0)
    g_string_append_printf(s, "%s%d lines with more than two columns: the first two taken",
                           skipped > 0 ? "; " : "", r->more_columns);
  return g_string_free(s, FALSE);
}

gboolean
seq2seq_data_load_nmt(Seq2SeqData *data, const gchar *path, gint num_examples, gint num_steps,
                      GError **error)
{
  return seq2seq_data_load_nmt_full(data, path, num_examples, num_steps, 2, 0, NULL, error);
}

/* The training pairs of the file as word arrays (src, tgt: GStrv each),
 * checked and counted as seq2seq_data_load_nmt_full says. */
static gboolean
load_word_pairs(const gchar *path, gint num_examples, gint num_steps, gint max_len,
                Seq2SeqLoadReport *report, GPtrArray **src_out, GPtrArray **tgt_out, GError **error)
{
  if (num_examples < 1 || num_examples > SEQ2SEQ_MAX_EXAMPLES || num_steps < 2 ||
      num_steps > SEQ2SEQ_MAX_STEPS) {
    g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                "%d examples of %d steps: need 1 to %d examples of 2 to %d steps", num_examples,
                num_steps, SEQ2SEQ_MAX_EXAMPLES, SEQ2SEQ_MAX_STEPS);
    return FALSE;
  }
  g_autofree gchar *raw = read_lines(path, num_examples + 1, error);
  if (raw == NULL) {
    g_prefix_error(error, "reading %s: ", path);
    return FALSE;
  }
  const gchar *bad = NULL;
  if (!g_utf8_validate(raw, -1, &bad)) {
    g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                "%s is not valid UTF-8 (byte %" G_GSIZE_FORMAT ")", path, (gsize)(bad - raw));
    return FALSE;
  }
  /* The book keeps lines 0..num_examples (num_examples + 1 lines); only those
   * need preprocessing, since the rule looks one character back. */
  const gchar *end = skip_lines(raw, num_examples + 1);
  g_autofree gchar *head = g_strndup(raw, end - raw);
  g_autofree gchar *text = nmt_preprocess(head);
  g_auto(GStrv) lines = g_strsplit(text, "\n", -1);
  GPtrArray *src = g_ptr_array_new_with_free_func((GDestroyNotify)g_strfreev);
  GPtrArray *tgt = g_ptr_array_new_with_free_func((GDestroyNotify)g_strfreev);
  Seq2SeqLoadReport r = {0};
  collect_pairs(lines, num_examples, max_len, src, tgt, &r);
  if (report != NULL)
    *report = r;
  /* The book skips lines that are not one tab-separated pair; a file with
   * none at all would train on nothing. */
  if (src->len == 0) {
    g_ptr_array_unref(src);
    g_ptr_array_unref(tgt);
    g_autofree gchar *why = seq2seq_load_report_describe(&r, max_len);
    g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                "%s holds no sentence pairs (lines of the form \"english<TAB>french\") in its "
                "first %d lines%s%s",
                path, num_examples + 1, why ? "; " : "", why ? why : "");
    return FALSE;
  }
  *src_out = src;
  *tgt_out = tgt;
  return TRUE;
}

/* data's id arrays from the token arrays, with its vocabularies */
static void
fill_data(Seq2SeqData *data, GPtrArray *src, GPtrArray *tgt, gint num_steps)
{
  data->n = (gint)src->len;
  data->num_steps = num_steps;
  data->src = g_new0(gint32, (gsize)data->n * num_steps);
  data->tgt = g_new0(gint32, (gsize)data->n * num_steps);
  data->src_valid = g_new0(gint32, data->n);
  data->tgt_valid = g_new0(gint32, data->n);
  fill_array(src, data->src_vocab, num_steps, data->src, data->src_valid);
  fill_array(tgt, data->tgt_vocab, num_steps, data->tgt, data->tgt_valid);
}

gboolean
seq2seq_data_load_nmt_full(Seq2SeqData *data, const gchar *path, gint num_examples, gint num_steps,
                           gint min_freq, gint max_len, Seq2SeqLoadReport *report, GError **error)
{
  memset(data, 0, sizeof(*data));
  GPtrArray *src = NULL, *tgt = NULL;
  if (!load_word_pairs(path, num_examples, num_steps, max_len, report, &src, &tgt, error))
    return FALSE;
  data->src_vocab = vocab_build(src, min_freq);
  data->tgt_vocab = vocab_build(tgt, min_freq);
  fill_data(data, src, tgt, num_steps);
  g_ptr_array_unref(src);
  g_ptr_array_unref(tgt);
  return TRUE;
}

/* A vocabulary of the model's pieces in its id order, splitting with it. */
static Vocab *
vocab_of_subwords(const Spm *spm)
{
  Vocab *v = vocab_new();
  for (gint id = 0, n = spm_size(spm); id < n; id++) {
    g_autofree gchar *piece = spm_piece(spm, id);
    vocab_add(v, piece);
  }
  v->unk = SPM_UNK;
  v->pad = SPM_PAD;
  v->bos = SPM_BOS;
  v->eos = SPM_EOS;
  v->subwords = spm;
  return v;
}

/* The sentences of word arrays (each GStrv joined by spaces: the
 * preprocessed line again) */
static GPtrArray *
sentences_of(GPtrArray *words)
{
  GPtrArray *out = g_ptr_array_new_with_free_func(g_free);
  for (guint i = 0; i < words->len; i++)
    g_ptr_array_add(out, g_strjoinv(" ", g_ptr_array_index(words, i)));
  return out;
}

/* words (GStrv each) replaced by the model's pieces of the same sentences */
static void
split_into_pieces(GPtrArray *words, GPtrArray *sentences, const Spm *spm)
{
  for (guint i = 0; i < words->len; i++) {
    g_strfreev(g_ptr_array_index(words, i));
    g_ptr_array_index(words, i) = spm_encode(spm, g_ptr_array_index(sentences, i));
  }
}

gboolean
seq2seq_data_load_nmt_subwords(Seq2SeqData *data, const gchar *path, gint num_examples,
                               gint num_steps, gint max_len, Seq2SeqSubwords *subwords,
                               Seq2SeqLoadReport *report, GError **error)
{
  memset(data, 0, sizeof(*data));
  GPtrArray *src = NULL, *tgt = NULL;
  if (!load_word_pairs(path, num_examples, num_steps, max_len, report, &src, &tgt, error))
    return FALSE;
  g_autoptr(GPtrArray) src_text = sentences_of(src), tgt_text = sentences_of(tgt);
  Spm *spm = g_steal_pointer(&subwords->model);
  if (spm == NULL) {
    /* one model for both languages: English and French share most of their
     * alphabet and many word pieces */
    g_autoptr(GPtrArray) both = g_ptr_array_new();
    g_ptr_array_extend(both, src_text, NULL, NULL);
    g_ptr_array_extend(both, tgt_text, NULL, NULL);
    spm = spm_train(both, subwords->vocab_size, subwords->type, error);
    if (spm == NULL || (subwords->save != NULL && !spm_save(spm, subwords->save, error))) {
      if (spm != NULL)
        g_prefix_error(error, "saving the SentencePiece model: ");
      spm_free(spm);
      g_ptr_array_unref(src);
      g_ptr_array_unref(tgt);
      return FALSE;
    }
  }
  data->subwords = spm;
  data->src_vocab = vocab_of_subwords(spm);
  data->tgt_vocab = vocab_of_subwords(spm);
  split_into_pieces(src, src_text, spm);
  split_into_pieces(tgt, tgt_text, spm);
  fill_data(data, src, tgt, num_steps);
  g_ptr_array_unref(src);
  g_ptr_array_unref(tgt);
  return TRUE;
}

static guint64
splitmix64(guint64 *state)
{
  guint64 z = (*state += G_GUINT64_CONSTANT(0x9E3779B97F4A7C15));
  z = (z ^ (z >> 30)) * G_GUINT64_CONSTANT(0xBF58476D1CE4E5B9);
  z = (z ^ (z >> 27)) * G_GUINT64_CONSTANT(0x94D049BB133111EB);
  return z ^ (z >> 31);
}

static Vocab *
reverse_vocab(gint size)
{
  Vocab *v = vocab_new();
  v->pad = vocab_add(v, "<pad>");
  v->bos = vocab_add(v, "<bos>");
  v->eos = vocab_add(v, "<eos>");
  v->unk = v->pad;
  for (gint i = 3; i < size; i++) {
    g_autofree gchar *name = g_strdup_printf("t%d", i);
    vocab_add(v, name);
  }
  return v;
}

gboolean
seq2seq_data_reverse(Seq2SeqData *data, gint n, gint num_steps, gint vocab, guint64 seed,
                     GError **error)
{
  memset(data, 0, sizeof(*data));
  /* Tokens are drawn modulo vocab - 3 (after <pad>, <bos>, <eos>), and a
   * sequence holds at least one of them before its <eos>. */
  if (vocab < 4 || vocab > SEQ2SEQ_MAX_REVERSE_VOCAB) {
    g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                "reverse task: vocabulary of %d tokens; need 4 to %d (3 special tokens and at "
                "least one other)",
                vocab, SEQ2SEQ_MAX_REVERSE_VOCAB);
    return FALSE;
  }
  if (n < 1 || n > SEQ2SEQ_MAX_EXAMPLES || num_steps < 2 || num_steps > SEQ2SEQ_MAX_STEPS ||
      (gint64)n * num_steps > SEQ2SEQ_MAX_IDS) {
    g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                "reverse task: %d sequences of %d steps; need 1 to %d sequences of 2 to %d "
                "steps, %" G_GINT64_FORMAT " tokens in all at most",
                n, num_steps, SEQ2SEQ_MAX_EXAMPLES, SEQ2SEQ_MAX_STEPS, SEQ2SEQ_MAX_IDS);
    return FALSE;
  }
  data->n = n;
  data->num_steps = num_steps;
  data->src_vocab = reverse_vocab(vocab);
  data->tgt_vocab = reverse_vocab(vocab);
  data->src = g_new0(gint32, (gsize)n * num_steps);
  data->tgt = g_new0(gint32, (gsize)n * num_steps);
  data->src_valid = g_new0(gint32, n);
  data->tgt_valid = g_new0(gint32, n);
  guint64 state = seed;
  g_autofree gint32 *tokens = g_new(gint32, num_steps);
  for (gint s = 0; s < n; s++) {
    gint len =
        num_steps / 2 + (gint)(splitmix64(&state) % (guint64)(num_steps - num_steps / 2 + 1));
    for (gint i = 0; i < len - 1; i++)
      tokens[i] = 3 + (gint32)(splitmix64(&state) % (guint64)(vocab - 3));
    gint32 *src = data->src + (gsize)s * num_steps, *tgt = data->tgt + (gsize)s * num_steps;
    for (gint i = 0; i < num_steps; i++)
      src[i] = tgt[i] = 0;
    for (gint i = 0; i < len - 1; i++) {
      src[i] = tokens[i];
      tgt[i] = tokens[len - 2 - i];
    }
    src[len - 1] = tgt[len - 1] = 2;
    data->src_valid[s] = data->tgt_valid[s] = len;
  }
  return TRUE;
}

void
seq2seq_data_clear(Seq2SeqData *data)
{
  g_free(data->src);
  g_free(data->tgt);
  g_free(data->src_valid);
  g_free(data->tgt_valid);
  vocab_free(data->src_vocab);
  vocab_free(data->tgt_vocab);
  spm_free(data->subwords);
  memset(data, 0, sizeof(*data));
}

gint
seq2seq_encode_sentence(const Vocab *vocab, const gchar *sentence, gint num_steps, gint32 *ids)
{
  g_autofree gchar *lower = g_utf8_strdown(sentence, -1);
  g_auto(GStrv) tokens =
      vocab->subwords != NULL ? spm_encode(vocab->subwords, lower) : g_strsplit(lower, " ", -1);
  return vocab_encode(vocab, tokens, num_steps, TRUE, ids);
}

gchar *
seq2seq_decode_ids(const Vocab *vocab, const gint32 *ids, gint n)
{
  if (vocab->subwords != NULL) {
    /* the ids come from a model of this vocabulary's size, so decoding
     * cannot fail on a range; an error would be a bug */
    g_autoptr(GError) error = NULL;
    gchar *text = spm_decode(vocab->subwords, ids, n, &error);
    if (text == NULL)
      g_error("decoding subword ids: %s", error->message);
    return text;
  }
  GString *text = g_string_new(NULL);
  for (gint i = 0; i < n; i++)
    g_string_append_printf(text, "%s%s", i ? " " : "", vocab_token(vocab, ids[i]));
  return g_string_free(text, FALSE);
}

gboolean
seq2seq_data_load_pairs(const gchar *path, gint first, gint n, GPtrArray **src_out,
                        GPtrArray **tgt_out, GError **error)
{
  if (first < 0 || n < 1 || first > G_MAXINT - n) {
    g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT,
                "asked for %d lines from line %d: need 1 or more lines from a line ≥ 0", n, first);
    return FALSE;
  }
  g_autofree gchar *raw = read_lines(path, first + n, error);
  if (raw == NULL) {
    g_prefix_error(error, "reading %s: ", path);
    return FALSE;
  }
  const gchar *start = skip_lines(raw, first);
  const gchar *bad = NULL;
  if (!g_utf8_validate(start, -1, &bad)) {
    g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                "%s is not valid UTF-8 (byte %" G_GSIZE_FORMAT ")", path, (gsize)(bad - raw));
    return FALSE;
  }
  g_autofree gchar *text = nmt_preprocess(start);
  g_auto(GStrv) lines = g_strsplit(text, "\n", -1);
  GPtrArray *src = g_ptr_array_new_with_free_func(g_free);
  GPtrArray *tgt = g_ptr_array_new_with_free_func(g_free);
  for (gint i = 0; lines[i] != NULL; i++) {
    gchar *a = NULL, *b = NULL;
    gboolean more = FALSE;
    if (line_pair(lines[i], &a, &b, &more) != LINE_PAIR)
      continue;
    g_ptr_array_add(src, g_strdup(a));
    g_ptr_array_add(tgt, g_strdup(b));
  }
  *src_out = src;
  *tgt_out = tgt;
  return TRUE;
}
