/* luong-options.h: the command-line options of --model luong (the score
 * function, local attention and input feeding), kept apart from main.c. */
#pragma once

#include <glib.h>

#include "model.h"

typedef struct {
  gchar *score;
  gchar *local_m;
  gchar *local_p;
  gboolean input_feeding;
} LuongOptions;

/* For the option table: the entries that fill the LuongOptions at lo. */
#define LUONG_OPTION_ENTRIES(lo)                                                                   \
  {"score",                                                                                        \
   0,                                                                                              \
   0,                                                                                              \
   G_OPTION_ARG_STRING,                                                                            \
   &(lo)->score,                                                                                   \
   "Luong score function: dot, general (default) or concat",                                       \
   "NAME"},                                                                                        \
      {"local-m",                                                                                  \
       0,                                                                                          \
       0,                                                                                          \
       G_OPTION_ARG_STRING,                                                                        \
       &(lo)->local_m,                                                                             \
       "Luong local-m attention over the source positions |s - t| <= D (t held at the "            \
       "sentence's last word)",                                                                    \
       "D"},                                                                                       \
      {"local-p",                                                                                  \
       0,                                                                                          \
       0,                                                                                          \
       G_OPTION_ARG_STRING,                                                                        \
       &(lo)->local_p,                                                                             \
       "Luong local-p attention: a window of half-width D around a predicted position, "           \
       "weighted by a Gaussian of sigma D/2",                                                      \
       "D"},                                                                                       \
  {                                                                                                \
    "input-feeding", 0, 0, G_OPTION_ARG_NONE, &(lo)->input_feeding,                                \
        "Luong input feeding: the previous attentional vector joins the decoder's input", NULL     \
  }

/* Check the Luong options against the model chosen (they need --model
 * luong; --local-m and --local-p exclude each other; D from 1 to max_steps)
 * and, for luong, fill cfg->luong and cfg->input_feeding. */
gboolean luong_options_apply(const LuongOptions *lo, ModelConfig *cfg, gint max_steps,
                             GError **error);
/* Free the strings GOption stored. */
void luong_options_clear(LuongOptions *lo);
