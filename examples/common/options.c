/* options.c: the examples' option ranges (options.h). */
#include "options.h"

#include <math.h>

/* "[lo, hi]" or with open bounds "(lo, hi)". */
static gchar *
range_text(const OptionRange *r)
{
  if (r->kind != OPTION_RANGE_DOUBLE)
    return g_strdup_printf("[%" G_GINT64_FORMAT ", %" G_GINT64_FORMAT "]", r->imin, r->imax);
  return g_strdup_printf("%c%g, %g%c", r->min_open ? '(' : '[', r->dmin, r->dmax,
                         r->max_open ? ')' : ']');
}

static gboolean
refuse(const OptionRange *r, const gchar *given, const gchar *what, GError **error)
{
  g_autofree gchar *range = range_text(r);
  /* a GError message is UTF-8; the text given need not be */
  g_autofree gchar *shown = g_utf8_make_valid(given, -1);
  g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE, "--%s %s %s %s%s%s", r->name, shown,
              what, range, r->why != NULL ? " " : "", r->why != NULL ? r->why : "");
  return FALSE;
}

/* The text of an option read as a string: parsed in full into the value. */
static gboolean
parse_text(const OptionRange *r, const gchar *text, GError **error)
{
  if (r->kind == OPTION_RANGE_DOUBLE) {
    gchar *end = NULL;
    double x = g_ascii_strtod(text, &end);
    if (end == text || *end != '\0')
      return refuse(r, text, "is not a number in", error);
    *(double *)r->value = x;
    return TRUE;
  }
  gint64 n;
  gint64 lo = r->kind == OPTION_RANGE_INT ? G_MININT : G_MININT64;
  gint64 hi = r->kind == OPTION_RANGE_INT ? G_MAXINT : G_MAXINT64;
  if (!g_ascii_string_to_signed(text, 10, lo, hi, &n, NULL))
    return refuse(r, text, "is not an integer in", error);
  if (r->kind == OPTION_RANGE_INT)
    *(gint *)r->value = (gint)n;
  else
    *(gint64 *)r->value = n;
  return TRUE;
}

static gboolean
check_one(const OptionRange *r, GError **error)
{
  const gchar *text = r->text != NULL ? *r->text : NULL;
  if (r->text != NULL && text == NULL)
    return TRUE; /* not given: the default stands */
  if (text != NULL && !parse_text(r, text, error))
    return FALSE;
  if (r->kind == OPTION_RANGE_DOUBLE) {
    double x = *(double *)r->value;
    if (isfinite(x) && (r->min_open ? x > r->dmin : x >= r->dmin) &&
        (r->max_open ? x < r->dmax : x <= r->dmax))
      return TRUE;
    g_autofree gchar *shown = text != NULL ? g_strdup(text) : g_strdup_printf("%g", x);
    return refuse(r, shown, "is out of range", error);
  }
  gint64 n = r->kind == OPTION_RANGE_INT ? *(gint *)r->value : *(gint64 *)r->value;
  if (n >= r->imin && n <= r->imax)
    return TRUE;
  g_autofree gchar *shown = text != NULL ? g_strdup(text) : g_strdup_printf("%" G_GINT64_FORMAT, n);
  return refuse(r, shown, "is out of range", error);
}

gboolean
options_check_ranges(const OptionRange *ranges, guint n, GError **error)
{
  for (guint i = 0; i < n; i++)
    if (!check_one(&ranges[i], error))
      return FALSE;
  return TRUE;
}

gint
options_max_threads(void)
{
  return 4 * (gint)g_get_num_processors();
}

gboolean
options_check_choice(const gchar *name, const gchar *value, const gchar *a, const gchar *b,
                     GError **error)
{
  if (value == NULL || g_str_equal(value, a) || g_str_equal(value, b))
    return TRUE;
  g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE, "unknown --%s '%s' (%s or %s)", name,
              value, a, b);
  return FALSE;
}
