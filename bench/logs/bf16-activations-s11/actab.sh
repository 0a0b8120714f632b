#!/bin/sh
# actab.sh config threads pairs steps: bf16 with bf16 activations vs with fp32 activations, alternating
B=${QKV_BENCH:-build-bench/bench/qkv-bench-transformer}
C=$1; T=$2; N=$3; S=$4
for i in $(seq $N); do
  on=$($B --config $C --threads $T --steps $S --warmup 3 --precision bf16 | tail -1 | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["median_step_s"])')
  off=$($B --config $C --threads $T --steps $S --warmup 3 --precision bf16 --fp32-activations | tail -1 | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["median_step_s"])')
  echo "$on $off" | awk '{printf "bf16-act %.4f fp32-act %.4f ratio %.3f\n", $1, $2, $1/$2}'
done | tee /tmp/actab.out
awk '{print $6}' /tmp/actab.out | sort -n | awk '{a[NR]=$1} END {print "median ratio", (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'
