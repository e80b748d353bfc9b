#!/usr/bin/env bash
# Lab GPU call (2026-12-05 (d)): the decode kernel's K/V copies forced L2 evict-first against evict-normal on the fp8
# cases and their bf16 twins (tune_sched evict; never measured on fp8 before), then the same run's stream floors of
# D6 and D10 (stream_floor). Logs under $OUT.
. bench/lab/call_start.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > "$OUT/gpu.txt" 2>&1
timeout ${EVICT_TIMEOUT:-240} python3 -m bench.lab.tune_sched evict --cases "${CASES:-D10,D6,D5-e4m3,D5,D9-e4m3}" \
  --rounds "${ROUNDS:-2}" > "$OUT/evict.txt" 2>&1
echo "evict exit $? ($(at))"; grep -v "^$" "$OUT/evict.txt" | tail -40
timeout ${FLOOR_TIMEOUT:-200} python3 -m bench.lab.stream_floor --cases "${FLOOR_CASES:-D6,D10}" \
  > "$OUT/floor.txt" 2>&1
echo "floor exit $? ($(at))"; tail -20 "$OUT/floor.txt"
