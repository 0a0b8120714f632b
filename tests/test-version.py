#!/usr/bin/env python3
"""Every program the project builds answers --version (and -V) with exit
status 0 and one line, 'NAME VERSION (qkv VERSION)': NAME is the program's
file name, VERSION the project's version as meson.build states it (passed
as the first argument), the headers' and the library's being the same in a
build tree. Nothing else runs: a program that ignored --version would start
training or benchmarking and fail the time limit or the output check."""
import os
import subprocess
import sys

version = sys.argv[1]
programs = sys.argv[2:]
failures = []
for path in programs:
    name = os.path.basename(path)
    expected = f'{name} {version} (qkv {version})\n'
    for flag in ['--version', '-V']:
        try:
            p = subprocess.run([path, flag], capture_output=True, text=True, timeout=20)
        except subprocess.TimeoutExpired:
            failures.append(f'{name} {flag}: still running after 20 s')
            continue
        if p.returncode != 0 or p.stdout != expected:
            failures.append(f'{name} {flag}: exit {p.returncode}, printed {p.stdout!r} '
                            f'(expected {expected!r}); stderr {p.stderr!r}')
for f in failures:
    print('FAIL:', f)
print(f'{len(programs)} programs checked;', 'ok' if not failures else f'{len(failures)} failures')
sys.exit(1 if failures else 0)
