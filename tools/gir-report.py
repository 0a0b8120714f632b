#!/usr/bin/python3
"""gir-report.py GIR HEADER...: the callables a GIR marks introspectable="0"
(bindings cannot call them), in three lists: the op ABI (the kernel,
shape-rule and attribute API of qkv-plugin.h's parts qkv-plugin-op.h and
qkv-plugin-kernel.h, for ops written in C), those the
headers leave out on purpose with a (skip) annotation (each has a comment
saying why, and most an introspectable twin), and the rest, which is what
should stay empty. Macros are not counted."""
import re
import sys
import xml.etree.ElementTree as ET

C_ID = "{http://www.gtk.org/introspection/c/1.0}identifier"
KINDS = ("function", "method", "constructor", "callback", "virtual-method")

gir, headers = sys.argv[1], sys.argv[2:]
# the parts of qkv-plugin.h that hold the op ABI (qkv-plugin-load.h, the
# plugin loader, is not part of it)
OP_ABI_HEADERS = ("qkv-plugin-op.h", "qkv-plugin-kernel.h")
skipped, op_abi = set(), set()
for header in headers:
    text = open(header, encoding="utf-8").read()
    for name in re.findall(r"^ \* (qkv_\w+): \(skip\)", text, re.M):
        (op_abi if header.endswith(OP_ABI_HEADERS) else skipped).add(name)
lists = {"op ABI": set(), "skipped": set(), "not introspectable": set()}
for el in ET.parse(gir).getroot().iter():
    if el.tag.split("}")[-1] not in KINDS or el.get("introspectable") != "0":
        continue
    name = el.get(C_ID) or el.get("name")
    key = "op ABI" if name in op_abi else "skipped" if name in skipped else "not introspectable"
    lists[key].add(name)
for key, names in lists.items():
    print(f"{key}: {len(names)}" + ("".join(f"\n  {n}" for n in sorted(names)) if key != "op ABI" else ""))
sys.exit(1 if lists["not introspectable"] else 0)
