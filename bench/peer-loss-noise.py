#!/usr/bin/python3
"""How far apart two correct float32 trainings of config S drift: the yardstick
for comparing qkv's per-step losses with PyTorch's (tests/test-peer.c).

Runs the PyTorch peer (bench/peers/torch_transformer.py's model, data, loss,
clipping and Adam) for 200 steps of config S with dropout 0 from the dumped
initial weights (ref_S_seed0/init), three ways:
  f32            as the peer does (must equal run_dropout0_200steps.json)
  f32 + 1 ulp    every initial weight multiplied by 1 ± 2^-23 (random sign)
  f64            the same computation in double precision
then prints the largest relative per-step difference, per range of steps,
of qkv against PyTorch f32 and of those variants against each other.

    ./build-bench/bench/qkv-bench-transformer --config S --dropout 0 --steps 200 \\
        --warmup 0 --losses --init /work/shared/bench/peers/ref_S_seed0/init > qkv_S_ref.json
    /usr/bin/python3 bench/peer-loss-noise.py qkv_S_ref.json [out.json]
"""
import json
import os
import sys

PEERS = "/work/shared/bench/peers"
REF = os.path.join(PEERS, "ref_S_seed0")
os.environ["OMP_NUM_THREADS"] = "1"
os.environ["OPENBLAS_NUM_THREADS"] = "1"
sys.path.insert(0, PEERS)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch_transformer as tt  # noqa: E402

RANGES = [(0, 1), (1, 10), (10, 50), (50, 100), (100, 200)]


def train(dtype, perturb, steps=200):
    torch.set_num_threads(1)
    cfg = dict(tt.CONFIGS["S"])
    net = tt.build_model(cfg, 0.0)
    with open(os.path.join(REF, "init", "manifest.json")) as fh:
        manifest = json.load(fh)
    state = net.state_dict()
    rng = np.random.default_rng(1)
    for item in manifest:
        a = np.fromfile(os.path.join(REF, "init", item["file"]), dtype="<f4").reshape(item["shape"])
        if perturb:
            sign = rng.choice([-1, 1], size=a.shape).astype(np.float32)
            a = a * (1 + sign * np.float32(2.0 ** -23))
        state[item["key"]].copy_(torch.from_numpy(a))
    net = net.to(dtype)
    for mod in net.modules():
        if isinstance(mod, tt.PositionalEncoding):
            mod.P = mod.P.to(dtype)
    opt = torch.optim.Adam(net.parameters(), lr=cfg["lr"])
    loss = tt.MaskedSoftmaxCELoss()
    net.train()
    data = tt.SplitMix64(0)
    out = []
    for _ in range(steps):
        lsum, ntok = tt.train_step(net, opt, loss, tt.gen_batch(data, 64, 10, 200))
        out.append(lsum / ntok)
    return out


def worst(a, b):
    return ["%.2e" % max(abs(x - y) / abs(y) for x, y in zip(a[lo:hi], b[lo:hi]))
            for lo, hi in RANGES]


def main():
    with open(sys.argv[1]) as fh:
        qkv = json.load(fh)["losses"]
    with open(os.path.join(REF, "run_dropout0_200steps.json")) as fh:
        ref = json.load(fh)["losses"]
    runs = {"f32": train(torch.float32, False), "f32_1ulp": train(torch.float32, True),
            "f64": train(torch.float64, False)}
    same = max(abs(x - y) for x, y in zip(runs["f32"], ref))
    print("PyTorch f32 rerun against run_dropout0_200steps.json: max abs difference %g" % same)
    print("largest relative difference per step, steps %s" % ", ".join(
        "%d-%d" % (lo + 1, hi) for lo, hi in RANGES))
    rows = [("qkv vs PyTorch f32", qkv, ref),
            ("PyTorch f32 (init +-1 ulp) vs PyTorch f32", runs["f32_1ulp"], ref),
            ("PyTorch f32 vs PyTorch f64", ref, runs["f64"]),
            ("qkv vs PyTorch f64", qkv, runs["f64"])]
    for name, a, b in rows:
        print("  %-42s %s" % (name, "  ".join(worst(a, b))))
    if len(sys.argv) > 2:
        with open(sys.argv[2], "w") as fh:
            json.dump(dict(qkv=qkv, torch_f32=ref, **runs), fh)
            fh.write("\n")


if __name__ == "__main__":
    main()
