/* test-seq2seq-cli.c: qkv-seq2seq refuses bad options, data and checkpoints
 * with a message and a non-zero exit status, before training where it can,
 * instead of crashing or training on nonsense. The binary is $QKV_SEQ2SEQ.
 * Every run is tiny (the reverse task, a few sequences, one epoch). */
#include <gio/gio.h>
#include <glib.h>
#include <glib/gstdio.h>
#include <json-glib/json-glib.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

/* settings that train in milliseconds */
#define TINY                                                                                       \
  "--task", "reverse", "--reverse-size", "20", "--reverse-vocab", "10", "--num-steps", "6",        \
      "--hidden", "8", "--ffn", "8", "--heads", "2", "--layers", "1", "--batch-size", "4", "-q"

/* the same on a few fra-eng pairs */
#define TINY_FRA                                                                                   \
  "--num-examples", "40", "--num-steps", "6", "--hidden", "8", "--ffn", "8", "--heads", "2",       \
      "--layers", "1", "--batch-size", "8"

static gchar *tmpdir;

typedef struct {
  gint exit_status; /* -1: killed by a signal */
  gchar *out, *err;
} Run;

static void
run_clear(Run *r)
{
  g_free(r->out);
  g_free(r->err);
}

static Run
run_cli(const gchar *const *args)
{
  const gchar *binary = g_getenv("QKV_SEQ2SEQ");
  g_assert_nonnull(binary);
  GPtrArray *argv = g_ptr_array_new();
  g_ptr_array_add(argv, (gpointer)binary);
  for (guint i = 0; args[i] != NULL; i++)
    g_ptr_array_add(argv, (gpointer)args[i]);
  g_ptr_array_add(argv, NULL);
  Run r = {0};
  gint status = 0;
  g_autoptr(GError) error = NULL;
  g_assert_true(g_spawn_sync(NULL, (gchar **)argv->pdata, NULL, G_SPAWN_DEFAULT, NULL, NULL, &r.out,
                             &r.err, &status, &error));
  g_assert_no_error(error);
  g_ptr_array_unref(argv);
  r.exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

static gchar *
describe(const gchar *const *args)
{
  return g_strjoinv(" ", (gchar **)args);
}

/* The run exits with status want (not a crash), says what is wrong on
 * stderr (a message containing needle), and trained nothing. */
static void
expect_refused(const gchar *const *args, gint want, const gchar *needle)
{
  g_autofree gchar *what = describe(args);
  Run r = run_cli(args);
  if (r.exit_status != want || strstr(r.err, needle) == NULL || strstr(r.out, "loss ") != NULL)
    g_error("qkv-seq2seq %s: exit status %d (want %d), stderr '%s' (want '%s'), stdout '%s'", what,
            r.exit_status, want, r.err, needle, r.out);
  g_test_message("%s -> %s", what, r.err);
  run_clear(&r);
}

static void
expect_success(const gchar *const *args)
{
  g_autofree gchar *what = describe(args);
  Run r = run_cli(args);
  if (r.exit_status != 0)
    g_error("qkv-seq2seq %s: exit status %d, stderr '%s'", what, r.exit_status, r.err);
  run_clear(&r);
}

/* Item 6 of issue 17: these crashed (SIGFPE, a stack overflow through a
 * variable-length array, an abort in g_new0). */
static void
test_crashing_options(void)
{
  expect_refused((const gchar *[]){"--task", "reverse", "--reverse-vocab", "3", NULL}, 2,
                 "--reverse-vocab");
  expect_refused((const gchar *[]){"--task", "reverse", "--num-steps", "50000000", "--reverse-size",
                                   "1", NULL},
                 2, "--num-steps");
  expect_refused((const gchar *[]){"--task", "reverse", "--reverse-size", "-1", NULL}, 2,
                 "--reverse-size");
}

/* Every numeric option out of range, not a number, or NaN/Inf. Each case is
 * refused before any data is read or model built. */
static void
test_option_ranges(void)
{
  const struct {
    const gchar *option, *value;
  } bad[] = {
      {"--epochs", "-1"},       {"--epochs", "99999999999"},
      {"--epochs", "3x"},       {"--threads", "0"},
      {"--threads", "-3"},      {"--threads", "10000"},
      {"--clip", "nan"},        {"--clip", "-1"},
      {"--clip", "inf"},        {"--lr", "0"},
      {"--lr", "-0.1"},         {"--lr", "nan"},
      {"--lr", "inf"},          {"--lr", "1e-3x"},
      {"--dropout", "1"},       {"--dropout", "-0.1"},
      {"--dropout", "nan"},     {"--batch-size", "0"},
      {"--num-steps", "1"},     {"--num-steps", "100000"},
      {"--hidden", "0"},        {"--layers", "0"},
      {"--heads", "0"},         {"--ffn", "0"},
      {"--num-examples", "0"},  {"--num-examples", "-5"},
      {"--reverse-vocab", "0"}, {"--reverse-vocab", "2"},
      {"--reverse-size", "0"},
  };
  for (guint i = 0; i < G_N_ELEMENTS(bad); i++)
    expect_refused(
        (const gchar *[]){"--task", "reverse", "--epochs", "1", bad[i].option, bad[i].value, NULL},
        2, bad[i].option);
  /* between options */
  expect_refused((const gchar *[]){"--heads", "3", NULL}, 2, "--heads 3 does not divide");
  expect_refused((const gchar *[]){"--task", "reverse", "--heatmap", "h.png", NULL}, 2,
                 "--heatmap");
}

/* A --save or --heatmap path that cannot be written is refused before
 * training (stdout shows no loss), so the trained model is not lost. */
static void
test_output_paths(void)
{
  g_autofree gchar *missing = g_build_filename(tmpdir, "no-such-dir", "m.safetensors", NULL);
  g_autofree gchar *png = g_build_filename(tmpdir, "no-such-dir", "h.png", NULL);
  expect_refused((const gchar *[]){TINY, "--epochs", "1", "--save", missing, NULL}, 1, missing);
  expect_refused((const gchar *[]){TINY, "--epochs", "1", "--save", tmpdir, NULL}, 1,
                 "is a directory");
  expect_refused(
      (const gchar *[]){TINY, "--epochs", "1", "--translate", "t3 t4", "--heatmap", png, NULL}, 1,
      png);
}

static gchar *
write_data(const gchar *name, const gchar *contents, gssize len)
{
  gchar *path = g_build_filename(tmpdir, name, NULL);
  g_autoptr(GError) error = NULL;
  g_assert_true(g_file_set_contents(path, contents, len, &error));
  g_assert_no_error(error);
  return path;
}

/* --data files that hold no sentence pairs trained on nothing and exited 0. */
static void
test_data_files(void)
{
  g_autofree gchar *empty = write_data("empty.txt", "", 0);
  g_autofree gchar *no_tabs = write_data("no-tabs.txt", "go .\nhi .\nrun !\n", -1);
  static const gchar nul[] = "go .\tva !\nhi .\0\tsalut !\n";
  g_autofree gchar *with_nul = write_data("nul.txt", nul, sizeof nul - 1);
  gsize big = 5 * 1024 * 1024;
  g_autofree gchar *line = g_malloc(big + 1);
  memset(line, 'a', big);
  line[big / 2] = '\t';
  line[big] = '\0';
  g_autofree gchar *one_line = write_data("one-line.txt", line, big);
  const struct {
    const gchar *path, *needle;
  } cases[] = {
      {empty, "no sentence pairs"},
      {no_tabs, "no sentence pairs"},
      {with_nul, "NUL byte"},
      {one_line, "longer than"},
  };
  for (guint i = 0; i < G_N_ELEMENTS(cases); i++)
    expect_refused((const gchar *[]){"--data", cases[i].path, "--epochs", "1", "-q", NULL}, 1,
                   cases[i].needle);
}

/* A checkpoint of the tiny model, one epoch. */
static gchar *
make_checkpoint(const gchar *name)
{
  gchar *path = g_build_filename(tmpdir, name, NULL);
  expect_success((const gchar *[]){TINY, "--epochs", "1", "--save", path, NULL});
  return path;
}

/* The safetensors header of path, parsed, and its data. */
static JsonObject *
read_header(const gchar *path, GBytes **data_out)
{
  gchar *contents = NULL;
  gsize len = 0;
  g_autoptr(GError) error = NULL;
  g_assert_true(g_file_get_contents(path, &contents, &len, &error));
  g_assert_no_error(error);
  guint64 n = 0;
  g_assert_cmpuint(len, >=, 8);
  for (int i = 7; i >= 0; i--)
    n = n << 8 | (guchar)contents[i];
  g_assert_cmpuint(n, <=, len - 8);
  g_autoptr(JsonParser) parser = json_parser_new();
  g_assert_true(json_parser_load_from_data(parser, contents + 8, (gssize)n, &error));
  g_assert_no_error(error);
  JsonObject *header = json_object_ref(json_node_get_object(json_parser_get_root(parser)));
  *data_out = g_bytes_new(contents + 8 + n, len - 8 - n);
  g_free(contents);
  return header;
}

static void
write_checkpoint(const gchar *path, JsonObject *header, GBytes *data)
{
  g_autoptr(JsonNode) root = json_node_new(JSON_NODE_OBJECT);
  json_node_set_object(root, header);
  g_autofree gchar *json = json_to_string(root, FALSE);
  GString *out = g_string_new(json);
  while (out->len % 8 != 0)
    g_string_append_c(out, ' ');
  guint64 n = out->len;
  gchar len[8];
  for (int i = 0; i < 8; i++)
    len[i] = (gchar)(n >> (8 * i));
  g_string_prepend_len(out, len, 8);
  gsize size = 0;
  const gchar *bytes = g_bytes_get_data(data, &size);
  g_string_append_len(out, bytes, (gssize)size);
  g_autoptr(GError) error = NULL;
  g_assert_true(g_file_set_contents(path, out->str, (gssize)out->len, &error));
  g_assert_no_error(error);
  g_string_free(out, TRUE);
}

/* Overwrite every float of tensor name in the checkpoint at path. */
static void
set_tensor(const gchar *path, const gchar *name, float value)
{
  g_autoptr(GBytes) data = NULL;
  g_autoptr(JsonObject) header = read_header(path, &data);
  JsonObject *entry = json_object_get_object_member(header, name);
  g_assert_nonnull(entry);
  JsonArray *offsets = json_object_get_array_member(entry, "data_offsets");
  gsize begin = (gsize)json_array_get_int_element(offsets, 0);
  gsize end = (gsize)json_array_get_int_element(offsets, 1);
  gsize size = 0;
  const guchar *original = g_bytes_get_data(data, &size);
  guchar *bytes = g_memdup2(original, size);
  g_assert_cmpuint(end, <=, size);
  for (gsize at = begin; at + sizeof value <= end; at += sizeof value)
    memcpy(bytes + at, &value, sizeof value);
  g_autoptr(GBytes) patched = g_bytes_new_take(bytes, size);
  write_checkpoint(path, header, patched);
}

static void
set_metadata(const gchar *path, const gchar *key, const gchar *value)
{
  g_autoptr(GBytes) data = NULL;
  g_autoptr(JsonObject) header = read_header(path, &data);
  JsonObject *meta = json_object_get_object_member(header, "__metadata__");
  g_assert_nonnull(meta);
  json_object_set_string_member(meta, key, value);
  write_checkpoint(path, header, data);
}

/* The heads do not show in the parameters' shapes: a 2-head checkpoint was
 * resumed as a 4-head model. The model config is now in the metadata. */
static void
test_checkpoint_config(void)
{
  g_autofree gchar *path = make_checkpoint("heads2.safetensors");
  expect_success((const gchar *[]){TINY, "--epochs", "2", "--resume", path, NULL});
  expect_refused((const gchar *[]){TINY, "--epochs", "2", "--resume", path, "--heads", "4", NULL},
                 1, "--heads 2");
  expect_refused(
      (const gchar *[]){TINY, "--epochs", "2", "--resume", path, "--num-steps", "7", NULL}, 1,
      "--num-steps 6");
  /* a checkpoint without the config (another program's, or edited) */
  set_metadata(path, "seq2seq.heads", "two");
  expect_refused((const gchar *[]){TINY, "--epochs", "2", "--resume", path, NULL}, 1,
                 "seq2seq.heads");
}

/* --model luong: its options are refused with other models, checked before
 * any work, and a checkpoint resumes only with the attention it was trained
 * with (dot and local-m dot have the same parameters). */
static void
test_luong_options(void)
{
  expect_refused((const gchar *[]){TINY, "--score", "dot", NULL}, 2,
                 "--score applies to --model luong only");
  expect_refused((const gchar *[]){TINY, "--model", "bahdanau", "--input-feeding", NULL}, 2,
                 "--input-feeding applies to --model luong only");
  expect_refused((const gchar *[]){TINY, "--model", "luong", "--score", "additive", NULL}, 2,
                 "unknown --score 'additive'");
  expect_refused(
      (const gchar *[]){TINY, "--model", "luong", "--local-m", "2", "--local-p", "2", NULL}, 2,
      "--local-m and --local-p exclude each other");
  expect_refused((const gchar *[]){TINY, "--model", "luong", "--local-p", "0", NULL}, 2,
                 "--local-p must be an integer from 1");
  expect_refused((const gchar *[]){TINY, "--model", "luong", "--local-m", "2x", NULL}, 2,
                 "--local-m must be an integer from 1");
  g_autofree gchar *path = g_build_filename(tmpdir, "luong.safetensors", NULL);
  expect_success((const gchar *[]){TINY, "--model", "luong", "--score", "dot", "--epochs", "1",
                                   "--save", path, NULL});
  expect_success((const gchar *[]){TINY, "--model", "luong", "--score", "dot", "--epochs", "2",
                                   "--resume", path, NULL});
  expect_refused((const gchar *[]){TINY, "--model", "luong", "--score", "dot", "--local-m", "1",
                                   "--epochs", "2", "--resume", path, NULL},
                 1, "trained with Luong attention 'dot, global', not 'dot, local-m 1'");
}

/* NaN or Inf in the weights or optimizer state trained to "loss nan" with
 * exit status 0. */
static void
test_checkpoint_nonfinite(void)
{
  g_autofree gchar *path = make_checkpoint("nan.safetensors");
  set_tensor(path, "encoder.embedding.weight", NAN);
  expect_refused((const gchar *[]){TINY, "--epochs", "2", "--resume", path, NULL}, 1,
                 "encoder.embedding.weight holds NaN or Inf");
  g_autofree gchar *inf = make_checkpoint("inf.safetensors");
  set_tensor(inf, "decoder.dense.weight", INFINITY);
  expect_refused((const gchar *[]){TINY, "--epochs", "2", "--resume", inf, NULL}, 1,
                 "decoder.dense.weight holds NaN or Inf");
}

/* epochs_done and global_step were read with atoi and strtoll. */
static void
test_checkpoint_metadata(void)
{
  const struct {
    const gchar *key, *value;
  } bad[] = {
      {"seq2seq.epochs_done", "-5"},
      {"seq2seq.epochs_done", "1x"},
      {"seq2seq.global_step", "abc"},
      {"seq2seq.global_step", "-1"},
  };
  for (guint i = 0; i < G_N_ELEMENTS(bad); i++) {
    g_autofree gchar *path = make_checkpoint("meta.safetensors");
    set_metadata(path, bad[i].key, bad[i].value);
    expect_refused((const gchar *[]){TINY, "--epochs", "2", "--resume", path, NULL}, 1, bad[i].key);
  }
}

/* Weights that are finite but so large that the forward pass overflows:
 * the loss becomes non-finite and training must stop, not go on to save. */
static void
test_nonfinite_loss(void)
{
  g_autofree gchar *path = make_checkpoint("huge.safetensors");
  g_autofree gchar *out = g_build_filename(tmpdir, "after.safetensors", NULL);
  set_tensor(path, "decoder.dense.weight", 3e38f);
  Run r = run_cli((const gchar *[]){TINY, "--epochs", "2", "--resume", path, "--save", out, NULL});
  if (r.exit_status != 1 || strstr(r.err, "the loss became") == NULL)
    g_error("huge weights: exit status %d, stderr '%s', stdout '%s'", r.exit_status, r.err, r.out);
  g_assert_false(g_file_test(out, G_FILE_TEST_EXISTS));
  run_clear(&r);
}

/* --beam and --length-penalty: ranges checked; both models translate with a
 * beam (the reverse task's held-out accuracy goes through it). */
static void
test_beam_options(void)
{
  const gchar *bad[][2] = {
      {"--beam", "0"}, {"--beam", "65"}, {"--length-penalty", "-1"}, {"--length-penalty", "nan"}};
  for (guint i = 0; i < G_N_ELEMENTS(bad); i++)
    expect_refused(
        (const gchar *[]){"--task", "reverse", "--epochs", "1", bad[i][0], bad[i][1], NULL}, 2,
        bad[i][0]);
  for (gint m = 0; m < 3; m++) {
    const gchar *model = m == 0 ? "transformer" : m == 1 ? "bahdanau" : "luong";
    g_autofree gchar *what = g_strdup_printf("--model %s --beam 3", model);
    Run r = run_cli((const gchar *[]){TINY, "--epochs", "1", "--model", model, "--beam", "3",
                                      "--length-penalty", "1", NULL});
    if (r.exit_status != 0 || strstr(r.out, "beam 3 token accuracy") == NULL)
      g_error("qkv-seq2seq %s: exit status %d, stdout '%s', stderr '%s'", what, r.exit_status,
              r.out, r.err);
    run_clear(&r);
  }
}

/* The training recipe's options (--label-smoothing, --warmup, --clip-rule)
 * and the held-out BLEU: bad values are refused; on fra-eng the run says
 * which rule and smoothing it trains with and scores the pairs after the
 * training ones; label smoothing changes the first step's loss. */
static gchar *
first_step_loss(const gchar *label_smoothing)
{
  g_autofree gchar *log = g_build_filename(tmpdir, "steps.txt", NULL);
  Run r =
      run_cli((const gchar *[]){TINY_FRA, "--epochs", "1", "--heldout", "0", "--label-smoothing",
                                label_smoothing, "--step-losses", log, "-q", NULL});
  g_assert_cmpint(r.exit_status, ==, 0);
  run_clear(&r);
  gchar *text = NULL;
  g_assert_true(g_file_get_contents(log, &text, NULL, NULL));
  g_assert_nonnull(strchr(text, '\n'));
  *strchr(text, '\n') = '\0';
  return text;
}

static void
test_recipe_options(void)
{
  const gchar *bad[][2] = {{"--label-smoothing", "1.5"},
                           {"--label-smoothing", "nan"},
                           {"--warmup", "-1"},
                           {"--heldout", "-1"},
                           {"--clip-rule", "pytorch"}};
  for (guint i = 0; i < G_N_ELEMENTS(bad); i++)
    expect_refused(
        (const gchar *[]){"--task", "reverse", "--epochs", "1", bad[i][0], bad[i][1], NULL}, 2,
        bad[i][0]);
  Run r =
      run_cli((const gchar *[]){TINY_FRA, "--epochs", "2", "--heldout", "20", "--label-smoothing",
                                "0.1", "--warmup", "3", "--clip-rule", "d2l", NULL});
  if (r.exit_status != 0 || strstr(r.out, "held-out BLEU-4 on 20 unseen pairs") == NULL ||
      strstr(r.out, "the book's rule") == NULL || strstr(r.out, "label smoothing 0.1") == NULL ||
      strstr(r.out, "warm-up over 3 steps") == NULL)
    g_error("recipe options: exit status %d, stdout '%s', stderr '%s'", r.exit_status, r.out,
            r.err);
  run_clear(&r);
  /* a data file with nothing after the training lines: the run says so and
   * succeeds */
  g_autofree gchar *small = g_build_filename(tmpdir, "small.txt", NULL);
  g_assert_true(g_file_set_contents(small, "Go.\tVa !\nHi.\tSalut !\nRun!\tCours !\n", -1, NULL));
  Run s = run_cli((const gchar *[]){"--data", small, "--num-examples", "5", "--num-steps", "6",
                                    "--hidden", "8", "--ffn", "8", "--heads", "2", "--layers", "1",
                                    "--epochs", "1", "-q", NULL});
  if (s.exit_status != 0 || strstr(s.out, "held-out BLEU: no sentence pairs after") == NULL)
    g_error("short data file: exit status %d, stdout '%s', stderr '%s'", s.exit_status, s.out,
            s.err);
  run_clear(&s);
  g_autofree gchar *plain = first_step_loss("0");
  g_autofree gchar *smoothed = first_step_loss("0.1");
  g_assert_cmpstr(plain, !=, smoothed);
}

/* --tie-embeddings: the Transformer only; the reverse task's one vocabulary
 * ties all three matrices (two fewer: 2 · vocab 10 · hidden 8 parameters),
 * and a tied checkpoint does not load into an untied model. */
static void
test_tie_embeddings(void)
{
  expect_refused((const gchar *[]){"--model", "bahdanau", "--tie-embeddings", NULL}, 2,
                 "--tie-embeddings");
  g_autofree gchar *path = g_build_filename(tmpdir, "tied.safetensors", NULL);
  Run r = run_cli((const gchar *[]){"--task",
                                    "reverse",
                                    "--reverse-size",
                                    "20",
                                    "--reverse-vocab",
                                    "10",
                                    "--num-steps",
                                    "6",
                                    "--hidden",
                                    "8",
                                    "--ffn",
                                    "8",
                                    "--heads",
                                    "2",
                                    "--layers",
                                    "1",
                                    "--batch-size",
                                    "4",
                                    "--epochs",
                                    "1",
                                    "--tie-embeddings",
                                    "--save",
                                    path,
                                    NULL});
  const gchar *line = strstr(r.out, "tied embeddings: one matrix");
  if (r.exit_status != 0 || line == NULL)
    g_error("--tie-embeddings: exit status %d, stdout '%s', stderr '%s'", r.exit_status, r.out,
            r.err);
  const gchar *counts = strstr(line, "; ");
  g_assert_nonnull(counts);
  gint64 tied = 0, untied = 0;
  g_assert_cmpint(
      sscanf(counts, "; %" G_GINT64_FORMAT " parameters, %" G_GINT64_FORMAT, &tied, &untied), ==,
      2);
  g_assert_cmpint(untied - tied, ==, 2 * 10 * 8);
  run_clear(&r);
  expect_refused((const gchar *[]){TINY, "--epochs", "2", "--resume", path, NULL}, 1,
                 "decoder.dense.weight");
  expect_success(
      (const gchar *[]){TINY, "--epochs", "2", "--tie-embeddings", "--resume", path, NULL});
  g_remove(path);
}

/* Item 2 of "Training you can watch": the JSONL log's records, parsed
 * back; counts of each event and of the fields each holds. */
typedef struct {
  gint starts, steps, epochs, validated;
  double best_loss;
  gint best_epoch, last_epoch;
} LogSummary;

static LogSummary
read_log(const gchar *path)
{
  gchar *text = NULL;
  g_assert_true(g_file_get_contents(path, &text, NULL, NULL));
  g_auto(GStrv) lines = g_strsplit(text, "\n", -1);
  g_free(text);
  LogSummary sum = {.best_loss = INFINITY};
  for (guint i = 0; lines[i] != NULL && lines[i][0] != '\0'; i++) {
    g_autoptr(JsonParser) parser = json_parser_new();
    g_autoptr(GError) error = NULL;
    if (!json_parser_load_from_data(parser, lines[i], -1, &error))
      g_error("%s line %u is not JSON (%s): %s", path, i + 1, error->message, lines[i]);
    JsonObject *o = json_node_get_object(json_parser_get_root(parser));
    const gchar *event = json_object_get_string_member(o, "event");
    if (g_str_equal(event, "start")) {
      sum.starts++;
      g_assert_cmpstr(json_object_get_string_member(o, "program"), ==, "qkv-seq2seq");
      continue;
    }
    const gchar *want_step[] = {"epoch",     "step",         "lr",       "loss",
                                "grad_norm", "tokens_per_s", "elapsed_s"};
    const gchar *want_epoch[] = {"epoch", "step", "lr", "loss", "tokens_per_s", "elapsed_s"};
    gboolean step = g_str_equal(event, "step");
    g_assert_true(step || g_str_equal(event, "epoch"));
    for (guint k = 0; k < (step ? G_N_ELEMENTS(want_step) : G_N_ELEMENTS(want_epoch)); k++)
      if (!json_object_has_member(o, step ? want_step[k] : want_epoch[k]))
        g_error("%s line %u lacks %s: %s", path, i + 1, step ? want_step[k] : want_epoch[k],
                lines[i]);
    if (step) {
      sum.steps++;
      continue;
    }
    sum.epochs++;
    sum.last_epoch = (gint)json_object_get_int_member(o, "epoch");
    if (json_object_has_member(o, "valid_loss")) {
      sum.validated++;
      g_assert_true(json_object_has_member(o, "valid_bleu"));
      double loss = json_object_get_double_member(o, "valid_loss");
      if (loss < sum.best_loss) {
        sum.best_loss = loss;
        sum.best_epoch = sum.last_epoch;
      }
    }
  }
  return sum;
}

static gboolean
is_png(const gchar *path)
{
  gchar *bytes = NULL;
  gsize len = 0;
  gboolean ok = g_file_get_contents(path, &bytes, &len, NULL) && len > 8 &&
                memcmp(bytes, "\x89PNG\r\n\x1a\n", 8) == 0;
  g_free(bytes);
  return ok;
}

/* A file of Tatoeba's newer format, three columns (the attribution last),
 * with a line that is not a pair and a blank line among the first 41 (the
 * pairs are the corpus's first ones, over and over). */
static gchar *
write_three_columns(void)
{
  static const gchar *pairs[][2] = {
      {"Go.", "Va !"},
      {"Hi.", "Salut !"},
      {"Run!", "Cours !"},
      {"Run!", "Courez !"},
      {"Wow!", "Ça alors !"},
      {"Fire!", "Au feu !"},
      {"Help!", "À l'aide !"},
      {"Stop!", "Ça suffit !"},
      {"Stop!", "Stop !"},
      {"Stop!", "Arrête-toi !"},
      {"Wait!", "Attends !"},
      {"Wait!", "Attendez !"},
      {"I see.", "Je comprends."},
      {"I try.", "J'essaye."},
      {"I won!", "J'ai gagné !"},
  };
  GString *text = g_string_new(NULL);
  for (gint i = 0; i < 60; i++) {
    if (i == 4)
      g_string_append(text, "no tab on this line\n");
    else if (i == 8)
      g_string_append(text, "\n");
    else
      g_string_append_printf(text, "%s\t%s\tCC-BY 2.0 (France) Attribution: tatoeba.org #%d\n",
                             pairs[i % G_N_ELEMENTS(pairs)][0], pairs[i % G_N_ELEMENTS(pairs)][1],
                             1000 + i);
  }
  gchar *path = write_data("three-columns.txt", text->str, (gssize)text->len);
  g_string_free(text, TRUE);
  return path;
}

/* --log, --plot, --valid, --save-best: the log holds a step record per
 * step and an epoch record per epoch with the validation figures, the
 * progress lines show them, the plot is a PNG and the best model is kept;
 * a three-column file loads and the skipped lines are counted. */
static void
test_watch_training(void)
{
  g_autofree gchar *data = write_three_columns();
  g_autofree gchar *log = g_build_filename(tmpdir, "run.jsonl", NULL);
  g_autofree gchar *png = g_build_filename(tmpdir, "run.png", NULL);
  g_autofree gchar *best = g_build_filename(tmpdir, "best.safetensors", NULL);
  Run r =
      run_cli((const gchar *[]){TINY_FRA, "--data", data, "--epochs", "3", "--valid", "10", "--log",
                                log, "--plot", png, "--save-best", best, "--heldout", "5", NULL});
  if (r.exit_status != 0 || strstr(r.out, ", valid loss ") == NULL ||
      strstr(r.out, "on three-columns.txt: 39 pairs") == NULL ||
      strstr(r.out, "data: skipped 2 of 41 lines: 1 without a tab (not a pair), 1 blank; 39 "
                    "lines with more than two columns") == NULL ||
      strstr(r.out, "validation: 10 pairs after the 41 training lines") == NULL)
    g_error("watched run: exit status %d, stdout '%s', stderr '%s'", r.exit_status, r.out, r.err);
  run_clear(&r);
  LogSummary sum = read_log(log);
  g_assert_cmpint(sum.starts, ==, 1);
  g_assert_cmpint(sum.epochs, ==, 3);
  g_assert_cmpint(sum.validated, ==, 3);
  g_assert_cmpint(sum.steps, ==, 3 * 5); /* 39 pairs in batches of 8 */
  g_assert_true(is_png(png));
  g_assert_true(g_file_test(best, G_FILE_TEST_EXISTS));
  /* the best checkpoint resumes */
  expect_success((const gchar *[]){TINY_FRA, "--data", data, "--epochs", "4", "--resume", best,
                                   "--heldout", "0", "-q", NULL});
}

/* --early-stop P: training ends P validations after the one with the lowest
 * loss (41 pairs of the shipped corpus overfit within a few epochs). */
static void
test_early_stop(void)
{
  g_autofree gchar *log = g_build_filename(tmpdir, "early.jsonl", NULL);
  Run r = run_cli((const gchar *[]){TINY_FRA, "--epochs", "60", "--valid", "10", "--early-stop",
                                    "2", "--log", log, "--heldout", "0", NULL});
  if (r.exit_status != 0 || strstr(r.out, "early stop after epoch") == NULL)
    g_error("--early-stop: exit status %d, stdout '%s', stderr '%s'", r.exit_status, r.out, r.err);
  run_clear(&r);
  LogSummary sum = read_log(log);
  g_assert_cmpint(sum.last_epoch, <, 60);
  g_assert_cmpint(sum.last_epoch, ==, sum.best_epoch + 2);
  /* --task reverse validates on sequences of its own */
  expect_success((const gchar *[]){TINY, "--epochs", "2", "--valid", "8", "--valid-every", "2",
                                   "--early-stop", "3", NULL});
}

/* The new options are refused where they make no sense. */
static void
test_watch_options(void)
{
  const struct {
    const gchar *args[6], *needle;
  } bad[] = {
      {{"--save-best", "b.safetensors"}, "--save-best"},
      {{"--early-stop", "2"}, "--early-stop"},
      {{"--valid", "5", "--early-stop", "2", "--distributed"}, "--early-stop"},
      {{"--valid", "0"}, "--valid"},
      {{"--min-freq", "0"}, "--min-freq"},
      {{"--max-len", "x"}, "--max-len"},
      {{"--translate", "-", "--translate", "go ."}, "--translate -"},
      {{"--heatmap-sentence", "2"}, "--heatmap-sentence"},
      {{"--heatmap", "h.png", "--heatmap-sentence", "0"}, "--heatmap-sentence"},
      {{"--heatmap", "h.png", "--heatmap-block", "3"}, "--heatmap-block 3"},
      {{"--test-data", "t.txt", "--heldout", "0"}, "--test-data"},
  };
  for (guint i = 0; i < G_N_ELEMENTS(bad); i++) {
    const gchar *args[10] = {"--epochs", "1"};
    guint n = 2;
    for (guint k = 0; k < G_N_ELEMENTS(bad[i].args) && bad[i].args[k] != NULL; k++)
      args[n++] = bad[i].args[k];
    args[n] = NULL;
    expect_refused(args, 2, bad[i].needle);
  }
  /* a heat map of a sentence that is not translated, refused before training */
  g_autofree gchar *png = g_build_filename(tmpdir, "rows.png", NULL);
  expect_refused((const gchar *[]){TINY_FRA, "--epochs", "1", "--heldout", "0", "-q", "--heatmap",
                                   png, "--heatmap-sentence", "2,5", NULL},
                 2, "--heatmap-sentence 5: 4 sentences are translated");
  expect_success((const gchar *[]){TINY_FRA, "--epochs", "1", "--heldout", "0", "-q", "--heatmap",
                                   png, "--heatmap-sentence", "2,4", "--heatmap-block", "1", NULL});
  g_assert_true(is_png(png));
}

/* --version in a line of its own, nothing trained; --help-all by group. */
static void
test_version(void)
{
  Run r = run_cli((const gchar *[]){"--version", NULL});
  g_assert_cmpint(r.exit_status, ==, 0);
  g_assert_true(g_str_has_prefix(r.out, "qkv-seq2seq "));
  g_assert_nonnull(strchr(r.out, '\n'));
  g_assert_null(strchr(strchr(r.out, '\n') + 1, '\n'));
  run_clear(&r);
  /* the option groups, each with --help-NAME */
  Run h = run_cli((const gchar *[]){"--help-all", NULL});
  const gchar *groups[] = {"Model options:",    "Training options:",   "Data options:",
                           "Decoding options:", "Checkpoint options:", "Distribution options:",
                           "--help-training",   "--valid-data",        "--version"};
  g_assert_cmpint(h.exit_status, ==, 0);
  for (guint i = 0; i < G_N_ELEMENTS(groups); i++)
    if (strstr(h.out, groups[i]) == NULL)
      g_error("--help-all lacks '%s': %s", groups[i], h.out);
  run_clear(&h);
}

/* --translate - is a filter: a line of stdout per line of stdin (a blank
 * line for a blank one), nothing else on stdout; resuming without
 * --epochs trains nothing. */
static void
test_translate_stdin(void)
{
  g_autofree gchar *model = g_build_filename(tmpdir, "filter.safetensors", NULL);
  expect_success(
      (const gchar *[]){TINY_FRA, "--epochs", "2", "--heldout", "0", "-q", "--save", model, NULL});
  const gchar *binary = g_getenv("QKV_SEQ2SEQ");
  const gchar *argv[] = {binary, "--num-examples", "40",  "--num-steps", "6", "--hidden",
                         "8",    "--ffn",          "8",   "--heads",     "2", "--layers",
                         "1",    "--resume",       model, "--translate", "-", NULL};
  g_autoptr(GError) error = NULL;
  g_autoptr(GSubprocess) p =
      g_subprocess_newv(argv,
                        G_SUBPROCESS_FLAGS_STDIN_PIPE | G_SUBPROCESS_FLAGS_STDOUT_PIPE |
                            G_SUBPROCESS_FLAGS_STDERR_PIPE,
                        &error);
  g_assert_no_error(error);
  g_autofree gchar *out = NULL, *err = NULL;
  g_assert_true(
      g_subprocess_communicate_utf8(p, "Go.\nI'm home.\n\nHe's calm.\n", NULL, &out, &err, &error));
  g_assert_no_error(error);
  if (g_subprocess_get_exit_status(p) != 0 || strstr(err, "loss ") != NULL)
    g_error("--translate -: exit status %d, stdout '%s', stderr '%s'",
            g_subprocess_get_exit_status(p), out, err);
  g_auto(GStrv) lines = g_strsplit(out, "\n", -1);
  g_assert_cmpuint(g_strv_length(lines), ==, 5); /* four lines and the end */
  g_assert_cmpstr(lines[2], ==, "");
  g_assert_cmpstr(lines[4], ==, "");
  g_assert_cmpstr(lines[0], !=, "");
  g_assert_null(strstr(out, "=>"));
  g_assert_nonnull(strstr(err, "transformer on fra-eng")); /* the setup went to stderr */
}

/* The line of stdout that starts with prefix, or NULL; free with g_free(). */
static gchar *
line_starting(const gchar *out, const gchar *prefix)
{
  g_auto(GStrv) lines = g_strsplit(out, "\n", -1);
  for (guint i = 0; lines[i] != NULL; i++)
    if (g_str_has_prefix(lines[i], prefix))
      return g_strdup(lines[i]);
  return NULL;
}

/* --vocab sentencepiece: a few epochs on subword pieces, translations and
 * held-out BLEU from them; the checkpoint holds the SentencePiece model, so
 * that a resumed run (with nothing left to train) translates the same; the
 * model file beside the checkpoint loads with --spm-model; the options
 * refuse what does not fit, and a build without SentencePiece says so. */
static void
test_subwords(void)
{
  if (g_strcmp0(g_getenv("QKV_HAVE_SPM"), "1") != 0) {
    expect_refused((const gchar *[]){TINY_FRA, "--vocab", "sentencepiece", NULL}, 2,
                   "built without SentencePiece");
    return;
  }
  expect_refused((const gchar *[]){TINY_FRA, "--vocab", "bytes", NULL}, 2, "unknown --vocab");
  expect_refused((const gchar *[]){TINY_FRA, "--spm-vocab-size", "100", NULL}, 2,
                 "--spm-vocab-size applies to --vocab sentencepiece only");
  expect_refused(
      (const gchar *[]){TINY_FRA, "--vocab", "sentencepiece", "--spm-type", "char", NULL}, 2,
      "unknown --spm-type");
  expect_refused((const gchar *[]){TINY, "--vocab", "sentencepiece", NULL}, 2, "--task reverse");
  expect_refused((const gchar *[]){TINY_FRA, "--vocab", "sentencepiece", "--spm-model", "x.model",
                                   "--spm-vocab-size", "50", NULL},
                 2, "--spm-model loads");
  g_autofree gchar *ckpt = g_build_filename(tmpdir, "spm.safetensors", NULL);
  g_autofree gchar *side = g_strconcat(ckpt, ".spm.model", NULL);
  /* the pieces of 60 pairs in 12 steps (longer than the words); 30 epochs
   * (a second) make translations of a few pieces */
#define SUBWORD_RUN                                                                                \
  "--num-examples", "60", "--num-steps", "12", "--hidden", "16", "--ffn", "16", "--heads", "2",    \
      "--layers", "1", "--batch-size", "16", "--vocab", "sentencepiece", "--heldout", "30",        \
      "--epochs", "30"
  g_autofree gchar *png = g_build_filename(tmpdir, "spm-heatmap.png", NULL);
  Run r = run_cli((const gchar *[]){SUBWORD_RUN, "--spm-vocab-size", "100", "--save", ckpt,
                                    "--heatmap", png, "--heatmap-sentence", "2,4", NULL});
  if (r.exit_status != 0)
    g_error("training on subwords: exit %d\n%s\n%s", r.exit_status, r.out, r.err);
  g_autofree gchar *setup = line_starting(r.out, "subwords: one SentencePiece model of ");
  g_assert_nonnull(setup);
  g_assert_nonnull(strstr(setup, side));
  g_assert_true(g_file_test(side, G_FILE_TEST_IS_REGULAR));
  g_autofree gchar *trained = line_starting(r.out, "loss ");
  g_assert_nonnull(trained);
  g_assert_true(is_png(png)); /* labelled with the pieces */
  /* the four sentences and the held-out BLEU, decoded to text: no
   * word-start marks left */
  const gchar *scored[] = {"go . => ", "i'm home . => ", "held-out BLEU-4 on 30 unseen pairs"};
  gchar *first[G_N_ELEMENTS(scored)];
  for (guint k = 0; k < G_N_ELEMENTS(scored); k++) {
    first[k] = line_starting(r.out, scored[k]);
    g_assert_nonnull(first[k]);
  }
  g_assert_null(strstr(r.out, "\xe2\x96\x81"));
  run_clear(&r);
  /* resumed (nothing left to train) with the model the checkpoint holds,
   * and with the model file beside it: the same translations and BLEU */
  const gchar *resumed[][3] = {{"--seed", "0", NULL}, {"--spm-model", side, NULL}};
  for (guint i = 0; i < G_N_ELEMENTS(resumed); i++) {
    Run again = run_cli(
        (const gchar *[]){SUBWORD_RUN, "--resume", ckpt, resumed[i][0], resumed[i][1], NULL});
    if (again.exit_status != 0)
      g_error("resuming a subword checkpoint (%s): exit %d\n%s\n%s", resumed[i][0],
              again.exit_status, again.out, again.err);
    g_assert_null(line_starting(again.out, "loss "));
    for (guint k = 0; k < G_N_ELEMENTS(scored); k++) {
      g_autofree gchar *line = line_starting(again.out, scored[k]);
      g_assert_cmpstr(line, ==, first[k]);
    }
    run_clear(&again);
  }
  for (guint k = 0; k < G_N_ELEMENTS(scored); k++)
    g_free(first[k]);
  /* a subword checkpoint resumed on words and the other way round */
  expect_refused((const gchar *[]){"--num-examples", "60", "--num-steps", "12", "--hidden", "16",
                                   "--ffn", "16", "--heads", "2", "--layers", "1", "--epochs", "3",
                                   "--resume", ckpt, NULL},
                 1, "was trained with --vocab sentencepiece");
  g_autofree gchar *words = g_build_filename(tmpdir, "words.safetensors", NULL);
  expect_success((const gchar *[]){TINY_FRA, "--epochs", "1", "--save", words, "-q", NULL});
  expect_refused((const gchar *[]){TINY_FRA, "--epochs", "1", "--vocab", "sentencepiece",
                                   "--resume", words, NULL},
                 1, "holds no SentencePiece model");
  g_unlink(side);
#undef SUBWORD_RUN
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  g_autoptr(GError) error = NULL;
  tmpdir = g_dir_make_tmp("qkv-seq2seq-cli-XXXXXX", &error);
  g_assert_no_error(error);
  g_test_add_func("/seq2seq-cli/crashing-options", test_crashing_options);
  g_test_add_func("/seq2seq-cli/option-ranges", test_option_ranges);
  g_test_add_func("/seq2seq-cli/output-paths", test_output_paths);
  g_test_add_func("/seq2seq-cli/data-files", test_data_files);
  g_test_add_func("/seq2seq-cli/checkpoint-config", test_checkpoint_config);
  g_test_add_func("/seq2seq-cli/checkpoint-nonfinite", test_checkpoint_nonfinite);
  g_test_add_func("/seq2seq-cli/luong-options", test_luong_options);
  g_test_add_func("/seq2seq-cli/checkpoint-metadata", test_checkpoint_metadata);
  g_test_add_func("/seq2seq-cli/nonfinite-loss", test_nonfinite_loss);
  g_test_add_func("/seq2seq-cli/beam-options", test_beam_options);
  g_test_add_func("/seq2seq-cli/tie-embeddings", test_tie_embeddings);
  g_test_add_func("/seq2seq-cli/recipe-options", test_recipe_options);
  g_test_add_func("/seq2seq-cli/watch-training", test_watch_training);
  g_test_add_func("/seq2seq-cli/early-stop", test_early_stop);
  g_test_add_func("/seq2seq-cli/watch-options", test_watch_options);
  g_test_add_func("/seq2seq-cli/version", test_version);
  g_test_add_func("/seq2seq-cli/translate-stdin", test_translate_stdin);
  g_test_add_func("/seq2seq-cli/subwords", test_subwords);
  int status = g_test_run();
  /* the files written above, then the directory */
  GDir *dir = g_dir_open(tmpdir, 0, NULL);
  const gchar *name;
  while (dir != NULL && (name = g_dir_read_name(dir)) != NULL) {
    g_autofree gchar *path = g_build_filename(tmpdir, name, NULL);
    g_unlink(path);
  }
  if (dir != NULL)
    g_dir_close(dir);
  g_rmdir(tmpdir);
  g_free(tmpdir);
  return status;
}
