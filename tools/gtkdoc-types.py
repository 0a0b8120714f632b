#!/usr/bin/python3
"""gtkdoc-types.py HEADER...: the companion of gtkdoc-convert.py for
everything that is not a function: give each typedef (enum, struct, opaque
struct, callback) and each #define a GLib-style doc comment, in place.

The plain comment right above the declaration becomes the description (the
text is kept); an enum gets one @MEMBER: line per member, from the comment
beside or above the member where there is one; a callback gets @param: and
Returns: lines. Comments inside struct and enum bodies stay where they are.
Declarations that already have a /** comment are left alone."""
import re
import sys

COMMENT = r"(?P<comment>/\*(?:[^*]|\*(?!/))*\*/\n)?"
ENUM = re.compile(COMMENT + r"(?P<decl>typedef enum\s*\w*\s*\{(?P<body>.*?)\}\s*(?P<name>\w+);)", re.S)
STRUCT = re.compile(COMMENT + r"(?P<decl>typedef struct\s*\w*\s*\{.*?\}\s*(?P<name>\w+);)", re.S)
OPAQUE = re.compile(COMMENT + r"(?P<decl>typedef struct (?P<tag>_\w+) (?P<name>\w+);)")
CALLBACK = re.compile(COMMENT + r"(?P<decl>typedef (?P<ret>[\w\s\*]+?)\s*\(\s*\*\s*(?P<name>\w+)\)\s*\((?P<params>[^;]*?)\);)", re.S)
DEFINE = re.compile(COMMENT + r"(?P<decl>#define (?P<name>QKV_\w+)(?P<args>\([^)]*\))?[^\n]*)")


def text_of(comment):
    if not comment:
        return []
    body = re.sub(r"^/\*+", "", comment.strip())
    body = re.sub(r"\*/$", "", body)
    out = [re.sub(r"^\s*\* ?", "", l).rstrip() if re.match(r"^\s*\*", l) else l.strip() for l in body.split("\n")]
    while out and not out[0]:
        out.pop(0)
    while out and not out[-1]:
        out.pop()
    return out


def words(name):
    """QkvPlanOptions -> "plan options", QKV_MAX_RANK -> "max rank"."""
    name = re.sub(r"^(Qkv|QKV_)", "", name)
    name = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", name)
    return name.replace("_", " ").lower()


def common_prefix(names):
    prefix = names[0] if names else ""
    for n in names[1:]:
        while not n.startswith(prefix):
            prefix = prefix[:-1]
    return prefix[: prefix.rfind("_") + 1]


def enum_members(body):
    """(member, doc) in order: the comment on the member's line, else the
    comment right above it, else its name in words."""
    members, pending = [], None
    for line in body.split("\n"):
        s = line.strip()
        m = re.match(r"/\*(.*?)\*/$", s)
        if m:
            pending = m.group(1).strip()
            continue
        if s.startswith("/*"):
            pending = s[2:].strip()
            continue
        if pending is not None and not re.match(r"[A-Z_0-9]+\b", s) and not s.startswith("}"):
            pending = (pending + " " + s.lstrip("* ").replace("*/", "").strip()).strip()
            continue
        m = re.match(r"([A-Z][A-Z_0-9]+)\b[^/]*(?:/\*(.*?)\*/)?", s)
        if m:
            doc = (m.group(2) or pending or "").strip()
            members.append((m.group(1), " ".join(doc.split())))
            pending = None
    prefix = common_prefix([n for n, _ in members])
    return [(n, d or n[len(prefix):].lower().replace("_", " ")) for n, d in members]


def block(symbol, params, text, returns=None):
    lines = ["/**", f" * {symbol}:"]
    for name, doc in params:
        cur, prefix = f"@{name}:", " * "
        for w in doc.split():  # wrapped at 100 columns, continuations indented
            if len(prefix + cur + " " + w) > 100:
                lines.append(prefix + cur)
                cur, prefix = w, " *   "
            else:
                cur += " " + w
        lines.append(prefix + cur)
    lines.append(" *")
    lines += [" * " + t if t else " *" for t in text]
    if returns:
        lines += [" *", f" * Returns: {returns}"]
    lines.append(" */")
    return "\n".join(lines) + "\n"


def convert(path):
    src = open(path, encoding="utf-8").read()
    edits = []  # (start, end, replacement)

    def add(m, doc):
        if m.group("comment") and m.group("comment").startswith("/**"):
            return
        start = m.start("comment") if m.group("comment") else m.start("decl")
        edits.append((start, m.start("decl"), doc))

    for m in ENUM.finditer(src):
        text = text_of(m.group("comment")) or [f"The {words(m.group('name'))} values."]
        add(m, block(m.group("name"), enum_members(m.group("body")), text))
    for m in STRUCT.finditer(src):
        if "(*" in m.group("decl").split("{")[0]:
            continue
        add(m, block(m.group("name"), [], text_of(m.group("comment")) or [f"A {words(m.group('name'))}."]))
    for m in OPAQUE.finditer(src):
        add(m, block(m.group("name"), [], text_of(m.group("comment")) or
                     [f"An opaque {words(m.group('name'))}."]))
    for m in CALLBACK.finditer(src):
        params = []
        for p in m.group("params").split(","):
            p = " ".join(p.split())
            pm = re.match(r".*?(\w+)$", p)
            if p and p != "void" and pm:
                name = pm.group(1)
                params.append((name, "data given with the callback" if name == "user_data" else
                               "return location for a #GError" if name == "error" else f"the {words(name)}"))
        ret = m.group("ret").strip()
        add(m, block(m.group("name"), params, text_of(m.group("comment")) or
                     [f"The signature of a {words(m.group('name'))}."],
                     None if ret == "void" else "as described above"))
    for m in DEFINE.finditer(src):
        name = m.group("name")
        if name.startswith("QKV_TYPE_") or name == "QKV_API" or src[max(0, m.start("decl") - 3):m.start("decl")] == "/**":
            continue
        params = []
        if m.group("args"):
            for a in m.group("args")[1:-1].split(","):
                a = a.strip()
                params.append(("..." if a == "..." else a, "the values" if a == "..." else f"the {words(a.rstrip('_'))}"))
        add(m, block(name, params, text_of(m.group("comment")) or [f"{words(name).capitalize()}."]))
    for start, end, doc in sorted(edits, reverse=True):
        src = src[:start] + doc + src[end:]
    open(path, "w", encoding="utf-8").write(src)


for header in sys.argv[1:]:
    convert(header)
