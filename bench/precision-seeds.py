#!/usr/bin/python3
"""Training quality in bf16 against fp32 over seeds (issue 27, item 3).

Two experiments, each seed run once per precision, one process at a time
(fp32 then bf16 for a seed, then the next seed), under `nice -n 15`: the
losses do not depend on the machine's load, only the wall times do.

  main   the main job, `qkv-seq2seq --seed S --threads 1 --precision P
         --log FILE`: the last epoch's training loss (from the log, 7
         digits; the printed one has 3), the sentences of the four at BLEU
         1.000, and the held-out corpus BLEU-4, greedy and beam 4;
  M      `qkv-bench-transformer --config M --threads 1 --seed S
         --steps K --warmup 0 --precision P`: the loss after K steps
         (final_loss) and the mean of the last ten (mean_loss_last10).

Then per experiment and metric: mean, sample standard deviation, min and
max per precision, the difference of the means (bf16 - fp32), and that
difference over fp32's seed spread (its standard deviation).

    /usr/bin/python3 bench/precision-seeds.py [--main-seeds 0-9]
        [--m-seeds 0-4] [--m-steps 100] [--build build]
        [--out bench/logs/precision-seeds.json]

Each run's stdout goes beside --out (DIR/precision-seeds/<exp>-<prec>-<seed>.txt).
--summarize FILE prints the tables again from a kept JSON.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
LOSS = re.compile(r"^loss ([0-9.naif+-]+),", re.M)
BLEU = re.compile(r"^(.*?) => (.*?),\s+bleu ([0-9.]+)$", re.M)
HELDOUT = re.compile(r"^held-out BLEU-4 .*: greedy ([0-9.]+), beam \d+ ([0-9.]+)", re.M)
PRECISIONS = ("fp32", "bf16")


def parse_seeds(text):
    seeds = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        seeds.extend(range(int(lo), int(hi or lo) + 1))
    return seeds


def run(cmd, log):
    t0 = time.time()
    p = subprocess.run(["nice", "-n", "15"] + cmd, capture_output=True, text=True)
    wall = round(time.time() - t0, 1)
    with open(log, "w") as f:
        f.write(" ".join(cmd) + "\n" + p.stdout + p.stderr)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p.stdout, wall


def main_job(build, seed, prec, logdir):
    # the per-step log is 200 kB a run: kept out of the logs directory
    log = os.path.join(tempfile.gettempdir(), f"precision-seeds-main-{prec}-{seed}.jsonl")
    cmd = [os.path.join(build, "examples", "qkv-seq2seq"), "--seed", str(seed), "--threads", "1",
           "--precision", prec, "--log", log]
    out, wall = run(cmd, os.path.join(logdir, f"main-{prec}-{seed}.txt"))
    with open(log) as f:
        epochs = [r for r in map(json.loads, f) if r.get("event") == "epoch"]
    losses, bleus = LOSS.findall(out), BLEU.findall(out)
    held = HELDOUT.search(out)
    if not epochs or not losses or len(bleus) < 4 or not held:
        sys.exit(f"cannot read the results of {' '.join(cmd)}:\n{out}")
    return {"loss": epochs[-1]["loss"],
            "perfect": sum(1 for _, _, b in bleus[:4] if float(b) == 1.0),
            "heldout_greedy": float(held.group(1)), "heldout_beam4": float(held.group(2)),
            "wall_s": wall}


def config_m(build, seed, prec, steps, logdir):
    cmd = [os.path.join(build, "bench", "qkv-bench-transformer"), "--config", "M", "--threads", "1",
           "--seed", str(seed), "--steps", str(steps), "--warmup", "0", "--precision", prec]
    out, wall = run(cmd, os.path.join(logdir, f"M-{prec}-{seed}.txt"))
    j = json.loads(out.strip().splitlines()[-1])
    return {"final_loss": j["final_loss"], "mean_loss_last10": j["mean_loss_last10"],
            "wall_s": wall}


def stats(xs):
    return {"mean": statistics.mean(xs), "std": statistics.stdev(xs) if len(xs) > 1 else 0.0,
            "min": min(xs), "max": max(xs)}


def summarize(results):
    for exp, runs in results["runs"].items():
        if not runs:
            continue
        metrics = [k for k in next(iter(runs.values()))["fp32"] if k != "wall_s"]
        seeds = sorted(runs, key=int)
        print(f"\n{exp}: per seed (fp32 / bf16)")
        print("| seed | " + " | ".join(metrics) + " |")
        for s in seeds:
            cells = [f"{runs[s]['fp32'][m]:.4g} / {runs[s]['bf16'][m]:.4g}" for m in metrics]
            print(f"| {s} | " + " | ".join(cells) + " |")
        print("| metric | fp32 mean ± std (min–max) | bf16 mean ± std (min–max) | "
              "bf16 − fp32 (means) | ÷ fp32 std | per-seed bf16 − fp32, mean ± std |")
        for m in metrics:
            a = stats([runs[s]["fp32"][m] for s in seeds])
            b = stats([runs[s]["bf16"][m] for s in seeds])
            paired = stats([runs[s]["bf16"][m] - runs[s]["fp32"][m] for s in seeds])
            d = b["mean"] - a["mean"]
            ratio = d / a["std"] if a["std"] > 0 else float("nan")
            print(f"| {m} | {a['mean']:.4g} ± {a['std']:.2g} ({a['min']:.4g}–{a['max']:.4g}) | "
                  f"{b['mean']:.4g} ± {b['std']:.2g} ({b['min']:.4g}–{b['max']:.4g}) | "
                  f"{d:+.3g} | {ratio:+.2f} | {paired['mean']:+.3g} ± {paired['std']:.2g} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--main-seeds", default="0-9")
    ap.add_argument("--m-seeds", default="0-4")
    ap.add_argument("--m-steps", type=int, default=100)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default=os.path.join(HERE, "logs", "precision-seeds.json"))
    ap.add_argument("--summarize", metavar="FILE")
    a = ap.parse_args()
    if a.summarize:
        with open(a.summarize) as f:
            summarize(json.load(f))
        return
    logdir = os.path.join(os.path.dirname(os.path.abspath(a.out)), "precision-seeds")
    os.makedirs(logdir, exist_ok=True)
    results = {"m_steps": a.m_steps, "runs": {"main": {}, "M": {}}}

    def save():
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)

    for seed in parse_seeds(a.main_seeds) if a.main_seeds else []:
        results["runs"]["main"][str(seed)] = {
            p: main_job(a.build, seed, p, logdir) for p in PRECISIONS}
        print(f"main seed {seed}: {results['runs']['main'][str(seed)]}", flush=True)
        save()
    for seed in parse_seeds(a.m_seeds) if a.m_seeds else []:
        results["runs"]["M"][str(seed)] = {
            p: config_m(a.build, seed, p, a.m_steps, logdir) for p in PRECISIONS}
        print(f"M seed {seed}: {results['runs']['M'][str(seed)]}", flush=True)
        save()
    summarize(results)


if __name__ == "__main__":
    main()
