#!/usr/bin/env bash
# Lab GPU call: the paged cases' same-run A/B of this checkout against .ab/base (2 rounds, bench/lab/gpu_abn.sh),
# then Nsight Compute on the Hopper kernel, P1 causal and P1 with soft cap 30 (bench/lab/ncu_one.sh; the warp-stall
# sample counts of each from the raw page). Carry .ab/base. Logs under $OUT.
. bench/lab/call_start.sh
AB_WORK=/tmp/abn timeout ${AB_TIMEOUT:-240} bash bench/lab/gpu_abn.sh prefill "${CASES:-P4,P5,P6}" "${ROUNDS:-2}" \
  base=.ab/base new=. > /tmp/abn.txt 2>&1; echo "A/B exit $? ($(at))"
cat /tmp/abn/compare*.txt 2>/dev/null > "$OUT/abn_paged.txt" || tail -20 /tmp/abn.txt; cat "$OUT/abn_paged.txt"
mkdir -p /tmp/ncu
for v in causal softcap; do
  extra=(); [ "$v" = softcap ] && extra=(--soft-cap 30)
  OUT=/tmp/ncu bash bench/lab/ncu_one.sh "p1_$v" sm90 P1 --backend sm90 --runs 5 "${extra[@]}"
  ncu -i "/tmp/ncu/ncu_p1_$v.ncu-rep" --page raw --csv 2>/dev/null | python3 -c '
import csv, sys
rows = list(csv.reader(sys.stdin))
head, units, vals = rows[0], rows[1], rows[2]
for h, u, x in zip(head, units, vals):
    if "issue_stalled" in h and "pcsamp" in h or h.startswith(("sm__inst_executed_pipe_xu", "sm__pipe_", "smsp__inst_executed_pipe_xu")):
        print(h, x, u)
' > "$OUT/ncu_p1_${v}_stalls.txt"; echo "$v: $(wc -l < "$OUT/ncu_p1_${v}_stalls.txt") metrics ($(at))"
  cp "/tmp/ncu/ncu_p1_${v}_details.txt" "/tmp/ncu/ncu_p1_${v}_sass.csv" "$OUT/" 2>/dev/null
done
