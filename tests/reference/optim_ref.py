#!/usr/bin/python3
"""Reference values for tests/test-optim.c: three steps of SGD (momentum,
weight decay, and a Nesterov variant), Adam (L2 weight decay) and AdamW
(decoupled weight decay) with torch.optim, on fixed gradients; the same three
with parameter groups of their own lr and weight decay.

Each step's gradient is grad = 2·p + c, with p the parameter before the step
and c a fixed tensor, so the C test can form the same gradients in f32.

Run: /usr/bin/python3 tests/reference/optim_ref.py > tests/data/optim_ref.txt
"""
import sys

import torch

SHAPES = {"w": (3, 4), "b": (4,)}


def initial(name, n):
    # the same formulas in tests/test-optim.c (evaluated in double, rounded to f32)
    if name == "w":
        return [0.1 * ((i * 5) % 13) - 0.6 for i in range(n)]
    return [0.25 * ((i * 3) % 7) - 0.7 for i in range(n)]


def offset(name, n):
    if name == "w":
        return [0.05 * ((i * 7) % 11) - 0.25 for i in range(n)]
    return [0.3 - 0.2 * ((i * 2) % 5) for i in range(n)]


CONFIGS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01, foreach=False),
    "nesterov": lambda ps: torch.optim.SGD(
        ps, lr=0.05, momentum=0.8, weight_decay=0.02, nesterov=True, foreach=False),
    "adam": lambda ps: torch.optim.Adam(
        ps, lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1, foreach=False),
    "adamw": lambda ps: torch.optim.AdamW(
        ps, lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1, foreach=False),
}

# Parameter groups (qkv_optimizer_add_group()): per-group lr and weight decay.
# The C test forms each group's lr as the base lr times a factor, as here.
GROUP_CONFIGS = {
    # w in the default group, b in a group with a quarter of the lr, no decay
    "sgd_groups": lambda ps: torch.optim.SGD(
        [{"params": [ps["w"]]},
         {"params": [ps["b"]], "lr": 0.1 * 0.25, "weight_decay": 0.0}],
        lr=0.1, momentum=0.9, weight_decay=0.01, foreach=False),
    "adam_groups": lambda ps: torch.optim.Adam(
        [{"params": [ps["w"]]},
         {"params": [ps["b"]], "lr": 0.01 * 0.5, "weight_decay": 0.0}],
        lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1, foreach=False),
    # two added groups, the default group empty
    "adamw_groups": lambda ps: torch.optim.AdamW(
        [{"params": [ps["w"]], "lr": 0.01 * 2.0, "weight_decay": 0.2},
         {"params": [ps["b"]], "lr": 0.01 * 0.5, "weight_decay": 0.0}],
        lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1, foreach=False),
}


def dump(out, name, t):
    t = t.detach().contiguous().view(-1)
    shape = " ".join(str(d) for d in t.shape)
    out.write("tensor %s f32 1 %s\n" % (name, shape))
    out.write(" ".join("%.9g" % v for v in t.tolist()) + "\n")


def main():
    out = sys.stdout
    out.write("# torch %s, written by tests/reference/optim_ref.py\n" % torch.__version__)
    makers = [(cfg, make, False) for cfg, make in CONFIGS.items()]
    makers += [(cfg, make, True) for cfg, make in GROUP_CONFIGS.items()]
    for cfg, make, by_name in makers:
        params = {}
        consts = {}
        for name, shape in SHAPES.items():
            n = 1
            for d in shape:
                n *= d
            params[name] = torch.tensor(initial(name, n), dtype=torch.float32).view(shape)
            params[name].requires_grad_(True)
            consts[name] = torch.tensor(offset(name, n), dtype=torch.float32).view(shape)
        opt = make(params if by_name else list(params.values()))
        for step in range(1, 4):
            for name, p in params.items():
                p.grad = (2 * p.detach() + consts[name]).clone()
            opt.step()
            for name, p in params.items():
                dump(out, "%s.%s.step%d" % (cfg, name, step), p)
        for name, p in params.items():
            for key, value in opt.state[p].items():
                if torch.is_tensor(value) and value.dim() > 0:
                    dump(out, "%s.%s.%s" % (cfg, name, key), value)


if __name__ == "__main__":
    main()
