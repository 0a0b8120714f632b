#!/usr/bin/env python3
"""Every example program refuses a numeric option outside its range with
exit status 2 and the shared checker's message (examples/common/options.h),
before any work: "PROG: --NAME VALUE is out of range [MIN, MAX]".
qkv-classify --max-len 2000000000 once aborted in g_new (issue 29, item 7);
qkv-nw-regression took --lr nan and --epochs -3."""
import os
import subprocess
import sys

PROGRAMS = {name: os.environ[var] for name, var in [
    ('qkv-classify', 'QKV_CLASSIFY'), ('qkv-gpt', 'QKV_GPT'),
    ('qkv-nw-regression', 'QKV_NW_REGRESSION'), ('qkv-seq2seq', 'QKV_SEQ2SEQ'),
    ('qkv-bench-decode', 'QKV_BENCH_DECODE'), ('qkv-bench-long', 'QKV_BENCH_LONG'),
    ('qkv-bench-shapes', 'QKV_BENCH_SHAPES'), ('qkv-bench-transformer', 'QKV_BENCH_TRANSFORMER'),
    ('qkv-sgemm-peak', 'QKV_SGEMM_PEAK')] if var in os.environ}

# (program, arguments, the message after "PROG: ")
CASES = [
    ('qkv-classify', ['--max-len', '2000000000'], '--max-len 2000000000 is out of range [1, 4096]'),
    ('qkv-classify', ['--embed', '100000'], '--embed 100000 is out of range [1, 8192]'),
    ('qkv-classify', ['--lr', 'nan'], '--lr nan is out of range (0, 10]'),
    ('qkv-classify', ['--held-out', '1'], '--held-out 1 is out of range (0, 1)'),
    ('qkv-classify', ['--tau', 'inf'], '--tau inf is out of range (0, 1e+06]'),
    ('qkv-classify', ['--epochs', '-1'], '--epochs -1 is out of range [0, 1000000]'),
    ('qkv-gpt', ['--top-p', '0'], '--top-p 0 is out of range (0, 1]'),
    ('qkv-gpt', ['--lr', 'nan'], '--lr nan is out of range (0, 1]'),
    ('qkv-gpt', ['--block', '100000'], '--block 100000 is out of range [2, 4096]'),
    ('qkv-nw-regression', ['--lr', 'nan'], '--lr nan is out of range [0, 1000]'),
    ('qkv-nw-regression', ['--epochs', '-3'], '--epochs -3 is out of range [0, 1000000]'),
    ('qkv-seq2seq', ['--max-len', '2000000000'],
     '--max-len 2000000000 is out of range [1, 1000000]'),
    ('qkv-seq2seq', ['--lr', 'nan'], '--lr nan is out of range (0, 10]'),
    ('qkv-seq2seq', ['--dropout', '1'], '--dropout 1 is out of range [0, 1)'),
    ('qkv-seq2seq', ['--epochs', '3x'], '--epochs 3x is not an integer in [0, 1000000]'),
    ('qkv-seq2seq', ['--threads', '100000'],
     f'--threads 100000 is out of range [1, {4 * os.cpu_count()}] '
     f'(4 times the {os.cpu_count()} processors here)'),
    # the benchmarks' options (refused before any timing)
    ('qkv-bench-decode', ['--len', '0'], '--len 0 is out of range [1, 65536]'),
    ('qkv-bench-long', ['--T', '4000000000'], '--T 4000000000 is out of range [1, 1048576]'),
    ('qkv-bench-shapes', ['--rounds', '-1'], '--rounds -1 is out of range [1, 1000000]'),
    ('qkv-bench-transformer', ['--config', 'S', '--dropout', '1'],
     '--dropout 1 is out of range [-1, 1)'),
    ('qkv-sgemm-peak', ['--seconds', 'nan'], '--seconds nan is out of range [0, 3600]'),
]

failures = []
for prog, args, message in CASES:
    if prog not in PROGRAMS:
        continue  # qkv-sgemm-peak is built on x86 only
    try:
        p = subprocess.run([PROGRAMS[prog]] + args, capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        failures.append(f'{prog} {" ".join(args)}: still running after 20 s (accepted)')
        continue
    want = f'{prog}: {message}\n'
    if p.returncode != 2 or p.stderr != want or 'loss' in p.stdout:
        failures.append(f'{prog} {" ".join(args)}: exit {p.returncode} (want 2), '
                        f'stderr {p.stderr!r} (want {want!r})')
for f in failures:
    print('FAIL:', f)
print('ok' if not failures else f'{len(failures)} failures')
sys.exit(1 if failures else 0)
