#!/usr/bin/env bash
# The cuTile toolchain for the GPU machine (no package registry there) as ONE solid xz tar,
# small enough to travel with the tree: the device tool's 64 MiB upload limit counts 4 KiB
# blocks of tree + carry, and ../shared/device/cutile-carry.sh's per-file xz (~60 MB) plus
# this tree (~12.4 MiB of blocks) no longer fit. Solid, with the x86 filter: ~55.2 MB.
#
#   bash tools/device_carry.sh [.carry] [path/to/cutile-carry.sh]   # ~8 min on 2 cores
#   echo /.carry/ >> .git/info/exclude
#   on the GPU machine, from the repo root:  source .carry/setup.sh && ...
#
# Same contents as cutile-carry.sh (cuTile 1.7.0, tileiras + ptxas + libnvvm 13.4.92):
# it runs that script, then unpacks and repacks. setup.sh unsets CUDA_HOME/CUDA_PATH for
# the reason that script gives (an older toolkit's ptxas/libnvvm would be picked).
set -euo pipefail
dest=${1:-.carry}
fetch=${2:-../shared/device/cutile-carry.sh}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bash "$fetch" "$work/files" >/dev/null
mkdir -p "$work/tc/bin" "$work/tc/lib" "$work/tc/site"
xz -dc "$work/files/tileiras.xz" > "$work/tc/bin/tileiras"
xz -dc "$work/files/ptxas.xz" > "$work/tc/bin/ptxas"
xz -dc "$work/files/libnvvm.so.4.xz" > "$work/tc/lib/libnvvm.so.4"
(cd "$work/tc/site" && python3 -m zipfile -e "$work"/files/cuda_tile-*.whl .)
mkdir -p "$dest"
rm -f "$dest"/*.xz "$dest"/*.whl
# one thread: a 192 MiB dictionary needs ~2 GB of memory a thread
tar -C "$work/tc" -cf - bin lib site | xz -T1 --x86 --lzma2=preset=9e,dict=192MiB > "$dest/tc.tar.xz"
cat > "$dest/setup.sh" <<'SETUP'
# source me on the GPU machine from the repo root: cuTile 1.7.0 + tileiras/ptxas/libnvvm
# 13.4.92 unpacked under /tmp/cutile-tc (tools/device_carry.sh made this folder)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
tc=/tmp/cutile-tc
[ -x $tc/bin/tileiras ] || { mkdir -p $tc && xz -dc "$here/tc.tar.xz" | tar -xf - -C $tc &&
  chmod +x $tc/bin/*; } || return 1
export PYTHONPATH=$tc/site${PYTHONPATH:+:$PYTHONPATH}
export PATH=$tc/bin:$PATH
export LD_LIBRARY_PATH=$tc/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
unset CUDA_HOME CUDA_PATH
SETUP
du -b "$dest/tc.tar.xz"
