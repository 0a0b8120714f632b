/* elf.c: is a file a complete ELF shared object for this machine?
 *
 * dlopen() maps a module's segments straight from the file. When the file is
 * shorter than its headers say (a truncated copy, an interrupted download or
 * install), touching a page past the end of the file raises SIGBUS inside
 * the dynamic loader and the whole process dies, before qkv could report
 * anything. So the loader checks the file's structure first, here, with
 * every offset and size bounded by the real file size. The check is a
 * function over a byte buffer so that it can be fuzzed
 * (tests/fuzz/fuzz-plugin-elf.c). It does not try to prove that a module is
 * safe to run, only that dlopen() reads nothing outside the file.
 */
#include "core/core-private.h"
#include "plugin/plugin-private.h"

#include <elf.h>
#include <errno.h>
#include <glib/gstdio.h>
#include <string.h>
#include <sys/stat.h>

#if defined(__x86_64__)
#define QKV_ELF_MACHINE EM_X86_64
#define QKV_ELF_MACHINE_NAME "x86-64"
#elif defined(__aarch64__)
#define QKV_ELF_MACHINE EM_AARCH64
#define QKV_ELF_MACHINE_NAME "AArch64"
#elif defined(__powerpc64__)
#define QKV_ELF_MACHINE EM_PPC64
#define QKV_ELF_MACHINE_NAME "PowerPC 64"
#elif defined(__riscv) && __riscv_xlen == 64
#define QKV_ELF_MACHINE EM_RISCV
#define QKV_ELF_MACHINE_NAME "RISC-V"
#elif defined(__s390x__)
#define QKV_ELF_MACHINE EM_S390
#define QKV_ELF_MACHINE_NAME "s390x"
#endif

#if G_BYTE_ORDER == G_LITTLE_ENDIAN
#define QKV_ELF_DATA ELFDATA2LSB
#define QKV_ELF_DATA_NAME "little-endian"
#else
#define QKV_ELF_DATA ELFDATA2MSB
#define QKV_ELF_DATA_NAME "big-endian"
#endif

/* More would be no shared object anyone builds; the limit keeps a hostile
 * header from making the check itself slow. */
#define MAX_HEADERS 65536

static gboolean G_GNUC_PRINTF(2, 3) elf_error(GError **error, const gchar *format, ...)
{
  va_list args;
  va_start(args, format);
  g_autofree gchar *reason = g_strdup_vprintf(format, args);
  va_end(args);
  g_set_error(error, QKV_ERROR, QKV_ERROR_PLUGIN, "%s", reason);
  return FALSE;
}

/* [offset, offset + length) lies within a file of size bytes, without
 * overflowing. */
static gboolean
in_file(guint64 offset, guint64 length, gsize size)
{
  return offset <= size && length <= size - offset;
}

/* The end of count entries of entsize bytes from offset, or G_MAXUINT64 if
 * that overflows. */
static guint64
table_end(guint64 offset, guint64 count, guint64 entsize)
{
  if (count != 0 && entsize > (G_MAXUINT64 - offset) / count)
    return G_MAXUINT64;
  return offset + count * entsize;
}

static const gchar *
segment_name(guint32 type)
{
  switch (type) {
  case PT_LOAD:
    return "PT_LOAD";
  case PT_DYNAMIC:
    return "PT_DYNAMIC";
  case PT_INTERP:
    return "PT_INTERP";
  case PT_NOTE:
    return "PT_NOTE";
  case PT_PHDR:
    return "PT_PHDR";
  case PT_TLS:
    return "PT_TLS";
  case PT_GNU_EH_FRAME:
    return "PT_GNU_EH_FRAME";
  case PT_GNU_PROPERTY:
    return "PT_GNU_PROPERTY";
  default:
    return "segment";
  }
}

static gboolean
check_header(const Elf64_Ehdr *eh, gsize size, GError **error)
{
  if (eh->e_ident[EI_CLASS] != ELFCLASS64)
    return elf_error(error, "ELF class %u, not 64-bit (ELFCLASS64)", eh->e_ident[EI_CLASS]);
  if (eh->e_ident[EI_DATA] != QKV_ELF_DATA)
    return elf_error(error, "ELF data encoding %u, not " QKV_ELF_DATA_NAME " as this machine",
                     eh->e_ident[EI_DATA]);
  if (eh->e_ident[EI_VERSION] != EV_CURRENT || eh->e_version != EV_CURRENT)
    return elf_error(error, "ELF version %u, not %u", (guint)eh->e_version, EV_CURRENT);
  if (eh->e_type != ET_DYN)
    return elf_error(error, "ELF type %u, not a shared object (ET_DYN)", eh->e_type);
#ifdef QKV_ELF_MACHINE
  if (eh->e_machine != QKV_ELF_MACHINE)
    return elf_error(error,
                     "built for ELF machine %u, not this machine's " QKV_ELF_MACHINE_NAME " (%u)",
                     eh->e_machine, QKV_ELF_MACHINE);
#endif
  if (eh->e_ehsize < sizeof(Elf64_Ehdr))
    return elf_error(error, "the ELF header claims %u bytes, fewer than the %u it has",
                     eh->e_ehsize, (guint)sizeof(Elf64_Ehdr));
  return TRUE;
}

