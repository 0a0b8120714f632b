#!/usr/bin/python3
"""The main job over many seeds, for qkv and for the book's PyTorch script.

The book's experiment (600 pairs, 200 epochs, 4 test sentences) is chaotic:
a different rounding order gives a different trajectory after a few epochs,
so one run says little. This runs the default experiment for each seed and
prints, per seed, the final loss and how many of the four sentences reach
BLEU 1.000, then the mean and range of both, for qkv and for PyTorch.

    /usr/bin/python3 bench/seeds.py [--seeds 0-9] [--which qkv,torch]
        [--build build] [--out bench/logs/seeds.json] [-- extra qkv options]

Runs alternate qkv and PyTorch seed by seed, one at a time. --which
torch-true trains the same PyTorch model and translates with every token at
its true position, as qkv does, instead of the book's position 0 for every
new token (bench/d2l-decode-positions.py).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
D2L = os.path.join(ROOT, "..", "shared", "reference", "d2l", "d2l017.py")

LOSS = re.compile(r"^loss ([0-9.naif+-]+),", re.M)
BLEU = re.compile(r"^(.*?) => (.*?),\s+bleu ([0-9.]+)$", re.M)


def parse_seeds(text):
    seeds = []
    for part in text.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            seeds.extend(range(int(lo), int(hi) + 1))
        else:
            seeds.append(int(part))
    return seeds


def run_one(cmd, env=None, block=None):
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.time() - t0
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    losses = LOSS.findall(p.stdout)
    text = p.stdout
    if block is not None:  # only the translations under "# decode BLOCK"
        text = text.split(f"# decode {block}\n", 1)[1].split("# decode", 1)[0]
    bleus = BLEU.findall(text)
    if not losses or len(bleus) != 4:
        sys.exit(f"cannot read the results of {' '.join(cmd)}:\n{p.stdout}")
    return {
        "loss": float(losses[-1]),
        "perfect": sum(1 for _, _, b in bleus if float(b) == 1.0),
        "translations": [[src, out, float(b)] for src, out, b in bleus],
        "wall_s": round(wall, 2),
    }


def summary(name, runs):
    loss = [r["loss"] for r in runs.values()]
    perfect = [r["perfect"] for r in runs.values()]
    return (f"{name}: loss mean {statistics.mean(loss):.4f} range {min(loss):.3f}-{max(loss):.3f}; "
            f"sentences at BLEU 1.000 mean {statistics.mean(perfect):.2f} "
            f"range {min(perfect)}-{max(perfect)} of 4 over {len(runs)} seeds")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="0-9")
    ap.add_argument("--which", default="qkv,torch")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default=os.path.join(HERE, "logs", "seeds.json"))
    ap.add_argument("extra", nargs="*", help="extra options for qkv-seq2seq")
    args = ap.parse_args()
    which = args.which.split(",")
    exe = os.path.join(args.build, "examples", "qkv-seq2seq")
    results = {w: {} for w in which}
    for seed in parse_seeds(args.seeds):
        for w in which:
            if w == "qkv":
                r = run_one([exe, "-q", "--seed", str(seed)] + args.extra)
            elif w == "torch":
                r = run_one(["/usr/bin/python3", D2L, "transformer", str(seed)])
            elif w == "torch-true":
                r = run_one(["/usr/bin/python3", os.path.join(HERE, "d2l-decode-positions.py"),
                             str(seed)], block="true")
            else:
                sys.exit(f"unknown --which entry '{w}' (qkv, torch or torch-true)")
            results[w][seed] = r
            print(f"{w:5s} seed {seed}: loss {r['loss']:.3f}, {r['perfect']} of 4 at BLEU 1.000 "
                  f"({r['wall_s']:.1f} s)", flush=True)
    print()
    print("| seed | " + " | ".join(f"{w} loss | {w} perfect" for w in which) + " |")
    print("|---|" + "---|---|" * len(which))
    for seed in parse_seeds(args.seeds):
        cells = []
        for w in which:
            r = results[w][seed]
            cells += [f"{r['loss']:.3f}", f"{r['perfect']}/4"]
        print(f"| {seed} | " + " | ".join(cells) + " |")
    print()
    for w in which:
        print(summary(w, results[w]))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
