#!/bin/sh
# quiet alternating pairs, fp32 vs bf16 (bf16 activations on, the default)
B=${QKV_BENCH:-build-bench/bench/qkv-bench-transformer}
for cfg in "L 2 8" "M 2 20" "M 1 20" "L 1 8"; do
  set -- $cfg
  echo "== config $1 threads $2 steps $3"
  STEPS=$3 "$(dirname "$0")"/ratio.sh $B $1 $2 5
done
