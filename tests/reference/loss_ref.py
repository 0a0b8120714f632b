#!/usr/bin/python3
"""Reference numbers for the label-smoothed cross-entropy in
tests/test-ops-loss.c, from PyTorch's own float32 CPU kernels
(torch.nn.functional.cross_entropy with label_smoothing=).

For each ε the file holds the loss and d(sum(loss * w))/d logits for
reduction "none" (with ignored tokens, target -100, which qkv treats as any
target outside [0, C): loss 0, gradient 0), "sum" and "mean" (all targets
valid: PyTorch's mean divides by the non-ignored tokens, qkv's by all of
them, so the mean case has none ignored), and a per-token weighted sum
(qkv's weight input; in PyTorch the "none" loss times the weight, summed).

Run from the repository root:
  /usr/bin/python3 tests/reference/loss_ref.py > tests/data/loss_ref.txt
Format (tests/test-util.h, qkv_test_load_reference):
  tensor NAME f32|i32 RANK D0 D1 ...
  v0 v1 ...
"""
import sys

import torch
import torch.nn.functional as F

from reftext import emit

torch.manual_seed(14)
out = sys.stdout


B, T, C = 3, 5, 11
logits = torch.empty(B, T, C).uniform_(-3, 3)
targets = torch.randint(0, C, (B, T))
valid = targets.clone()
targets[0, 4] = -100
targets[2, 1] = -100
targets[2, 4] = -100
w = torch.empty(B, T).uniform_(-1, 1)
weight = torch.empty(B, T).uniform_(0, 2)
emit('logits', logits)
emit('targets', targets)
emit('valid', valid)
emit('w', w)
emit('weight', weight)


def ce(x, t, eps, reduction):
    return F.cross_entropy(x.reshape(-1, C), t.reshape(-1), reduction=reduction,
                           label_smoothing=eps, ignore_index=-100)


for k, eps in enumerate([0.0, 0.1, 0.25, 1.0]):
    cases = {
        'none': (targets, lambda y: (y.reshape(B, T) * w).sum(), 'none'),
        'sum': (targets, lambda y: y, 'sum'),
        'mean': (valid, lambda y: y, 'mean'),
        'wsum': (targets, lambda y: (y.reshape(B, T) * weight).sum(), 'none'),
    }
    for name, (tg, to_scalar, reduction) in cases.items():
        x = logits.clone().requires_grad_(True)
        y = ce(x, tg, eps, reduction)
        s = to_scalar(y)
        s.backward()
        value = y.reshape(B, T) if name == 'none' else s
        emit(f'eps{k}_{name}', value)
        emit(f'eps{k}_{name}_grad', x.grad)
