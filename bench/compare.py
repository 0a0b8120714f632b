#!/usr/bin/python3
"""qkv against the PyTorch peer, side by side, on the same machine and in the
same session.

    /usr/bin/python3 bench/compare.py                 (from the repository root)
    REPS=3 CONFIGS="M L" THREADS="1 2" /usr/bin/python3 bench/compare.py
    /usr/bin/python3 bench/compare.py --reps 1 --configs S M --threads 1
    /usr/bin/python3 bench/compare.py --summarize bench/logs/<stamp> ...  (table of
                                                  the runs kept there, pooled)
    /usr/bin/python3 bench/compare.py --precisions --configs M --threads 1
                                                 (fp32 against bf16, both sides)

For each repetition and thread count it first measures the ceiling as three
figures (qkv-sgemm-peak): the FMA peak of the cores (a register-only FMA loop
at the widest width), OpenBLAS's cblas_sgemm as PyTorch gets it (OpenBLAS's
own CPU detection) and qkv_sgemm() (qkv's GEMM backend), the last two at every
linear-layer GEMM shape of each config, FLOP-weighted as in one training step;
then it trains each config with qkv
(qkv-bench-transformer) and with PyTorch (bench/peers/torch_transformer.py
--blas openmp), alternating: qkv, torch, qkv, torch, ... Settings are those of
bench/peers/run_bench.sh: S 300 timed steps after 30 warm-up steps, M 30
after 5, L 8 after 2, the configs' own dropout and lr, seed 0.

Every run's JSON line is kept in bench/logs/<stamp>/ (<impl>_<cfg>_t<N>_r<rep>.json,
sgemm_<cfg>_t<N>_r<rep>.json), with fields added: compare_busy_before (the
share of the CPUs busy in the second before it started),
compare_others_cpu_share (the share other processes used while it ran) and,
for qkv, compare_libqkv_sha256 (which build of libqkv ran; the table names
every build it pools). The table goes to stdout and to
bench/logs/<stamp>/table.md.

Columns: s/step = median over repetitions of each run's median step time;
ratio = qkv / torch; RSS = ru_maxrss (torch's includes ~230 MiB of `import
torch`); GFLOP/s = the peer's analytical FLOPs per step / s/step; FMA peak,
OpenBLAS GEMM, qkv GEMM = qkv-sgemm-peak's three figures at the same thread
count in the same session; "qkv of FMA peak" = qkv's GFLOP/s over the FMA
peak (the share of the limit); speed-up = s/step at 1 thread over s/step
at 2 threads; losses = the d2l loss metric of the last step (different
initial weights and dropout streams, so equal only within noise) and the
mean over the last 10 steps.

--precisions: no ceiling; per repetition, configuration and thread count it
runs, alternating, qkv --precision fp32, qkv --precision bf16, PyTorch fp32
and PyTorch --autocast bf16 (impl names qkv, qkvbf16, torch, torchbf16 in the
logs), and prints the table of the four step times and their ratios
(--summarize reads such logs too).

Environment overrides: REPS, CONFIGS, THREADS, QKV_BENCH, QKV_SGEMM, PEER,
SGEMM_SECONDS, QUIET. Only one benchmark process runs at a time, and each
starts only when the CPUs were at most QUIET (default 0.1) busy over the
second before (the machine is shared; it waits up to 15 minutes).
"""
import argparse
import datetime
import glob
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETTINGS = {"S": (300, 30), "M": (30, 5), "L": (8, 2)}  # (steps, warmup), run_bench.sh


