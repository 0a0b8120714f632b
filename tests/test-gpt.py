#!/usr/bin/env python3
"""qkv-gpt end to end, tiny: train a few steps and save; sample from the
checkpoint in fresh processes (the same seed gives the same text at 1 and 2
threads, another seed other text); bad option values exit with status 2."""
import os
import subprocess
import sys
import tempfile

GPT = os.environ['QKV_GPT']
TINY = ['--max-lines', '3000', '--d-model', '16', '--layers', '1', '--heads', '2',
        '--block', '16', '--batch', '4', '--warmup', '2', '--eval-every', '3']
failures = []


def run(args, expect=0):
    p = subprocess.run([GPT] + args, capture_output=True, text=True, timeout=60)
    if p.returncode != expect:
        failures.append(f'{args}: exit {p.returncode}, expected {expect}\n{p.stdout}{p.stderr}')
    return p


def sample_of(p):
    return p.stdout.split(') ---\n', 1)[1] if ') ---\n' in p.stdout else ''


with tempfile.TemporaryDirectory() as tmp:
    model = os.path.join(tmp, 'gpt.safetensors')
    p = run(TINY + ['--steps', '6', '--threads', '2', '--save', model, '--length', '20'])
    if 'val loss' not in p.stdout or not os.path.exists(model):
        failures.append(f'training printed no validation loss or saved nothing:\n{p.stdout}')
    texts = {}
    for threads, seed in [('1', '5'), ('2', '5'), ('2', '6')]:
        p = run(['--load', model, '--steps', '0', '--prompt', 'I ', '--length', '60',
                 '--seed', seed, '--threads', threads, '--top-k', '10', '--top-p', '0.9'])
        texts[threads, seed] = sample_of(p)
        if len(texts[threads, seed]) < 60 or not texts[threads, seed].startswith('I '):
            failures.append(f'no sample at {threads} threads, seed {seed}:\n{p.stdout}')
    if texts['1', '5'] != texts['2', '5']:
        failures.append(f'seed 5 differs by thread count: {texts["1", "5"]!r} vs {texts["2", "5"]!r}')
    if texts['2', '5'] == texts['2', '6']:
        failures.append(f'seeds 5 and 6 gave the same text {texts["2", "5"]!r}')
    for bad in [['--top-p', '0'], ['--top-p', '1.5'], ['--temperature', '-1'], ['--steps', '-1'],
                ['--length', '0'], ['--threads', '999'], ['--heads', '3', '--d-model', '16'],
                ['--top-k', 'x'], ['--warmup', '10', '--steps', '5'], ['--steps', '0'], ['stray']]:
        p = run(bad, expect=2)
        if 'qkv-gpt:' not in p.stderr:
            failures.append(f'{bad}: no message')
    p = run(['--load', model, '--steps', '0', '--prompt', '\u4e2d'], expect=2)
    if 'vocabulary' not in p.stderr:
        failures.append(f'a prompt outside the vocabulary: {p.stderr}')
    run(['--load', os.path.join(tmp, 'missing.safetensors'), '--steps', '0'], expect=1)

for f in failures:
    print('FAIL:', f)
print('ok' if not failures else f'{len(failures)} failures')
sys.exit(1 if failures else 0)
