/* fuzz-plugin-elf.c: the plugin loader's ELF check over arbitrary bytes.
 *
 * qkv_elf_check_shared_object() decides whether a file may be handed to
 * dlopen(); it reads every header at offsets the file itself gives, so it
 * must neither read outside the buffer nor hit undefined behaviour whatever
 * the bytes are. Seeds: the built plugins (the .so files in build/examples/plugins
 * and build/tests/plugins). Built by tests/fuzz/run.sh with
 * clang -fsanitize=fuzzer,address,undefined against the library sources. */
#include "core/core-private.h"
#include "plugin/plugin-private.h"

#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  GError *error = NULL;
  gboolean ok = qkv_elf_check_shared_object(data, size, &error);
  /* Exactly one of: accepted, or refused with a message. */
  if (ok == (error != NULL) || (error != NULL && error->message[0] == '\0'))
    __builtin_trap();
  g_clear_error(&error);
  return 0;
}
