/* text.h: the text files the examples read — where the shipped corpus is,
 * and opening a file that may be gzipped. */
#pragma once

#include <gio/gio.h>

/* fra-eng/fra.txt.gz in the first of $QKV_DATA_DIR, installed_dir and
 * source_dir that has it (installed with qkv, or beside the sources of a
 * build tree); under source_dir when none has it. Free with g_free(). */
gchar *text_fra_eng_path(const gchar *installed_dir, const gchar *source_dir);

/* A stream of the file's bytes, inflated when its name ends in .gz. */
GInputStream *text_open(const gchar *path, GError **error);