static gboolean
check_program_headers(const guint8 *data, gsize size, const Elf64_Ehdr *eh, GError **error)
{
  if (eh->e_phnum == 0 || eh->e_phoff == 0)
    return elf_error(error, "no program headers: nothing to load");
  if (eh->e_phnum == PN_XNUM)
    return elf_error(error, "%u or more program headers (extended numbering) is not supported",
                     PN_XNUM);
  if (eh->e_phentsize != sizeof(Elf64_Phdr))
    return elf_error(error, "program header entries of %u bytes, not %u", eh->e_phentsize,
                     (guint)sizeof(Elf64_Phdr));
  guint64 end = table_end(eh->e_phoff, eh->e_phnum, sizeof(Elf64_Phdr));
  if (end > size)
    return elf_error(error,
                     "truncated: the program headers (offset %" G_GUINT64_FORMAT
                     ", %u entries) end past the end of the file (%" G_GSIZE_FORMAT " bytes)",
                     (guint64)eh->e_phoff, eh->e_phnum, size);

  guint n_load = 0, n_dynamic = 0;
  Elf64_Phdr dynamic = {0};
  guint64 last_vaddr = 0;
  for (guint i = 0; i < eh->e_phnum; i++) {
    Elf64_Phdr ph;
    memcpy(&ph, data + eh->e_phoff + (guint64)i * sizeof ph, sizeof ph);
    const gchar *what = segment_name(ph.p_type);
    /* glibc reads notes, the dynamic section and the interpreter name from
     * the file (or from its mapping): all must be inside it. */
    if (!in_file(ph.p_offset, ph.p_filesz, size))
      return elf_error(error,
                       "truncated: %s segment %u (offset %" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT
                       " bytes) ends past the end of the file (%" G_GSIZE_FORMAT " bytes)",
                       what, i, (guint64)ph.p_offset, (guint64)ph.p_filesz, size);
    if (ph.p_type == PT_LOAD) {
      if (ph.p_filesz > ph.p_memsz)
        return elf_error(error,
                         "PT_LOAD segment %u has more bytes in the file (%" G_GUINT64_FORMAT
                         ") than in memory (%" G_GUINT64_FORMAT ")",
                         i, (guint64)ph.p_filesz, (guint64)ph.p_memsz);
      if (ph.p_align > 1 &&
          ((ph.p_align & (ph.p_align - 1)) != 0 || (ph.p_vaddr - ph.p_offset) % ph.p_align != 0))
        return elf_error(error,
                         "PT_LOAD segment %u is not aligned as it says (%" G_GUINT64_FORMAT ")", i,
                         (guint64)ph.p_align);
      if (n_load > 0 && ph.p_vaddr < last_vaddr)
        return elf_error(error, "PT_LOAD segment %u is out of address order", i);
      if (ph.p_memsz > G_MAXUINT64 - ph.p_vaddr)
        return elf_error(error, "PT_LOAD segment %u wraps around the address space", i);
      last_vaddr = ph.p_vaddr;
      n_load++;
    } else if (ph.p_type == PT_DYNAMIC) {
      dynamic = ph;
      n_dynamic++;
    }
  }
  if (n_load == 0)
    return elf_error(error, "no PT_LOAD segment: nothing to load");
  if (n_dynamic != 1)
    return elf_error(error, "%u PT_DYNAMIC segments, a shared object has one", n_dynamic);
  if (dynamic.p_filesz < sizeof(Elf64_Dyn))
    return elf_error(error, "the PT_DYNAMIC segment is empty");

  /* The loader reads the dynamic section through the mapping of a PT_LOAD
   * segment: it must lie in the part of one that comes from the file. */
  for (guint i = 0; i < eh->e_phnum; i++) {
    Elf64_Phdr ph;
    memcpy(&ph, data + eh->e_phoff + (guint64)i * sizeof ph, sizeof ph);
    if (ph.p_type == PT_LOAD && dynamic.p_vaddr >= ph.p_vaddr &&
        dynamic.p_vaddr - ph.p_vaddr <= ph.p_filesz &&
        dynamic.p_filesz <= ph.p_filesz - (dynamic.p_vaddr - ph.p_vaddr))
      return TRUE;
  }
  return elf_error(error, "the PT_DYNAMIC segment lies outside every PT_LOAD segment's file data");
}

