#!/usr/bin/python3
"""test-gi-first.py FIRST_PY QKV_FIRST: examples/python/first.py trains the
first program's MLP through GObject Introspection and saves a checkpoint;
the C program (qkv-first --load) evaluates that file on the same test points.
Fails unless both run, both print the same accuracy (Python's data are
first.c's: the same GRand draws, grand.py) and it is at least 0.9. Exits 77
(skipped) where PyGObject, NumPy or the typelib is missing. GI_TYPELIB_PATH
and LD_LIBRARY_PATH point at the build (meson sets them)."""
import os
import re
import subprocess
import sys
import tempfile

first_py, qkv_first = sys.argv[1], sys.argv[2]
probe = subprocess.run(
    [sys.executable, "-c", "import gi, numpy; gi.require_version('Qkv', '0.1'); from gi.repository import Qkv"],
    capture_output=True, text=True)
if probe.returncode != 0:
    print("skipped: PyGObject, NumPy or Qkv-0.1.typelib missing:", probe.stderr.strip().splitlines()[-1:])
    sys.exit(77)

ACC = re.compile(r"test accuracy (\d\.\d+)")
with tempfile.TemporaryDirectory(prefix="qkv-gi-first-") as tmp:
    path = os.path.join(tmp, "first-py.safetensors")
    py = subprocess.run([sys.executable, first_py, "--save", path], capture_output=True, text=True)
    print(py.stdout + py.stderr)
    if py.returncode != 0:
        sys.exit(f"first.py failed (exit {py.returncode})")
    c = subprocess.run([qkv_first, "--load", path], capture_output=True, text=True)
    print(c.stdout + c.stderr)
    if c.returncode != 0:
        sys.exit(f"qkv-first --load failed (exit {c.returncode})")
acc_py = float(ACC.search(py.stdout).group(1))
acc_c = float(ACC.search(c.stdout).group(1))
if acc_py != acc_c:
    sys.exit(f"Python's accuracy {acc_py} and C's on the same checkpoint {acc_c} differ")
if acc_py < 0.9:
    sys.exit(f"accuracy {acc_py} is below 0.9")
print(f"ok: Python and C agree, test accuracy {acc_py}")
