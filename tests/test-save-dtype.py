#!/usr/bin/env python3
"""--save-dtype bf16 of the examples that save checkpoints (qkv-seq2seq,
qkv-gpt, qkv-classify), tiny runs.

Each example trains twice from the same seed on one thread (the same run,
bit for bit), saving f32 once and bf16 once. The bf16 file must hold every
parameter as BF16 equal to the f32 file's value rounded to nearest even by
this script's own rounding, and anything else (optimizer state, step
counts) byte for byte as the f32 file does. Then the bf16 file is loaded:
saved again as f32 it gives the rounded values exactly (loading widens
bf16 exactly), and training or sampling runs from it. Bad values of the
options exit 2 with a message."""
import json
import os
import struct
import subprocess
import sys
import tempfile
from array import array

SEQ2SEQ = os.environ['QKV_SEQ2SEQ']
GPT = os.environ['QKV_GPT']
CLASSIFY = os.environ['QKV_CLASSIFY']
failures = []


def run(cmd, expect=0):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if p.returncode != expect:
        failures.append(f'{cmd}: exit {p.returncode}, expected {expect}\n{p.stdout}{p.stderr}')
    return p


def read_safetensors(path):
    """name -> (dtype, raw bytes); the file's own layout, parsed here."""
    with open(path, 'rb') as f:
        data = f.read()
    (n,) = struct.unpack('<Q', data[:8])
    header = json.loads(data[8:8 + n])
    header.pop('__metadata__', None)
    body = data[8 + n:]
    return {k: (v['dtype'], body[v['data_offsets'][0]:v['data_offsets'][1]])
            for k, v in header.items()}


def bf16_rne(bits):
    """float32 bits -> bfloat16 bits, to nearest with ties to even; a NaN
    stays a NaN of its sign, made quiet (qkv-checkpoint.h)."""
    if bits & 0x7f800000 == 0x7f800000 and bits & 0x7fffff:
        return (bits >> 16) | 0x40
    return ((bits + 0x7fff + ((bits >> 16) & 1)) >> 16) & 0xffff


def u32(raw):
    a = array('I')
    a.frombytes(raw)
    return a


def u16(raw):
    a = array('H')
    a.frombytes(raw)
    return a


def check_files(name, f32_path, bf16_path, again_path):
    f32, bf16 = read_safetensors(f32_path), read_safetensors(bf16_path)
    again = read_safetensors(again_path) if again_path else None
    if set(f32) != set(bf16) or (again is not None and set(f32) != set(again)):
        failures.append(f'{name}: the files hold different tensors')
        return
    n_params = n_ties_up = 0
    for k, (dtype, raw) in f32.items():
        bdtype, braw = bf16[k]
        if dtype != 'F32' or k.startswith('__optim__.'):
            if (bdtype, braw) != (dtype, raw):
                failures.append(f'{name}: {k} ({dtype}) differs in the bf16 file ({bdtype})')
            continue
        n_params += 1
        if bdtype != 'BF16':
            failures.append(f'{name}: parameter {k} saved as {bdtype}, not BF16')
            continue
        want = array('H', (bf16_rne(b) for b in u32(raw)))
        got = u16(braw)
        if want != got:
            i = next(i for i in range(len(want)) if want[i] != got[i])
            failures.append(f'{name}: {k}[{i}] is 0x{got[i]:04x} in the bf16 file, '
                            f'0x{want[i]:04x} is {u32(raw)[i]:#010x} rounded')
        # a rounding that truncated would agree wherever no value rounds up
        n_ties_up += sum(1 for b in u32(raw) if (b & 0xffff) > 0x8000)
        if again is None:
            continue
        adtype, araw = again[k]
        widened = array('I', (h << 16 for h in got))
        if adtype != 'F32' or u32(araw) != widened:
            failures.append(f'{name}: {k} loaded from the bf16 file and saved as f32 is not '
                            'the bf16 values widened')
    if n_params == 0 or n_ties_up == 0:
        failures.append(f'{name}: {n_params} parameters, {n_ties_up} values that round up: '
                        'nothing tested')
    if os.path.getsize(bf16_path) >= os.path.getsize(f32_path):
        failures.append(f'{name}: the bf16 file is not smaller')
    print(f'{name}: {n_params} parameters rounded as expected')


