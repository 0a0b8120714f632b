/* test-options-checker.c: the examples' shared option checker
 * (examples/common/options.h) on its own: ranges with open and closed
 * bounds, texts parsed in full, and its messages. */
#include <glib.h>
#include <math.h>

#include "../examples/common/options.h"

/* The message of checking one range, or NULL when it passes. */
static gchar *
message_of(const OptionRange *r)
{
  GError *error = NULL;
  if (options_check_ranges(r, 1, &error)) {
    g_assert_no_error(error);
    return NULL;
  }
  g_assert_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE);
  gchar *m = g_strdup(error->message);
  g_error_free(error);
  return m;
}

static void
test_values(void)
{
  gint i = 2000000000;
  gint64 big = G_MAXINT64;
  double d = NAN;
  const OptionRange max_len = OPTION_INT("max-len", &i, 1, 4096);
  g_autofree gchar *m1 = message_of(&max_len);
  g_assert_cmpstr(m1, ==, "--max-len 2000000000 is out of range [1, 4096]");
  i = 4096;
  g_assert_null(message_of(&max_len));
  i = 0;
  g_autofree gchar *m2 = message_of(&max_len);
  g_assert_cmpstr(m2, ==, "--max-len 0 is out of range [1, 4096]");

  const OptionRange seed = OPTION_INT64("seed", &big, G_MININT64, G_MAXINT64);
  g_assert_null(message_of(&seed));

  const OptionRange lr = OPTION_DOUBLE_OPEN("lr", &d, 0, 10, TRUE, FALSE);
  g_autofree gchar *m3 = message_of(&lr);
  g_assert_cmpstr(m3, ==, "--lr nan is out of range (0, 10]");
  const double refused[] = {0, -1e-300, 10.000001, INFINITY, -INFINITY};
  for (guint k = 0; k < G_N_ELEMENTS(refused); k++) {
    d = refused[k];
    g_autofree gchar *m = message_of(&lr);
    g_assert_nonnull(m);
  }
  d = 10;
  g_assert_null(message_of(&lr));
  d = 1e-300;
  g_assert_null(message_of(&lr));
}

static void
test_texts(void)
{
  gint i = 5;
  gchar *text = NULL;
  OptionRange r = {"epochs", OPTION_RANGE_INT, &i, 0, 100, 0, 0, FALSE, FALSE, &text, "(why)"};
  /* not given: the default stands, even outside the range */
  i = -7;
  g_assert_null(message_of(&r));
  g_assert_cmpint(i, ==, -7);
  text = "42";
  g_assert_null(message_of(&r));
  g_assert_cmpint(i, ==, 42);
  const gchar *bad[] = {"3x", "", " 3", "1e3", "99999999999", "-"};
  for (guint k = 0; k < G_N_ELEMENTS(bad); k++) {
    text = (gchar *)bad[k];
    g_autofree gchar *m = message_of(&r);
    g_autofree gchar *want =
        g_strdup_printf("--epochs %s is not an integer in [0, 100] (why)", bad[k]);
    g_assert_cmpstr(m, ==, want);
  }
  text = "101";
  g_autofree gchar *m = message_of(&r);
  g_assert_cmpstr(m, ==, "--epochs 101 is out of range [0, 100] (why)");
}

/* A text that is not UTF-8 is quoted in UTF-8 (U+FFFD for a bad byte): the
 * message once held the raw bytes (found by tests/fuzz/fuzz-example-data.c;
 * GOption itself refuses such a command line, but the checker is also
 * called on texts from elsewhere). */
static void
test_text_not_utf8(void)
{
  double d = 0.5;
  gchar *text = "0.5\xff";
  OptionRange r = {"dropout", OPTION_RANGE_DOUBLE, &d, 0, 0, 0, 1, FALSE, TRUE, &text, NULL};
  g_autofree gchar *m = message_of(&r);
  g_assert_true(g_utf8_validate(m, -1, NULL));
  g_assert_cmpstr(m, ==, "--dropout 0.5\xef\xbf\xbd is not a number in [0, 1)");
  g_assert_cmpfloat(d, ==, 0.5);
}

int
main(int argc, char **argv)
{
  g_test_init(&argc, &argv, NULL);
  g_test_add_func("/options-checker/values", test_values);
  g_test_add_func("/options-checker/texts", test_texts);
  g_test_add_func("/options-checker/text-not-utf8", test_text_not_utf8);
  return g_test_run();
}
