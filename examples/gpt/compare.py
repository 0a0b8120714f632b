#!/usr/bin/env python3
"""qkv-gpt against its PyTorch twin (bench/peers/torch_gpt.py) at one config:
runs alternate (qkv 1 thread, PyTorch 1 thread, qkv 2 threads, PyTorch 2
threads, repeated), and the medians of the last report line's train loss,
validation loss and ms/step are printed as a Markdown table.
Usage: compare.py QKV_GPT [REPEATS [EXTRA ARGS...]]"""
import os
import re
import statistics
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
qkv = sys.argv[1]
repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 3
args = sys.argv[3:] or ['--steps', '1000', '--seed', '0', '--length', '50']
twin = ['/usr/bin/python3', os.path.join(here, '..', '..', 'bench', 'peers', 'torch_gpt.py')]
last = re.compile(r'step +\d+  train loss ([\d.]+)  val loss ([\d.]+)  ([\d.]+) ms/step')
results = {}
for r in range(repeats):
    for threads in ('1', '2'):
        for name, cmd in (('qkv', [qkv]), ('PyTorch', twin)):
            out = subprocess.run(cmd + args + ['--threads', threads], capture_output=True,
                                 text=True, check=True).stdout
            values = [float(v) for v in last.findall(out)[-1]]
            results.setdefault((name, threads), []).append(values)
            print(name, threads, values, file=sys.stderr, flush=True)
print('| implementation | threads | train loss | val loss | ms/step | runs (ms/step) |')
print('|---|---|---|---|---|---|')
for (name, threads), runs in results.items():
    med = [statistics.median(col) for col in zip(*runs)]
    print(f'| {name} | {threads} | {med[0]:.4f} | {med[1]:.4f} | {med[2]:.2f} | '
          + ', '.join(f'{v[2]:.2f}' for v in runs) + ' |')
