#!/usr/bin/env bash
# one 4x H200 call: issue 36's scaling sweep (n4 on every GPU, then n1 on GPU 0) and, while
# n1 runs, issue 34's host-cost job on GPU 2 (other GPU, other cores of a 64-core host)
source .carry/setup.sh
mkdir -p .peers && tar -xJf .peers_pack/peers.tar.xz -C . 2>/dev/null
( while [ ! -e /tmp/i36work/n1.log ]; do sleep 1; done; sleep 2
  GPU=2 bash .gpujobs/i34h.sh > $OUT/i34h.txt 2>&1; echo "i34h ended $(date -u +%T)" >> $OUT/i34h.txt ) &
bash .gpujobs/i36c.sh --budget ${I36_BUDGET:-450}
wait
tail -40 $OUT/i34h.txt
