#!/bin/sh
# rss.sh: max RSS and arena of fp32, bf16 with fp32 activations, bf16 with bf16 activations
BIN=${QKV_BENCH:-build-bench/bench/qkv-bench-transformer}
for c in M L; do for rep in 1 2; do for v in "fp32" "bf16 --fp32-activations" "bf16"; do
  set -- $v
  p=$1; shift
  out=$( /usr/bin/time -f "rss_kb %M" $BIN --config $c --threads 1 --steps ${STEPS:-4} --warmup 2 --precision $p "$@" 2>&1 | tail -2)
  echo "$out" | /usr/bin/python3 -c '
import json,sys
l=sys.stdin.read().splitlines()
d=json.loads(l[0]); print(d["config"], d["precision"], d["activations"], "arena_MB %.1f" % (d["arena_bytes"]/1e6), "step_s %.4f" % d["median_step_s"], l[1])'
done; done; done
