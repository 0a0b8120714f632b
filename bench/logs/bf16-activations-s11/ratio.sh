#!/bin/sh
# ratio.sh BIN config threads pairs [extra args]: alternate fp32 and bf16, print per-pair bf16/fp32 and the median
BIN=$1; C=$2; T=$3; N=$4; shift 4
for i in $(seq $N); do
  f=$(flock /tmp/qkv-build.lock $BIN --config $C --threads $T --steps ${STEPS:-20} --warmup 3 --precision fp32 "$@" | tail -1 | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["median_step_s"])')
  b=$(flock /tmp/qkv-build.lock $BIN --config $C --threads $T --steps ${STEPS:-20} --warmup 3 --precision bf16 "$@" | tail -1 | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["median_step_s"])')
  echo "$f $b" | awk '{printf "fp32 %.4f bf16 %.4f ratio %.3f\n", $1, $2, $2/$1}'
done | tee /tmp/ratio.out
awk '{print $6}' /tmp/ratio.out | sort -n | awk '{a[NR]=$1} END {print "median ratio", (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'