def parse_args():
    env = os.environ
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=int(env.get("REPS", "1")))
    p.add_argument("--configs", nargs="+", default=env.get("CONFIGS", "S M L").split())
    p.add_argument("--threads", nargs="+", type=int,
                   default=[int(t) for t in env.get("THREADS", "1 2").split()])
    p.add_argument("--qkv", default=env.get(
        "QKV_BENCH", os.path.join(ROOT, "build-bench/bench/qkv-bench-transformer")))
    p.add_argument("--sgemm", default=env.get(
        "QKV_SGEMM", os.path.join(ROOT, "build-bench/bench/qkv-sgemm-peak")))
    p.add_argument("--peer", default=env.get(
        "PEER", "/work/shared/bench/peers/torch_transformer.py"))
    p.add_argument("--sgemm-seconds", type=float, default=float(env.get("SGEMM_SECONDS", "1")))
    p.add_argument("--logdir", default=os.path.join(ROOT, "bench", "logs"))
    p.add_argument("--quiet", type=float, default=float(env.get("QUIET", "0.1")),
                   help="start each run only once the CPUs are at most this busy "
                        "(fraction over 1 s; waits up to 15 min)")
    p.add_argument("--precisions", action="store_true",
                   help="qkv and PyTorch each in fp32 and bf16 (autocast), no ceiling")
    p.add_argument("--impls", nargs="+", default=["qkv", "qkvbf16", "torch", "torchbf16"],
                   help="with --precisions: which of the four runs (to split a long session "
                        "into shorter ones)")
    p.add_argument("--summarize", nargs="+", default=None, metavar="DIR",
                   help="only print the table of the runs kept in these DIRs, together")
    return p.parse_args()


def cpu_sample():
    """(total, idle) jiffies of the whole machine so far."""
    with open("/proc/stat") as fh:
        v = [int(x) for x in fh.readline().split()[1:]]
    return sum(v), v[3] + v[4]  # idle + iowait


def cpu_busy(seconds=1.0):
    """Fraction of the machine's CPU time spent busy over the next seconds."""
    t0, i0 = cpu_sample()
    time.sleep(seconds)
    t1, i1 = cpu_sample()
    return 1.0 - (i1 - i0) / max(t1 - t0, 1)


def wait_until_quiet(limit, max_wait_s=900):
    """The machine is shared: start a measurement only when nothing else runs."""
    waited = 0
    while True:
        busy = cpu_busy()
        if busy <= limit or waited >= max_wait_s:
            return busy
        if waited == 0:
            print("  waiting: the CPUs are %.0f %% busy" % (100 * busy), file=sys.stderr)
        time.sleep(4)
        waited += 5


def run_json(cmd, out_path, quiet_limit):
    busy = wait_until_quiet(quiet_limit)
    print("$ " + " ".join(cmd) + "    # CPUs %.0f %% busy before" % (100 * busy),
          file=sys.stderr, flush=True)
    ru0, (t0, i0), w0 = resource.getrusage(resource.RUSAGE_CHILDREN), cpu_sample(), time.time()
    res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ru1, (t1, i1), w1 = resource.getrusage(resource.RUSAGE_CHILDREN), cpu_sample(), time.time()
    if res.returncode != 0:
        sys.stderr.write(res.stderr)
        raise SystemExit("failed (%d): %s" % (res.returncode, " ".join(cmd)))
    r = json.loads(res.stdout.strip().splitlines()[-1])
    # CPU time others used while this ran: the machine's busy time minus the
    # benchmark's own, as a share of all CPUs over the run's wall time
    tick = os.sysconf("SC_CLK_TCK")
    busy_s = ((t1 - t0) - (i1 - i0)) / tick
    own_s = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    r["compare_others_cpu_share"] = round(max(busy_s - own_s, 0) / ((w1 - w0) * os.cpu_count()), 4)
    r["compare_busy_before"] = round(busy, 4)
    with open(out_path, "w") as fh:
        fh.write(json.dumps(r) + "\n")
    return r


