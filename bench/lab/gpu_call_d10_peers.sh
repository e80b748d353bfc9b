#!/usr/bin/env bash
# Lab: does FlashInfer's presence in the decode suite's process change cuinfer's D10? The suite without peers twice,
# then with FlashInfer (compiled in the background meanwhile) on D6 and D10. Logs under $OUT.
. bench/lab/call_start.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/peers .peers/*.whl > /dev/null 2>&1
( PYTHONPATH=/tmp/peers FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=6 CUINFER_CACHE_DIR=/tmp/cc-warm nice -n 19 \
  python3 -m bench warm --cases D6,D10 > "$OUT/fi_warm.txt" 2>&1; touch /tmp/fi.done ) &
for r in 1 2; do
  timeout 100 python3 -m bench decode --cases D6,D10 --no-peers --no-plot --out "$OUT/np_r$r" > "$OUT/bench_nopeers_r$r.txt" 2>&1
  echo "no peers run $r exit $? $(at)"; grep -E "^  (D6|D10) +cuinfer\[default\]" "$OUT/bench_nopeers_r$r.txt"
done
for i in $(seq 1 120); do [ -f /tmp/fi.done ] && break; sleep 2; done
echo "FI warm $(at)"
PYTHONPATH=/tmp/peers FLASHINFER_CUDA_ARCH_LIST=9.0a CUINFER_CACHE_DIR=/tmp/cc-warm timeout 200 \
  python3 -m bench decode --cases D6,D10 --no-plot --out "$OUT/p" > "$OUT/bench_peers.txt" 2>&1
echo "peers run exit $? $(at)"; grep -E "^  (D6|D10) +(cuinfer|flashinfer)" "$OUT/bench_peers.txt"
PYTHONPATH=/tmp/peers timeout 60 python3 -m bench decode --cases D6,D10 --no-peers --no-plot --out "$OUT/np_r3" \
  > "$OUT/bench_nopeers_r3.txt" 2>&1
echo "no peers (PYTHONPATH peers) exit $? $(at)"; grep -E "^  (D6|D10) +cuinfer\[default\]" "$OUT/bench_nopeers_r3.txt"
