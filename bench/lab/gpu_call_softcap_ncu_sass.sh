#!/usr/bin/env bash
# Lab GPU call (prepared 2026-12-05 (e)), ~90 s: Nsight Compute's per-SASS-line stall samples of the Hopper kernel
# on P1, causal and soft cap 30 (bench/lab/ncu_one.sh), kept whole (gzipped CSV) so that the softmax window's samples
# can be read beside ptxas's control bits (python -m bench.lab.sass_ctrl print SPEC) on any machine: which waits
# the issue model misses (it gives about half the softmax cycles the cycle probe measured). Logs under $OUT.
. bench/lab/call_start.sh
mkdir -p /tmp/ncu
for v in causal softcap; do
  extra=(); [ "$v" = softcap ] && extra=(--soft-cap 30)
  OUT=/tmp/ncu timeout 200 bash bench/lab/ncu_one.sh "p1_$v" sm90 P1 --backend sm90 --runs 5 "${extra[@]}"
  gzip -c "/tmp/ncu/ncu_p1_${v}_sass.csv" > "$OUT/ncu_p1_${v}_sass.csv.gz" 2>/dev/null
  cp "/tmp/ncu/ncu_p1_${v}_details.txt" "$OUT/" 2>/dev/null; echo "$v done ($(at))"
done
python3 -m bench.lab.ncu_sass_classes /tmp/ncu/ncu_p1_causal_sass.csv /tmp/ncu/ncu_p1_softcap_sass.csv \
  > "$OUT/ncu_stalls_by_opcode.txt" 2>&1; head -40 "$OUT/ncu_stalls_by_opcode.txt"
