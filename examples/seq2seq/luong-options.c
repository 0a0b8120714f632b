/* luong-options.c: --score, --local-m, --local-p and --input-feeding. */
#include "luong-options.h"

static gboolean
parse_window(const gchar *option, const gchar *text, gint max_steps, gint *out, GError **error)
{
  gint64 d;
  if (!g_ascii_string_to_signed(text, 10, 1, max_steps, &d, NULL)) {
    g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                "--%s must be an integer from 1 to %d, not '%s'", option, max_steps, text);
    return FALSE;
  }
  *out = (gint)d;
  return TRUE;
}

gboolean
luong_options_apply(const LuongOptions *lo, ModelConfig *cfg, gint max_steps, GError **error)
{
  if (cfg->kind != MODEL_LUONG) {
    const gchar *given = lo->score           ? "--score"
                         : lo->local_m       ? "--local-m"
                         : lo->local_p       ? "--local-p"
                         : lo->input_feeding ? "--input-feeding"
                                             : NULL;
    if (given == NULL)
      return TRUE;
    g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE, "%s applies to --model luong only",
                given);
    return FALSE;
  }
  QkvLuongAttentionConfig att = {.score = QKV_LUONG_GENERAL, .align = QKV_LUONG_GLOBAL};
  if (lo->score != NULL) {
    if (g_str_equal(lo->score, "dot"))
      att.score = QKV_LUONG_DOT;
    else if (g_str_equal(lo->score, "concat"))
      att.score = QKV_LUONG_CONCAT;
    else if (!g_str_equal(lo->score, "general")) {
      g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                  "unknown --score '%s' (dot, general or concat)", lo->score);
      return FALSE;
    }
  }
  if (lo->local_m != NULL && lo->local_p != NULL) {
    g_set_error(error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                "--local-m and --local-p exclude each other");
    return FALSE;
  }
  if (lo->local_m != NULL) {
    att.align = QKV_LUONG_LOCAL_M;
    if (!parse_window("local-m", lo->local_m, max_steps, &att.window, error))
      return FALSE;
  } else if (lo->local_p != NULL) {
    att.align = QKV_LUONG_LOCAL_P;
    if (!parse_window("local-p", lo->local_p, max_steps, &att.window, error))
      return FALSE;
  }
  cfg->luong = att;
  cfg->input_feeding = lo->input_feeding;
  return TRUE;
}

void
luong_options_clear(LuongOptions *lo)
{
  g_clear_pointer(&lo->score, g_free);
  g_clear_pointer(&lo->local_m, g_free);
  g_clear_pointer(&lo->local_p, g_free);
}