with tempfile.TemporaryDirectory() as tmp:
    def path(name):
        return os.path.join(tmp, name)

    # qkv-seq2seq: --resume of the bf16 file with training already done
    # (--epochs 2) saves what it loaded; with --epochs 3 it trains on
    tiny = [SEQ2SEQ, '--task', 'reverse', '--reverse-size', '20', '--reverse-vocab', '10',
            '--num-steps', '6', '--hidden', '8', '--ffn', '8', '--heads', '2', '--layers', '1',
            '--batch-size', '4', '-q', '--threads', '1', '--seed', '3', '--heldout', '0']
    run(tiny + ['--epochs', '2', '--save', path('s32')])
    run(tiny + ['--epochs', '2', '--save', path('s16'), '--save-dtype', 'bf16'])
    run(tiny + ['--epochs', '2', '--resume', path('s16'), '--save', path('s16again')])
    check_files('qkv-seq2seq', path('s32'), path('s16'), path('s16again'))
    p = run(tiny + ['--epochs', '3', '--resume', path('s16')])
    if 'loss' not in p.stdout:
        failures.append(f'qkv-seq2seq: no training from the bf16 file:\n{p.stdout}')
    for bad, needle in [(['--save-dtype', 'f16', '--save', path('x')], '--save-dtype'),
                        (['--save-dtype', 'bf16'], '--save-dtype')]:
        p = run(tiny + bad, expect=2)
        if needle not in p.stderr:
            failures.append(f'qkv-seq2seq {bad}: {p.stderr}')

    # qkv-gpt: --load, then --steps 0 saves what it loaded and samples
    tiny = [GPT, '--max-lines', '3000', '--d-model', '16', '--layers', '1', '--heads', '2',
            '--block', '16', '--batch', '4', '--warmup', '2', '--eval-every', '3', '--steps', '6',
            '--threads', '1', '--length', '20']
    run(tiny + ['--save', path('g32')])
    run(tiny + ['--save', path('g16'), '--save-dtype', 'bf16'])
    p = run([GPT, '--load', path('g16'), '--steps', '0', '--save', path('g16again'),
             '--prompt', 'I ', '--length', '30'])
    if '--- sample' not in p.stdout:
        failures.append(f'qkv-gpt: no sample from the bf16 file:\n{p.stdout}')
    check_files('qkv-gpt', path('g32'), path('g16'), path('g16again'))
    # --precision bf16 trains and samples (its numbers: tests/test-bf16.c)
    p = run(tiny + ['--precision', 'bf16'])
    if 'val loss' not in p.stdout or '--- sample' not in p.stdout:
        failures.append(f'qkv-gpt --precision bf16:\n{p.stdout}')
    for bad in [['--precision', 'fp16'], ['--save-dtype', 'x', '--save', path('x')],
                ['--save-dtype', 'bf16']]:
        p = run(tiny + bad, expect=2)
        if 'qkv-gpt:' not in p.stderr:
            failures.append(f'qkv-gpt {bad}: no message')

    # qkv-classify: saves the attention model and loads it back itself
    tiny = [CLASSIFY, '--max-sentences', '2000', '--epochs', '1', '--threads', '1', '--quiet']
    run(tiny + ['--save', path('c32')])
    p = run(tiny + ['--save', path('c16'), '--save-dtype', 'bf16'])
    if 'loaded from the bf16 checkpoint' not in p.stdout:
        failures.append(f'qkv-classify: no accuracy from the bf16 file:\n{p.stdout}')
    # qkv-classify loads the file into a fresh store and scores it (above);
    # it has no option that would save what it loaded
    check_files('qkv-classify', path('c32'), path('c16'), None)
    p = run(tiny + ['--save-dtype', 'f16'], expect=2)
    if '--save-dtype' not in p.stderr:
        failures.append(f'qkv-classify --save-dtype f16: {p.stderr}')

for f in failures:
    print('FAIL:', f)
print('ok' if not failures else f'{len(failures)} failures')
sys.exit(1 if failures else 0)
