#!/usr/bin/python3
"""test-exports.py LIBQKV HEADER_DIR...: the symbols libqkv.so exports are
exactly the functions and variables the public headers declare with QKV_API.

The library is built with -fvisibility=hidden, so only declarations marked
QKV_API (qkv-api.h) are exported. This fails, listing the names, when
  - a top-level declaration in a public header lacks QKV_API,
  - a QKV_API declaration names something the library does not export
    (declared but never defined, or defined static), or
  - the library exports a name no public header declares (an internal
    function marked by mistake, or a header declaration that was removed).
Names that start with '_' belong to the toolchain and are not compared.
"""
import re
import subprocess
import sys
from pathlib import Path

API_MARK = "QKV_API"
# Macros that may stand before or after a declaration without being part of
# its name: QKV_API itself and GLib's attribute macros (some with arguments).
ATTRIBUTE = re.compile(r"\b(?:QKV_API|G_GNUC_\w+|G_DEPRECATED\w*|G_ANALYZER_\w+)\b(?:\s*\([^()]*\))?")
IDENT_BEFORE_PAREN = re.compile(r"([A-Za-z_]\w*)\s*\(")
TRAILING_IDENT = re.compile(r"([A-Za-z_]\w*)\s*(?:\[[^\]]*\]\s*)*$")


def blank(match):
    """The match replaced by spaces, newlines kept, so offsets still hold."""
    return re.sub(r"[^\n]", " ", match.group(0))


def code_only(text):
    """The header with comments, string literals and preprocessor lines
    (continuations included) blanked out, and GLib's declaration-block
    macros too; offsets into the original text stay valid."""
    text = re.sub(r"/\*.*?\*/|//[^\n]*", blank, text, flags=re.S)
    text = re.sub(r'"(?:\\.|[^"\\\n])*"', blank, text)
    text = re.sub(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", blank, text, flags=re.M)
    text = re.sub(r"\bG_(?:BEGIN|END)_DECLS\b", blank, text)
    text = re.sub(r"\bG_DEFINE_AUTOPTR_CLEANUP_FUNC\s*\([^()]*\)", blank, text)
    return text


def statements(code):
    """Top-level statements as (start offset, text): each ends at a ';' outside
    braces and parentheses, or at the '}' closing an inline function body."""
    depth = 0
    start = None
    for i, c in enumerate(code):
        if start is None:
            if c.isspace():
                continue
            start = i
        if c in "({[":
            depth += 1
        elif c in ")}]":
            depth -= 1
            if c == "}" and depth == 0 and re.search(r"\)\s*(?:\w+\s*)*\{", code[start:i]):
                yield start, code[start : i + 1]
                start = None
        elif c == ";" and depth == 0:
            yield start, code[start : i + 1]
            start = None


def declarations(path):
    """The declarations in one header: (name, kind, marked, line, start) for
    each top-level function prototype or variable declaration; kind is
    "function" or "variable", marked says whether it carries QKV_API."""
    text = Path(path).read_text(encoding="utf-8")
    code = code_only(text)
    found = []
    for start, stmt in statements(code):
        flat = " ".join(stmt.split())
        if re.match(r"(?:typedef|struct|union|enum)\b", flat) and "(" not in flat.split("{")[0]:
            continue  # a type (struct or enum definition, forward declaration)
        if flat.startswith("typedef"):
            continue  # a function type or function-pointer type
        if "{" in flat:
            if re.match(r"static\b", ATTRIBUTE.sub("", flat).strip()):
                continue  # a static inline helper: compiled into the caller
            raise SystemExit(f"{path}: cannot read the statement at offset {start}: {flat[:80]}")
        marked = re.search(r"\b" + API_MARK + r"\b", flat) is not None
        bare = ATTRIBUTE.sub(" ", flat).rstrip(";").strip()
        line = text.count("\n", 0, start) + 1
        m = IDENT_BEFORE_PAREN.search(bare)
        if m and not re.search(r"\(\s*\*", bare[: m.end() + 1]):
            found.append((m.group(1), "function", marked, line, start))
            continue
        # a variable: "extern const int qkv_x;" or "extern int (*qkv_hook)(int);"
        m = re.search(r"\(\s*\*\s*([A-Za-z_]\w*)\s*\)", bare) or TRAILING_IDENT.search(bare)
        if not m:
            raise SystemExit(f"{path}:{line}: cannot read the declaration: {flat[:80]}")
        found.append((m.group(1), "variable", marked, line, start))
    return found


def exported(library):
    """Names the shared library exports: defined, global, any kind of symbol."""
    out = subprocess.run(
        ["nm", "-D", "--defined-only", "--extern-only", library],
        check=True, capture_output=True, text=True,
    ).stdout
    names = set()
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 3 and not fields[2].startswith("_"):
            names.add(fields[2].split("@")[0])
    return names


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: test-exports.py LIBQKV HEADER_DIR...")
    library, header_dirs = sys.argv[1], sys.argv[2:]
    declared = {}
    unmarked = []
    for directory in header_dirs:
        for header in sorted(Path(directory).glob("*.h")):
            for name, kind, marked, line, _ in declarations(header):
                if marked:
                    declared[name] = f"{header.name}:{line} ({kind})"
                else:
                    unmarked.append(f"{header.name}:{line}: {kind} {name}")
    names = exported(library)
    missing = sorted(set(declared) - names)
    extra = sorted(names - set(declared))
    for what in unmarked:
        print(f"declared without {API_MARK}: {what}")
    for name in missing:
        print(f"declared with {API_MARK} but not exported: {name} ({declared[name]})")
    for name in extra:
        print(f"exported but not declared in a public header: {name}")
    print(f"{len(declared)} declarations with {API_MARK}, {len(names)} exported symbols; "
          f"{len(unmarked)} unmarked, {len(missing)} not exported, {len(extra)} not declared")
    sys.exit(1 if unmarked or missing or extra else 0)


if __name__ == "__main__":
    main()
