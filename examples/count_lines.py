#!/usr/bin/env python3
"""Non-blank, non-comment lines of C files, counted as examples/gpt/
count_lines.py counts them: /* */ and // comments removed, blank lines and
#include lines left out. With no arguments: the files of the "Line counts in
the new idiom" table in examples/README.md.

  examples/count_lines.py [FILE...]"""
import os
import re
import sys

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..')
DEFAULT = ['examples/first.c', 'examples/classify/main.c', 'examples/classify/data.c',
           'graph/models/gru.c', 'graph/models/luong.c', 'graph/models/nw.c']


def c_lines(path):
    text = re.sub(r'/\*.*?\*/', '', open(path).read(), flags=re.S)
    lines = [re.sub(r'//.*', '', l).strip() for l in text.splitlines()]
    return sum(1 for l in lines if l and not l.startswith('#include'))


files = sys.argv[1:] or [os.path.join(root, f) for f in DEFAULT]
total = 0
for f in files:
    n = c_lines(f)
    total += n
    print(f'{n:5d}  {os.path.relpath(f, root) if not sys.argv[1:] else f}')
print(f'{total:5d}  total')
