#!/usr/bin/python3
"""The main job on an idle machine and beside a CPU hog on every core.

    /usr/bin/python3 bench/busy.py [--epochs 10] [--reps 3] [--build build]
        [--variants "default=;t1=--threads 1"] [--out bench/logs/busy.json]

For each machine state (idle, then one `sh -c 'while :; do :; done'` per
core) it runs qkv-seq2seq for --epochs epochs in each variant, alternating
the variants, --reps times, and prints the median wall time of each, and
each busy median over the idle median of the same variant. Fair sharing of
a core with one hog alone costs 1.5-2x; more than that is time lost waiting.
Run nothing else meanwhile.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_variants(text):
    out = []
    for item in text.split(";"):
        name, _, opts = item.partition("=")
        out.append((name.strip(), opts.split()))
    return out


def run(exe, epochs, opts):
    t0 = time.monotonic()
    p = subprocess.run([exe, "-q", "--epochs", str(epochs)] + opts, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        sys.exit(f"qkv-seq2seq {' '.join(opts)} failed ({p.returncode}):\n{p.stderr}")
    return wall


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--variants", default="default=;threads 1=--threads 1")
    ap.add_argument("--hogs", type=int, default=os.cpu_count())
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "logs", "busy.json"))
    args = ap.parse_args()
    exe = os.path.join(args.build, "examples", "qkv-seq2seq")
    variants = parse_variants(args.variants)
    results = {}
    for state in ("idle", "hog"):
        hogs = []
        if state == "hog":
            hogs = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(args.hogs)]
            time.sleep(1)
        try:
            times = {name: [] for name, _ in variants}
            for rep in range(args.reps):
                for name, opts in variants:
                    w = run(exe, args.epochs, opts)
                    times[name].append(w)
                    print(f"{state:4s} {name:10s} rep {rep}: {w:.2f} s", flush=True)
            results[state] = times
        finally:
            for h in hogs:
                h.kill()
                h.wait()
    print()
    print(f"main job, {args.epochs} epochs, median of {args.reps} (wall s):")
    print("| variant | idle | with a hog per core | hog / idle |")
    print("|---|---|---|---|")
    summary = {}
    for name, _ in variants:
        idle = statistics.median(results["idle"][name])
        hog = statistics.median(results["hog"][name])
        summary[name] = {"idle_s": idle, "hog_s": hog, "ratio": hog / idle}
        print(f"| {name} | {idle:.2f} | {hog:.2f} | {hog / idle:.2f} |")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"epochs": args.epochs, "runs": results, "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()
