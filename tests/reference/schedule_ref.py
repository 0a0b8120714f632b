#!/usr/bin/python3
"""Reference learning rates for qkv_schedule_new_warmup_decay()
(tests/test-schedule.c): Hugging Face transformers' warm-up schedules as
torch.optim.lr_scheduler.LambdaLR runs them.

The three lambdas restate transformers' get_cosine_schedule_with_warmup,
get_linear_schedule_with_warmup and get_constant_schedule_with_warmup (the
package itself is not needed), with a floor as its
get_cosine_with_min_lr_schedule_with_warmup has one: the decaying factor f
becomes f·(1 - r) + r with r = min_lr / peak_lr. LambdaLR's lr for update
number k (counted from 1) is peak_lr · lambda(k - 1).

Each line: KIND WARMUP TOTAL PEAK MIN STEP LR, the doubles written with repr()
so that they read back exactly. Steps run from 1 to TOTAL + 1, the first
update past the decay (transformers' cosine rises again after that, where qkv
holds min_lr).

Run: /usr/bin/python3 tests/reference/schedule_ref.py > tests/data/schedule_ref.txt
"""
import math
import sys

import torch


def warmup_factor(t, warmup):
    return float(t) / float(max(1, warmup))


def cosine(warmup, total, rate):
    def f(t):
        if t < warmup:
            return warmup_factor(t, warmup)
        progress = float(t - warmup) / float(max(1, total - warmup))
        factor = 0.5 * (1.0 + math.cos(math.pi * float(0.5) * 2.0 * progress))
        return max(0.0, factor * (1 - rate) + rate)
    return f


def linear(warmup, total, rate):
    def f(t):
        if t < warmup:
            return warmup_factor(t, warmup)
        factor = max(0.0, float(total - t) / float(max(1, total - warmup)))
        return factor * (1 - rate) + rate
    return f


def constant(warmup, total, rate):
    def f(t):
        if t < warmup:
            return warmup_factor(t, warmup)
        return 1.0
    return f


LAMBDAS = {"cosine": cosine, "linear": linear, "constant": constant}

# (kind, warmup_steps, total_steps, peak_lr, min_lr)
CASES = [
    ("cosine", 10, 100, 1e-3, 0.0),
    ("cosine", 5, 50, 3e-4, 3e-5),
    ("cosine", 0, 20, 0.1, 0.01),
    ("cosine", 7, 8, 6e-4, 6e-5),
    ("linear", 10, 100, 1e-3, 0.0),
    ("linear", 3, 17, 0.05, 0.005),
    ("linear", 0, 20, 0.1, 0.0),
    ("constant", 10, 100, 1e-3, 0.0),
    ("constant", 0, 5, 0.02, 0.0),
]


def main():
    out = sys.stdout
    out.write("# torch %s, written by tests/reference/schedule_ref.py\n" % torch.__version__)
    for kind, warmup, total, peak, floor in CASES:
        param = torch.zeros(1, requires_grad=True)
        opt = torch.optim.SGD([param], lr=peak)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, LAMBDAS[kind](warmup, total, floor / peak))
        for step in range(1, total + 2):
            lr = opt.param_groups[0]["lr"]
            out.write("%s %d %d %r %r %d %r\n" % (kind, warmup, total, peak, floor, step, lr))
            opt.step()
            sched.step()


if __name__ == "__main__":
    main()
