#!/bin/sh
# bench/ab-step.sh BEFORE AFTER [PAIRS [CONFIG]]: config M (or CONFIG) step
# time of two qkv-bench-transformer binaries (two release builds), run
# alternately at 1 thread, PAIRS pairs (default 5); prints the medians and
# the per-pair ratios. JSON lines go to stdout's last part too.
# Example: bench/ab-step.sh /tmp/old/bench/qkv-bench-transformer \
#            build-rel/bench/qkv-bench-transformer 5 M
set -eu
before=$1 after=$2 pairs=${3:-5} config=${4:-M}
log=$(mktemp)
i=1
while [ "$i" -le "$pairs" ]; do
  for which in before after; do
    if [ "$which" = before ]; then bin=$before; else bin=$after; fi
    OMP_NUM_THREADS=1 "$bin" --config "$config" --threads 1 --steps 30 --warmup 5 |
      sed "s/^{/{\"which\":\"$which\",\"pair\":$i,/" >>"$log"
  done
  i=$((i + 1))
done
/usr/bin/python3 - "$log" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
b = [r["median_step_s"] for r in rows if r["which"] == "before"]
a = [r["median_step_s"] for r in rows if r["which"] == "after"]
print("before", " ".join(f"{x:.4f}" for x in b), f"median {statistics.median(b):.4f}")
print("after ", " ".join(f"{x:.4f}" for x in a), f"median {statistics.median(a):.4f}")
print(f"median after/before {statistics.median(a) / statistics.median(b):.3f}; per-pair ratios",
      " ".join(f"{y / x:.3f}" for x, y in zip(b, a)))
PY
cat "$log"
rm -f "$log"