static gboolean
check_section_headers(const guint8 *data, gsize size, const Elf64_Ehdr *eh, GError **error)
{
  if (eh->e_shoff == 0) {
    if (eh->e_shnum != 0)
      return elf_error(error, "%u section headers at offset 0", eh->e_shnum);
    return TRUE; /* stripped of section headers: dlopen() needs none */
  }
  if (eh->e_shentsize != sizeof(Elf64_Shdr))
    return elf_error(error, "section header entries of %u bytes, not %u", eh->e_shentsize,
                     (guint)sizeof(Elf64_Shdr));
  if (!in_file(eh->e_shoff, sizeof(Elf64_Shdr), size))
    return elf_error(error,
                     "truncated: the section headers (offset %" G_GUINT64_FORMAT
                     ") start past the end of the file (%" G_GSIZE_FORMAT " bytes)",
                     (guint64)eh->e_shoff, size);
  /* With 0xff00 or more sections, the count is in section 0's sh_size. */
  guint64 count = eh->e_shnum;
  if (count == 0) {
    Elf64_Shdr first;
    memcpy(&first, data + eh->e_shoff, sizeof first);
    count = first.sh_size;
  }
  if (count == 0 || count > MAX_HEADERS)
    return elf_error(error, "%" G_GUINT64_FORMAT " section headers", count);
  guint64 end = table_end(eh->e_shoff, count, sizeof(Elf64_Shdr));
  if (end > size)
    return elf_error(error,
                     "truncated: the section headers (offset %" G_GUINT64_FORMAT
                     ", %" G_GUINT64_FORMAT
                     " entries) end past the end of the file (%" G_GSIZE_FORMAT " bytes)",
                     (guint64)eh->e_shoff, count, size);
  if (eh->e_shstrndx != SHN_UNDEF && eh->e_shstrndx != SHN_XINDEX && eh->e_shstrndx >= count)
    return elf_error(
        error, "the section name table index %u is not a section (%" G_GUINT64_FORMAT " sections)",
        eh->e_shstrndx, count);
  for (guint64 i = 1; i < count; i++) {
    Elf64_Shdr sh;
    memcpy(&sh, data + eh->e_shoff + i * sizeof sh, sizeof sh);
    if (sh.sh_type == SHT_NOBITS || sh.sh_type == SHT_NULL)
      continue;
    if (!in_file(sh.sh_offset, sh.sh_size, size))
      return elf_error(error,
                       "truncated: section %" G_GUINT64_FORMAT " (offset %" G_GUINT64_FORMAT
                       ", %" G_GUINT64_FORMAT
                       " bytes) ends past the end of the file (%" G_GSIZE_FORMAT " bytes)",
                       i, (guint64)sh.sh_offset, (guint64)sh.sh_size, size);
  }
  return TRUE;
}

gboolean
qkv_elf_check_shared_object(const guint8 *data, gsize size, GError **error)
{
  g_return_val_if_fail(data != NULL || size == 0, FALSE);
  if (size == 0)
    return elf_error(error, "the file is empty");
  if (size < SELFMAG || memcmp(data, ELFMAG, SELFMAG) != 0)
    return elf_error(error, "not an ELF file (no ELF magic number)");
  if (size < sizeof(Elf64_Ehdr))
    return elf_error(error,
                     "truncated: %" G_GSIZE_FORMAT " bytes, shorter than an ELF header (%u bytes)",
                     size, (guint)sizeof(Elf64_Ehdr));
  Elf64_Ehdr eh;
  memcpy(&eh, data, sizeof eh);
  return check_header(&eh, size, error) && check_program_headers(data, size, &eh, error) &&
         check_section_headers(data, size, &eh, error);
}

gboolean
qkv_elf_check_file(const gchar *path, GError **error)
{
  /* Only a regular file: reading a FIFO or /dev/zero to the end would never
   * end, and dlopen() of a device makes no sense. */
  GStatBuf st;
  if (g_stat(path, &st) != 0)
    return elf_error(error, "cannot read it: %s", g_strerror(errno));
  if (!S_ISREG(st.st_mode))
    return elf_error(error, "not a regular file");
  /* Mapped, not read: only the headers are looked at, and a large module
   * costs no memory. (Were the file truncated while it is mapped, reading
   * past the new end would raise SIGBUS; dlopen() would do the same.) */
  GError *map_error = NULL;
  g_autoptr(GMappedFile) mapped = g_mapped_file_new(path, FALSE, &map_error);
  if (mapped == NULL) {
    elf_error(error, "cannot read it: %s", map_error->message);
    g_error_free(map_error);
    return FALSE;
  }
  return qkv_elf_check_shared_object((const guint8 *)g_mapped_file_get_contents(mapped),
                                     g_mapped_file_get_length(mapped), error);
}
