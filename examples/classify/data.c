/* data.c: loading, labelling, deduplicating and splitting the sentences. */
#include "data.h"

#include <gio/gio.h>
#include <string.h>

#include "../common/batch.h"
#include "../common/text.h"

static const gchar *const names[] = {"statement", "question", "exclamation"};
static const gchar *const marks[] = {".", "?", "!"};

const gchar *
class_name(gint label)
{
  return label >= 0 && label < N_CLASSES ? names[label] : "?";
}

const gchar *
class_mark(gint label)
{
  return label >= 0 && label < N_CLASSES ? marks[label] : "";
}

gint
classify_sentence(const gchar *sentence, gchar ***tokens)
{
  if (tokens != NULL)
    *tokens = NULL;
  g_autofree gchar *trimmed = g_strstrip(g_strdup(sentence));
  gsize n = strlen(trimmed);
  if (n == 0)
    return -1;
  gint label = -1;
  for (gint c = 0; c < N_CLASSES; c++)
    if (trimmed[n - 1] == marks[c][0])
      label = c;
  if (label < 0 || tokens == NULL)
    return label;
  g_autofree gchar *lower = g_utf8_strdown(trimmed, -1);
  GString *s = g_string_new(NULL);
  for (const gchar *p = lower; *p != '\0'; p = g_utf8_next_char(p)) {
    gunichar ch = g_utf8_get_char(p);
    if (ch == '.' || ch == '?' || ch == '!' || ch == 0x00A0 || ch == 0x202F ||
        g_unichar_isspace(ch))
      g_string_append_c(s, ' ');
    else if (ch == ',' || ch == ';' || ch == ':' || ch == '"')
      g_string_append_printf(s, " %c ", (gchar)ch);
    else
      g_string_append_unichar(s, ch);
  }
  gchar **parts = g_strsplit(s->str, " ", -1);
  g_string_free(s, TRUE);
  GPtrArray *kept = g_ptr_array_new();
  for (gchar **p = parts; *p != NULL; p++)
    if (**p != '\0')
      g_ptr_array_add(kept, g_strdup(*p));
  g_strfreev(parts);
  g_ptr_array_add(kept, NULL);
  *tokens = (gchar **)g_ptr_array_free(kept, FALSE);
  return label;
}

gint
classify_encode(const Vocab *v, gchar **tokens, gint max_len, gint32 *ids)
{
  return vocab_encode(v, tokens, max_len, FALSE, ids);
}

/* The whole file as text (gunzipped when it ends in .gz). */
static gchar *
read_text(const gchar *path, GError **error)
{
  g_autoptr(GInputStream) in = text_open(path, error);
  if (in == NULL)
    return NULL;
  GString *text = g_string_new(NULL);
  gchar buf[65536];
  for (;;) {
    gssize n = g_input_stream_read(in, buf, sizeof buf, NULL, error);
    if (n < 0) {
      g_string_free(text, TRUE);
      return NULL;
    }
    if (n == 0)
      break;
    if (memchr(buf, '\0', (gsize)n) != NULL) {
      g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA, "%s holds a NUL byte: not text",
                  path);
      g_string_free(text, TRUE);
      return NULL;
    }
    g_string_append_len(text, buf, n);
  }
  if (!g_utf8_validate(text->str, (gssize)text->len, NULL)) {
    g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA, "%s is not valid UTF-8", path);
    g_string_free(text, TRUE);
    return NULL;
  }
  return g_string_free(text, FALSE);
}

typedef struct {
  gchar **tokens;
  gchar *text;
  gint label;
  gboolean conflicted; /* seen with another label too */
} Example;

static void
example_free(gpointer p)
{
  Example *e = p;
  g_strfreev(e->tokens);
  g_free(e->text);
  g_free(e);
}

/* The vocabulary of the first n_train examples: <pad>, <unk>, then the
 * tokens seen at least min_freq times in order of first appearance. */
static Vocab *
build_vocab(GPtrArray *examples, guint n_train, gint min_freq)
{
  TokenCounter counter;
  token_counter_init(&counter);
  for (guint i = 0; i < n_train; i++)
    token_counter_add(&counter, ((Example *)g_ptr_array_index(examples, i))->tokens);
  Vocab *v = vocab_new();
  v->pad = vocab_add(v, "<pad>");
  v->unk = vocab_add(v, "<unk>");
  vocab_add_counted(v, &counter, min_freq);
  token_counter_clear(&counter);
  return v;
}

