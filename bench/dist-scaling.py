#!/usr/bin/python3
"""Data-parallel scaling on a bench config (issue 15): the same global batch
trained by 2 processes x 1 thread (mpirun -np 2 ... --distributed), 1 process
x 1 thread and 1 process x 2 threads, alternating, REPS times.

    flock /tmp/qkv-cpu.lock /usr/bin/python3 bench/dist-scaling.py [--reps 5] [--config M]

Every JSON line goes to bench/logs/dist-<stamp>/; the table (medians over the
repetitions of each run's median step) to stdout and table.md there.
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETTINGS = {"S": (300, 30), "M": (30, 5), "L": (8, 2)}  # as bench/compare.py


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--config", default="M")
    p.add_argument("--bench", default=os.path.join(ROOT, "build-bench/bench/qkv-bench-transformer"))
    p.add_argument("--mpirun", default="mpirun")
    a = p.parse_args()
    steps, warmup = SETTINGS[a.config]
    base = [a.bench, "--config", a.config, "--steps", str(steps), "--warmup", str(warmup)]
    runs = {
        "2 procs x 1 thread": [a.mpirun, "-np", "2", "--bind-to", "core", *base, "--threads", "1",
                               "--distributed"],
        "1 proc x 1 thread": [*base, "--threads", "1"],
        "1 proc x 2 threads": [*base, "--threads", "2"],
    }
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    logdir = os.path.join(ROOT, "bench", "logs", f"dist-{stamp}")
    os.makedirs(logdir, exist_ok=True)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl="self,vader")
    results = {name: [] for name in runs}
    for rep in range(a.reps):
        for name, cmd in runs.items():
            out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout
            d = json.loads(out.strip().splitlines()[-1])
            results[name].append(d)
            slug = name.replace(" ", "").replace("x", "_")
            with open(os.path.join(logdir, f"{slug}_r{rep}.json"), "w") as f:
                f.write(json.dumps(d) + "\n")
            print(f"rep {rep} {name}: {d['median_step_s']:.4f} s/step", flush=True)

    def med(name, key):
        vals = [d[key] for d in results[name] if d.get(key) is not None]
        return statistics.median(vals) if vals else float("nan")

    one = med("1 proc x 1 thread", "median_step_s")
    lines = [f"config {a.config}, global batch {results['1 proc x 1 thread'][0]['batch']}, "
             f"{steps} timed steps after {warmup}, {a.reps} repetitions alternating; "
             "medians over repetitions of each run's median",
             "",
             "| run | s/step | speed-up over 1 x 1 | all-reduce s/step (share) | transfer s/step (share) | bytes all-reduced/step | per-step range over reps |",
             "|---|---|---|---|---|---|---|"]
    for name in runs:
        s = med(name, "median_step_s")
        steps_all = [d["median_step_s"] for d in results[name]]
        if "median_allreduce_s" in results[name][0]:
            ar = med(name, "median_allreduce_s")
            tr = med(name, "median_transfer_s")
            comm = f"{ar:.4f} ({ar / s:.1%})"
            transfer = f"{tr:.4f} ({tr / s:.1%})"
            nbytes = f"{results[name][0]['bytes_allreduced_per_step']:,}"
        else:
            comm = transfer = nbytes = "–"
        lines.append(f"| {name} | {s:.4f} | {one / s:.2f}x | {comm} | {transfer} | {nbytes} | "
                     f"{min(steps_all):.4f}–{max(steps_all):.4f} |")
    table = "\n".join(lines)
    print(table)
    with open(os.path.join(logdir, "table.md"), "w") as f:
        f.write(table + "\n")


if __name__ == "__main__":
    main()
