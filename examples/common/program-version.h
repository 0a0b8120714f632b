/* program-version.h: --version for every program the project builds.
 *
 * Each prints one line, "PROGRAM X.Y.Z (qkv A.B.C)": X.Y.Z is the version
 * of the qkv headers the program was compiled against (QKV_VERSION_STRING),
 * A.B.C the library it runs with (qkv_version()). The two differ when
 * libqkv.so was upgraded under a program that was not rebuilt, which is
 * what a bug report needs to know. Header-only, so that the benchmarks and
 * tools can include it without linking anything more. */
#pragma once

#include <glib.h>
#include <qkv/qkv.h>
#include <stdio.h>

/* Prints the version line of program (its installed name) to stdout. */
static inline void
program_print_version(const char *program)
{
  printf("%s %s (qkv %s)\n", program, QKV_VERSION_STRING, qkv_version());
}

/* For the programs that read argv themselves (no GOption): TRUE when one
 * argument before "--" is --version or -V. */
static inline gboolean
program_version_requested(int argc, char **argv)
{
  for (int i = 1; i < argc; i++) {
    if (g_strcmp0(argv[i], "--") == 0)
      return FALSE;
    if (g_strcmp0(argv[i], "--version") == 0 || g_strcmp0(argv[i], "-V") == 0)
      return TRUE;
  }
  return FALSE;
}
