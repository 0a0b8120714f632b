#!/usr/bin/python3
"""Long sequences, qkv beside PyTorch: one Transformer encoder block (d_model
512, 8 heads, FFN 2048, batch 1, causal, no dropout) trained with Adam
(bench/bench-long.c and bench/torch_long_seq.py), at each T and thread count,
the two alternating (qkv, torch, qkv, torch, ...). Every run is its own
process, so its peak RSS (ru_maxrss) is its own.

    flock /tmp/qkv-cpu.lock /usr/bin/python3 bench/long_seq.py \\
        --T 512 1024 2048 --threads 1 2 --reps 2 --steps 3
    flock /tmp/qkv-cpu.lock /usr/bin/python3 bench/long_seq.py \\
        --T 16384 32768 --threads 2 --impls qkv --steps 1 --warmup 0
    /usr/bin/python3 bench/long_seq.py --attention --T 4096 --threads 1 2

PyTorch runs under an address-space limit (prlimit --as, --mem-limit GiB,
default 14): a run that does not fit stops with an allocation error, which
the table reports, instead of pushing the shared machine into the OOM
killer. --attention times qkv's attention kernels alone against qkv_sgemm
in the same process (qkv-bench-long --attention). Raw JSON lines go to
bench/logs/long-<stamp>/runs.jsonl, the table to stdout.
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if not lines:
        return {"error": "exit %d: %s" % (p.returncode, (p.stderr.strip().splitlines() or ["?"])[-1][:160])}
    return json.loads(lines[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--impls", nargs="+", default=["qkv", "torch"])
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--mem-limit", type=float, default=14.0, help="GiB of address space for PyTorch")
    ap.add_argument("--attention", action="store_true")
    ap.add_argument("--bench", default=os.path.join(ROOT, "build", "bench", "qkv-bench-long"))
    args = ap.parse_args()

    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    logdir = os.path.join(ROOT, "bench", "logs", "long-" + stamp)
    os.makedirs(logdir, exist_ok=True)
    log = open(os.path.join(logdir, "runs.jsonl"), "w")
    results = {}
    for T in args.T:
        for nt in args.threads:
            for rep in range(args.reps):
                impls = ["attention"] if args.attention else args.impls
                for impl in impls:
                    common = ["--T", str(T), "--threads", str(nt), "--steps", str(args.steps),
                              "--warmup", str(args.warmup)]
                    if impl == "torch":
                        limit = int(args.mem_limit * (1 << 30))
                        cmd = ["prlimit", "--as=%d" % limit, "/usr/bin/python3",
                               os.path.join(ROOT, "bench", "torch_long_seq.py")] + common
                        env = dict(os.environ, OMP_NUM_THREADS=str(nt))
                    else:
                        cmd = [args.bench] + common + (["--attention"] if impl == "attention" else [])
                        env = None
                    r = run(cmd, env)
                    r.setdefault("impl", impl)
                    r.update({"T": T, "threads": nt, "rep": rep})
                    if impl == "torch" and "error" in r:
                        r["error"] += " (address space limited to %g GiB)" % args.mem_limit
                    print(json.dumps(r), file=sys.stderr, flush=True)
                    log.write(json.dumps(r) + "\n")
                    log.flush()
                    results.setdefault((impl, T, nt), []).append(r)

    if args.attention:
        print("| T | threads | attention fwd+bwd s | attention GFLOP/s | qkv_sgemm GFLOP/s | ratio |")
        print("|---|---|---|---|---|---|")
        for (impl, T, nt), rs in sorted(results.items(), key=lambda x: (x[0][1], x[0][2])):
            ok = [r for r in rs if "error" not in r]
            if not ok:
                print("| %d | %d | %s | | | |" % (T, nt, rs[0]["error"]))
                continue
            med = lambda k: statistics.median(r[k] for r in ok)
            print("| %d | %d | %.3f | %.1f | %.1f | %.2f |" % (
                T, nt, med("s_fwd_bwd"), med("attention_gflops"), med("sgemm_gflops"), med("ratio")))
        return

    print("| T | threads | qkv s/step | torch s/step | time ratio | qkv peak RSS MiB | torch peak RSS MiB | RSS ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for T in args.T:
        for nt in args.threads:
            cells = {}
            for impl in args.impls:
                rs = results.get((impl, T, nt), [])
                ok = [r for r in rs if "error" not in r]
                if ok:
                    cells[impl] = (statistics.median(r["s_per_step"] for r in ok),
                                   max(r["peak_rss_mib"] for r in ok))
                elif rs:
                    cells[impl] = rs[0]["error"]
            def fmt(impl, i):
                c = cells.get(impl)
                if c is None:
                    return "–"
                if isinstance(c, str):
                    return c if i == 0 else "–"
                return "%.3f" % c[0] if i == 0 else "%.0f" % c[1]
            q, t = cells.get("qkv"), cells.get("torch")
            both = isinstance(q, tuple) and isinstance(t, tuple)
            print("| %d | %d | %s | %s | %s | %s | %s | %s |" % (
                T, nt, fmt("qkv", 0), fmt("torch", 0), "%.2f" % (q[0] / t[0]) if both else "–",
                fmt("qkv", 1), fmt("torch", 1), "%.3f" % (q[1] / t[1]) if both else "–"))
    print("\nlogs: %s" % os.path.relpath(logdir, ROOT))


if __name__ == "__main__":
    main()
