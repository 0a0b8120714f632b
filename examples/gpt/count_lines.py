#!/usr/bin/env python3
"""Non-blank, non-comment lines of qkv-gpt's model and training
(examples/gpt/model.c), its generation (examples/gpt/generate.c) and the
PyTorch twin's model and training (bench/peers/torch_gpt.py between the
"# --- model and training" and "# --- end" markers) and generation (its
generate()). #include lines are left out of the C counts, as the twin's
imports are outside its range."""
import os
import re
import sys

root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), '..', '..')


def c_lines(path):
    text = re.sub(r'/\*.*?\*/', '', open(path).read(), flags=re.S)
    lines = [re.sub(r'//.*', '', l).strip() for l in text.splitlines()]
    return sum(1 for l in lines if l and not l.startswith('#include'))


def py_lines(path, start, end):
    lines = open(path).read().splitlines()
    first = next(i for i, l in enumerate(lines) if l.startswith(start))
    last = next(i for i, l in enumerate(lines) if i > first and l.startswith(end))
    return sum(1 for l in lines[first + 1:last] if l.strip() and not l.strip().startswith('#'))


twin = os.path.join(root, 'bench', 'peers', 'torch_gpt.py')
qkv_model = c_lines(os.path.join(root, 'examples', 'gpt', 'model.c'))
torch_model = py_lines(twin, '# --- model and training', '# --- end')
qkv_gen = c_lines(os.path.join(root, 'examples', 'gpt', 'generate.c'))
torch_gen = py_lines(twin, '# --- generation', '# --- end')
print(f'model + training: qkv {qkv_model}, PyTorch {torch_model}, '
      f'ratio {qkv_model / torch_model:.2f} (target <= 1.3)')
print(f'generation: qkv {qkv_gen} (target <= 30), PyTorch {torch_gen}')