def libqkv_digest(qkv_exe):
    """The build of libqkv the benchmark loads (the build tree's, by rpath)."""
    lib = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(qkv_exe))),
                       "libqkv.so.0")
    if not os.path.exists(lib):
        return "unknown"
    with open(os.path.realpath(lib), "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()[:12]


def measure(args, outdir):
    first = libqkv_digest(args.qkv)
    for rep in range(1, args.reps + 1):
        for t in args.threads:
            for cfg in args.configs:
                run_json([args.sgemm, "--config", cfg, "--threads", str(t),
                          "--seconds", str(args.sgemm_seconds)],
                         os.path.join(outdir, "sgemm_%s_t%d_r%d.json" % (cfg, t, rep)),
                         args.quiet)
            for cfg in args.configs:
                steps, warmup = SETTINGS[cfg]
                common = ["--config", cfg, "--threads", str(t), "--steps", str(steps),
                          "--warmup", str(warmup)]
                path = os.path.join(outdir, "qkv_%s_t%d_r%d.json" % (cfg, t, rep))
                r = run_json([args.qkv] + common, path, args.quiet)
                # someone may rebuild the tree meanwhile: say which build ran
                r["compare_libqkv_sha256"] = libqkv_digest(args.qkv)
                with open(path, "w") as fh:
                    fh.write(json.dumps(r) + "\n")
                if r["compare_libqkv_sha256"] != first:
                    print("  WARNING: libqkv changed during the session (%s, then %s)" % (
                        first, r["compare_libqkv_sha256"]), file=sys.stderr)
                print("  qkv   %s t%d: %.4g s/step, %.0f MiB, others used %.0f %% of the CPUs" % (
                    cfg, t, r["median_step_s"], r["peak_rss_mib"],
                    100 * r["compare_others_cpu_share"]), file=sys.stderr)
                r = run_json(["/usr/bin/python3", args.peer, "--blas", "openmp"] + common,
                             os.path.join(outdir, "torch_%s_t%d_r%d.json" % (cfg, t, rep)),
                             args.quiet)
                print("  torch %s t%d: %.4g s/step, %.0f MiB, others used %.0f %% of the CPUs" % (
                    cfg, t, r["median_step_s"], r["peak_rss_mib"],
                    100 * r["compare_others_cpu_share"]), file=sys.stderr)


PRECISION_RUNS = [  # (impl name in the logs, qkv?, extra arguments)
    ("qkv", True, ["--precision", "fp32"]),
    ("qkvbf16", True, ["--precision", "bf16"]),
    ("torch", False, []),
    ("torchbf16", False, ["--autocast", "bf16"]),
]


def measure_precisions(args, outdir):
    """qkv fp32, qkv bf16, PyTorch fp32, PyTorch bf16 autocast, alternating."""
    for rep in range(1, args.reps + 1):
        for t in args.threads:
            for cfg in args.configs:
                steps, warmup = SETTINGS[cfg]
                common = ["--config", cfg, "--threads", str(t), "--steps", str(steps),
                          "--warmup", str(warmup)]
                for impl, is_qkv, extra in PRECISION_RUNS:
                    if impl not in args.impls:
                        continue
                    cmd = ([args.qkv] if is_qkv else
                           ["/usr/bin/python3", args.peer, "--blas", "openmp"]) + common + extra
                    path = os.path.join(outdir, "%s_%s_t%d_r%d.json" % (impl, cfg, t, rep))
                    r = run_json(cmd, path, args.quiet)
                    if is_qkv:
                        r["compare_libqkv_sha256"] = libqkv_digest(args.qkv)
                        with open(path, "w") as fh:
                            fh.write(json.dumps(r) + "\n")
                    print("  %-9s %s t%d: %.4g s/step, %.0f MiB, others used %.0f %% of the CPUs"
                          % (impl, cfg, t, r["median_step_s"], r["peak_rss_mib"],
                             100 * r["compare_others_cpu_share"]), file=sys.stderr)


def precision_table(runs):
    """Median step times of the four runs and the ratios the bf16 targets name."""
    order = {"S": 0, "M": 1, "L": 2}
    cells = sorted({(c, t) for (i, c, t) in runs if i in ("qkvbf16", "torchbf16")},
                   key=lambda ct: (order.get(ct[0], 9), ct[1]))

    def med(impl, cfg, t, key="median_step_s"):
        rs = runs.get((impl, cfg, t))
        return statistics.median(r[key] for r in rs) if rs else None

    def ratio(a, b):
        return fmt(a / b if a and b else None, "%.3f")

    lines = [
        "| config | threads | runs | qkv fp32 s/step | qkv bf16 | PyTorch fp32 | PyTorch bf16 "
        "| bf16 / qkv fp32 | bf16 / PyTorch fp32 | bf16 / PyTorch bf16 | qkv RSS fp32 / bf16 MiB "
        "| final loss qkv fp32 / bf16 / PyTorch fp32 / bf16 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for cfg, t in cells:
        q, qb = med("qkv", cfg, t), med("qkvbf16", cfg, t)
        p, pb = med("torch", cfg, t), med("torchbf16", cfg, t)
        losses = " / ".join(fmt(med(i, cfg, t, "final_loss"), "%.4f")
                            for i, _q, _e in PRECISION_RUNS)
        lines.append("| %s | %d | %d | %s | %s | %s | %s | %s | %s | %s | %s / %s | %s |" % (
            cfg, t, len(runs.get(("qkvbf16", cfg, t), [])), fmt(q, "%.4g"), fmt(qb, "%.4g"),
            fmt(p, "%.4g"), fmt(pb, "%.4g"), ratio(qb, q), ratio(qb, p), ratio(qb, pb),
            fmt(med("qkv", cfg, t, "peak_rss_mib"), "%.0f"),
            fmt(med("qkvbf16", cfg, t, "peak_rss_mib"), "%.0f"), losses))
    lines.append("")
    kinds = sorted({r.get("bf16", "?") for (i, _c, _t), rs in runs.items() if i == "qkvbf16"
                    for r in rs})
    builds = sorted({r.get("compare_libqkv_sha256", "unrecorded")
                     for (i, _c, _t), rs in runs.items() if i.startswith("qkv") for r in rs})
    lines.append("qkv bf16 products: %s; libqkv build(s) (sha256 prefix): %s" % (
        ", ".join(kinds), ", ".join(builds)))
    return "\n".join(lines)


def load(*outdirs):
    runs = {}
    paths = [p for d in outdirs for p in sorted(glob.glob(os.path.join(d, "*.json")))]
    for path in paths:
        name = os.path.basename(path)[:-5]
        impl, cfg, t, _rep = name.split("_")
        with open(path) as fh:
            runs.setdefault((impl, cfg, int(t[1:])), []).append(json.load(fh))
    return runs


def fmt(x, spec):
    return "–" if x is None else spec % x


def table(runs):
    order = {"S": 0, "M": 1, "L": 2}
    builds = sorted({r.get("compare_libqkv_sha256", "unrecorded")
                     for (i, _c, _t), rs in runs.items() if i == "qkv" for r in rs})
    cells = sorted({(c, t) for (i, c, t) in runs if i == "qkv"},
                   key=lambda ct: (order.get(ct[0], 9), ct[1]))

    def med(impl, cfg, t, key="median_step_s"):
        rs = runs.get((impl, cfg, t))
        return statistics.median(r[key] for r in rs) if rs else None

    def peak(impl, cfg, t):
        rs = runs.get((impl, cfg, t))
        return max(r["peak_rss_mib"] for r in rs) if rs else None

    lines = [
        "| config | threads | runs | qkv s/step | torch s/step | qkv/torch time | qkv RSS MiB "
        "| torch RSS MiB | qkv/torch RSS | qkv GFLOP/s | torch GFLOP/s | FMA peak GFLOP/s "
        "| OpenBLAS GEMM GFLOP/s | qkv GEMM GFLOP/s | qkv of FMA peak | qkv 2t speed-up "
        "| torch 2t speed-up | final loss qkv / torch | last-10 mean qkv / torch |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for cfg, t in cells:
        q, p = med("qkv", cfg, t), med("torch", cfg, t)
        qr, pr = peak("qkv", cfg, t), peak("torch", cfg, t)
        flops = runs[("qkv", cfg, t)][0]["flops_per_step"]
        sg = med("sgemm", cfg, t, "gflops_weighted")  # OpenBLAS, as PyTorch gets it
        rs = [r for r in runs.get(("sgemm", cfg, t), []) if "fma_peak_gflops" in r]
        fma = statistics.median(r["fma_peak_gflops"] for r in rs) if rs else None
        qg = statistics.median(r["qkv_gflops_weighted"] for r in rs) if rs else None
        backends = sorted({"%s %s" % (r["qkv_gemm_backend"], r["qkv_gemm_kernel"]) for r in rs})
        q_gf = flops / q / 1e9
        p_gf = flops / p / 1e9 if p else None
        sp = {}
        for impl in ("qkv", "torch"):
            a, b = med(impl, cfg, 1), med(impl, cfg, 2)
            sp[impl] = a / b if (t == 2 and a and b) else None
        fl = "%.4f / %s" % (med("qkv", cfg, t, "final_loss"),
                            fmt(med("torch", cfg, t, "final_loss"), "%.4f"))
        l10 = "%.4f / %s" % (med("qkv", cfg, t, "mean_loss_last10"),
                             fmt(med("torch", cfg, t, "mean_loss_last10"), "%.4f"))
        lines.append("| %s | %d | %d | %.4g | %s | %s | %.1f | %s | %s | %.1f | %s | %s | %s "
                     "| %s | %s | %s | %s | %s | %s |" % (
                         cfg, t, len(runs[("qkv", cfg, t)]), q, fmt(p, "%.4g"),
                         fmt(q / p if p else None, "%.3f"), qr, fmt(pr, "%.0f"),
                         fmt(qr / pr if pr else None, "%.3f"), q_gf, fmt(p_gf, "%.1f"),
                         fmt(fma, "%.1f"), fmt(sg, "%.1f"),
                         fmt(qg, "%.1f") + (" (%s)" % ", ".join(backends) if backends else ""),
                         fmt(100 * q_gf / fma if fma else None, "%.1f %%"),
                         fmt(sp["qkv"], "%.2f×"), fmt(sp["torch"], "%.2f×"), fl, l10))
    lines.append("")
    cores = sorted({r.get("blas", "?") for (i, _c, _t), rs in runs.items() if i == "sgemm"
                    for r in rs})
    lines.append("OpenBLAS core type (as PyTorch gets it): %s; OPENBLAS_CORETYPE=%s" % (
        ", ".join(cores), os.environ.get("OPENBLAS_CORETYPE", "(unset)")))
    lines.append("libqkv build(s) measured (sha256 prefix): %s" % ", ".join(builds))
    return "\n".join(lines)


def main():
    args = parse_args()
    if args.summarize:
        runs = load(*args.summarize)
        print(precision_table(runs) if any(i.endswith("bf16") for (i, _c, _t) in runs)
              else table(runs))
        return
    for cfg in args.configs:
        if cfg not in SETTINGS:
            raise SystemExit("unknown config %s (S, M or L)" % cfg)
    for exe in (args.qkv,) if args.precisions else (args.qkv, args.sgemm):
        if not os.access(exe, os.X_OK):
            raise SystemExit("%s missing: ninja -C build-bench" % exe)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    outdir = os.path.join(args.logdir, stamp)
    os.makedirs(outdir, exist_ok=True)
    if args.precisions:
        measure_precisions(args, outdir)
        text = precision_table(load(outdir))
    else:
        measure(args, outdir)
        text = table(load(outdir))
    with open(os.path.join(outdir, "table.md"), "w") as fh:
        fh.write(text + "\n")
    print(text)
    print("logs: %s" % os.path.relpath(outdir, ROOT))


if __name__ == "__main__":
    main()
