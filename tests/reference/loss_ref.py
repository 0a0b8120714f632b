#!/usr/bin/python3
"""Reference numbers for the label-smoothed cross-entropy in
tests/test-ops-loss.c, from PyTorch's own float32 CPU kernels
(torch.nn.functional.cross_entropy with label_smoothing=).

For each ε the file holds the loss and d(sum(loss * w))/d logits for
reduction "none" (with ignored tokens, target -100: loss 0, gradient 0),
"sum" and "mean" (all targets valid; written before qkv had ignore_index,
when its mean divided by every token), and a per-token weighted sum (qkv's
weight input; in PyTorch the "none" loss times the weight, summed).

Then, appended so that the lines above stay as they were, ignore_index:
"imean" is the mean over the targets not ignored (the default -100), value
and gradient; "cmean" ignores a class that occurs (ignore_index =
ignore_class); "w{none,sum,mean}" weight each token's loss by qkv's
per-token weight and give the gradient with respect to the logits ("_grad")
and to that weight ("_wgrad"); the weighted mean divides by the number of
targets not ignored, as qkv's does.

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


# ---- ignore_index ----------------------------------------------------------

ignore_class = int(valid[1, 2])
emit('ignore_class', torch.tensor(ignore_class))
counted = (targets != -100).sum()


def weighted(x, wt, eps, reduction):
    per = ce(x, targets, eps, 'none').reshape(B, T) * wt
    if reduction == 'none':
        return per, (per * w).sum()
    total = per.sum()
    return (total, total) if reduction == 'sum' else (total / counted, total / counted)


for k, eps in enumerate([0.0, 0.1, 0.25, 1.0]):
    x = logits.clone().requires_grad_(True)
    y = ce(x, targets, eps, 'mean')
    y.backward()
    emit(f'eps{k}_imean', y)
    emit(f'eps{k}_imean_grad', x.grad)

    x = logits.clone().requires_grad_(True)
    y = F.cross_entropy(x.reshape(-1, C), valid.reshape(-1), reduction='mean',
                        label_smoothing=eps, ignore_index=ignore_class)
    y.backward()
    emit(f'eps{k}_cmean', y)
    emit(f'eps{k}_cmean_grad', x.grad)

    for reduction in ['none', 'sum', 'mean']:
        x = logits.clone().requires_grad_(True)
        wt = weight.clone().requires_grad_(True)
        value, s = weighted(x, wt, eps, reduction)
        s.backward()
        emit(f'eps{k}_w{reduction}', value)
        emit(f'eps{k}_w{reduction}_grad', x.grad)
        emit(f'eps{k}_w{reduction}_wgrad', wt.grad)
