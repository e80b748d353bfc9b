#!/usr/bin/env bash
# Lab GPU call (prepared 2026-12-05 (e), not yet run), ~200 s: what an fp8 decode item's start and end cost D10.
# Bounds, wrong results for fp8 K / V (bf16 kernels unchanged: D6 is the control):
#   nofin (branch lab-fp8-nofinish): fp8 items end without the warps' merge, the output stores and the pieces'
#         settle (the item's math kept alive by a never-taken store);
#   noq   (branch lab-fp8-noq): fp8 items after a CTA's first keep its query rows (no query load at an item's start).
# And one candidate (the same results, bf16 and fp8 alike):
#   ipf   (branch decode-index-prefetch): each item's page indices prefetched into L2 at its first tile, one line per
#         thread, so that a tile's index loads hit L2 instead of queueing behind the K / V streams in DRAM (the IMAD
#         that scales a loaded index held 10 % of D10's stall samples, 2026-12-03 (g)). The L1 prefetch of the next
#         tile's index tried then was 0.3-0.6 % slower. If ipf wins: the decode GPU tests, then the suite.
# D10 ends its CTAs with 4 or 5 items (138.6 / 140.7 µs, 2026-12-04); 1.8x D6 needs ~2.5 µs (1.7 %) off D10. If
# nofin gains several times that, an item's end is the lever (a cheaper cross-warp merge, stores after the next
# tile's issue); if not, the rest of D10's ~6 % over its floor is the loop and the exit spread.
# Make the trees first and carry .ab/base .ab/nofin .ab/noq .ab/ipf:
#   bash bench/lab/ab_trees.sh base=main nofin=lab-fp8-nofinish noq=lab-fp8-noq ipf=decode-index-prefetch
. bench/lab/call_start.sh
CASES=${CASES:-D10,D5-e4m3,D6}
AB_WORK=/tmp/abn timeout ${AB_TIMEOUT:-400} bash bench/lab/gpu_abn.sh decode "$CASES" "${ROUNDS:-3}" base=.ab/base \
  nofin=.ab/nofin noq=.ab/noq ipf=.ab/ipf > "$OUT/abn_item_bounds.txt" 2>&1; echo "A/B exit $? ($(at))"
cat /tmp/abn/compare*.txt 2>/dev/null | grep -v cuda-cores || tail -20 "$OUT/abn_item_bounds.txt"
cp /tmp/abn/compare*.txt "$OUT/" 2>/dev/null
