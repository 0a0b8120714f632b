/* options.h: the numeric options of every example program, each with its
 * range, checked in one place before any work.
 *
 * A program lists its numeric options in a table of OptionRange and calls
 * options_check_ranges() after g_option_context_parse(): each value must
 * lie in its range, so that no option can ask for terabytes (qkv-classify
 * --max-len 2000000000 once aborted in g_new) or pass NaN on. GOption's
 * doubles accept "nan" and "inf"; they fail every range. An option GOption
 * read as text (OptionRange.text, as qkv-seq2seq does, to report the text
 * as given) is parsed in full here, and checked only when given. */
#pragma once

#include <glib.h>

typedef enum {
  OPTION_RANGE_INT,   /* value is a gint * */
  OPTION_RANGE_INT64, /* value is a gint64 * */
  OPTION_RANGE_DOUBLE /* value is a double * */
} OptionRangeKind;

typedef struct {
  const gchar *name; /* the long name, without "--" */
  OptionRangeKind kind;
  gpointer value;
  gint64 imin, imax;           /* the integers' range, bounds included */
  double dmin, dmax;           /* the doubles' range */
  gboolean min_open, max_open; /* whether a double's bound itself is excluded */
  gchar **text;     /* NULL: GOption parsed value; else the text to parse (NULL: not given) */
  const gchar *why; /* said after the range when refused (may be NULL) */
} OptionRange;

#define OPTION_INT(name, ptr, lo, hi)                                                              \
  {                                                                                                \
    (name), OPTION_RANGE_INT, (ptr), (lo), (hi), 0, 0, FALSE, FALSE, NULL, NULL                    \
  }
#define OPTION_INT64(name, ptr, lo, hi)                                                            \
  {                                                                                                \
    (name), OPTION_RANGE_INT64, (ptr), (lo), (hi), 0, 0, FALSE, FALSE, NULL, NULL                  \
  }
/* [lo, hi]; OPTION_DOUBLE_OPEN says which bounds are excluded */
#define OPTION_DOUBLE(name, ptr, lo, hi)                                                           \
  {                                                                                                \
    (name), OPTION_RANGE_DOUBLE, (ptr), 0, 0, (lo), (hi), FALSE, FALSE, NULL, NULL                 \
  }
#define OPTION_DOUBLE_OPEN(name, ptr, lo, hi, lo_open, hi_open)                                    \
  {                                                                                                \
    (name), OPTION_RANGE_DOUBLE, (ptr), 0, 0, (lo), (hi), (lo_open), (hi_open), NULL, NULL         \
  }

/* Parse (where OptionRange.text says so) and check every option of the
 * table; the first one out of its range is a G_OPTION_ERROR_BAD_VALUE like
 * "--max-len 2000000000 is out of range [1, 4096]". */
gboolean options_check_ranges(const OptionRange *ranges, guint n, GError **error);

/* The upper bound of --threads: more than 4 per processor only adds
 * overhead (qkv-seq2seq --threads 10000 took 53.6 s and 2.2 GB where 2
 * threads took 0.11 s). */
gint options_max_threads(void);

/* Whether value, the text of --name (NULL when not given), is absent or one
 * of the two choices a and b; else a G_OPTION_ERROR_BAD_VALUE like
 * "unknown --precision 'fp16' (fp32 or bf16)". */
gboolean options_check_choice(const gchar *name, const gchar *value, const gchar *a, const gchar *b,
                              GError **error);