static void
split_fill(Split *s, GPtrArray *examples, guint from, guint to, const Vocab *v, gint max_len,
           gint *truncated)
{
  s->n = (gint)(to - from);
  s->max_len = max_len;
  s->ids = g_new(gint32, (gsize)s->n * max_len);
  s->lens = g_new(gint32, s->n);
  s->labels = g_new(gint32, s->n);
  s->text = g_new0(gchar *, s->n + 1);
  for (gint i = 0; i < s->n; i++) {
    Example *e = g_ptr_array_index(examples, from + i);
    s->lens[i] = classify_encode(v, e->tokens, max_len, s->ids + (gsize)i * max_len);
    if (g_strv_length(e->tokens) > (guint)max_len)
      (*truncated)++;
    s->labels[i] = e->label;
    s->text[i] = g_strdup(e->text);
  }
}

static void
split_clear(Split *s)
{
  g_free(s->ids);
  g_free(s->lens);
  g_free(s->labels);
  g_strfreev(s->text);
  memset(s, 0, sizeof *s);
}

gboolean
classify_data_load(ClassifyData *data, const gchar *path, gint max_sentences, double held_out,
                   gint n_valid, gint max_len, gint min_freq, guint64 seed, GError **error)
{
  memset(data, 0, sizeof *data);
  g_autofree gchar *text = read_text(path, error);
  if (text == NULL)
    return FALSE;
  g_autoptr(GPtrArray) examples = g_ptr_array_new_with_free_func(example_free);
  /* input text -> its Example, for deduplication */
  g_autoptr(GHashTable) seen = g_hash_table_new(g_str_hash, g_str_equal);
  /* lines cut in place (not g_strsplit: its strstr calls are quadratic
   * under AddressSanitizer's interceptor on a 10 MB text) */
  for (gchar *line = text, *next; line != NULL && *line != '\0'; line = next) {
    next = strchr(line, '\n');
    if (next != NULL)
      *next++ = '\0';
    gchar *tab = strchr(line, '\t');
    if (tab == NULL) {
      /* not a pair; an empty line is no line to report */
      data->n_no_tab += line[0] != '\0' && !(line[0] == '\r' && line[1] == '\0');
      continue;
    }
    *tab = '\0';
    data->n_read++;
    gchar **tokens = NULL;
    gint label = classify_sentence(line, &tokens);
    if (label < 0 || tokens[0] == NULL) {
      data->n_unlabelled++;
      g_strfreev(tokens);
      continue;
    }
    gchar *joined = g_strjoinv(" ", tokens);
    Example *old = g_hash_table_lookup(seen, joined);
    if (old != NULL) {
      /* "Go." and "Go!" are one input: it stays once, with its first label */
      if (old->label != label && !old->conflicted) {
        data->n_conflicts++;
        old->conflicted = TRUE;
      }
      g_free(joined);
      g_strfreev(tokens);
      continue;
    }
    Example *e = g_new0(Example, 1);
    e->tokens = tokens;
    e->text = joined;
    e->label = label;
    g_ptr_array_add(examples, e);
    g_hash_table_insert(seen, e->text, e);
  }
  data->n_unique = (gint)examples->len;
  if (examples->len < 2) {
    g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                "%s: %u labelled sentences; need at least 2 (lines \"English<TAB>French\" whose "
                "English ends in . ? or !)",
                path, examples->len);
    return FALSE;
  }
  /* Fisher-Yates with a seeded generator: the split depends on seed only */
  g_autoptr(GRand) rng = g_rand_new_with_seed((guint32)(seed ^ (seed >> 32)));
  batch_shuffle(rng, examples->pdata, examples->len, sizeof(gpointer));
  guint n = max_sentences > 0 ? MIN((guint)max_sentences, examples->len) : examples->len;
  if (n < 2) {
    g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                "%u sentence kept; a training and a held-out set need at least 2", n);
    return FALSE;
  }
  guint n_held = (guint)(n * held_out + 0.5);
  n_held = CLAMP(n_held, 1, n - 1);
  guint n_train = n - n_held;
  if (n_valid < 0 || (guint)n_valid >= n_train) {
    g_set_error(error, G_IO_ERROR, G_IO_ERROR_INVALID_DATA,
                "--valid %d: the training split has %u sentences; validation must leave some",
                n_valid, n_train);
    return FALSE;
  }
  /* validation: the last n_valid of the training part, kept out of the
   * vocabulary as the held-out sentences are */
  n_train -= (guint)n_valid;

  /* the vocabulary from the training split alone */
  data->vocab = build_vocab(examples, n_train, min_freq);
  split_fill(&data->train, examples, 0, n_train, data->vocab, max_len, &data->n_truncated);
  split_fill(&data->valid, examples, n_train, n_train + (guint)n_valid, data->vocab, max_len,
             &data->n_truncated);
  split_fill(&data->held_out, examples, n_train + (guint)n_valid, n, data->vocab, max_len,
             &data->n_truncated);
  return TRUE;
}

void
classify_data_clear(ClassifyData *data)
{
  split_clear(&data->train);
  split_clear(&data->valid);
  split_clear(&data->held_out);
  vocab_free(data->vocab);
  data->vocab = NULL;
}
