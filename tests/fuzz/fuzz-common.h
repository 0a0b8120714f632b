/* fuzz-common.h: what the libFuzzer targets share (see run.sh). */
#pragma once

#include <qkv/qkv.h>

#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* The readers take a path: each input goes into one memory file, opened by
 * its /proc/self/fd path, so fuzzing touches no disk. */
static gchar *
fuzz_memfile_path(void)
{
  static gchar *path;
  static int fd = -1;
  if (fd < 0) {
    fd = memfd_create("qkv-fuzz", MFD_CLOEXEC);
    if (fd < 0)
      abort();
    path = g_strdup_printf("/proc/self/fd/%d", fd);
  }
  return path;
}

static const gchar *
fuzz_write_input(const guint8 *data, size_t size)
{
  const gchar *path = fuzz_memfile_path();
  int fd = atoi(path + strlen("/proc/self/fd/"));
  if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size)
    abort();
  return path;
}

/* No system plugins: the targets fuzz qkv's own readers. */
static void
fuzz_environment(void)
{
  g_setenv("QKV_PLUGIN_SYSTEM_PATH", "", TRUE);
  g_unsetenv("QKV_PLUGIN_PATH");
}
