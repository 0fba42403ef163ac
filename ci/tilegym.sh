#!/usr/bin/env bash
# TileGym's own test suite (NVIDIA/TileGym tests/ops, cutile backend), unmodified, on this
# CPU in interpreter mode (issue 37; docs/interpreter.md): `ct.launch` runs on the simulator,
# torch.cuda presents a simulated H100 (spak.sim.pytest_plugin). Never vendored: found at
# $TILEGYM_DIR (only there, when set), ../shared/peers/tilegym, .peers/tilegym, or fetched
# from GitHub at the commit below into .cache/ (needs network); without one of them the job
# skips and says so (exit 0, < 1 s without a network).
#   bash ci/tilegym.sh            the CI subset (ci/tilegym_ci.txt, 46 tests: 2 min 12 s on the
#                                 shared 2-core machine, 2026-11-28; 85 launches, 81 s simulated)
#   FULL=1 bash ci/tilegym.sh     all of tests/ops (1822 tests; hours on a CPU)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)
COMMIT=75a14307776188ff0baf451cd9b9fc9fa3a87233        # /work/shared/peers/tilegym/SOURCE.md
if [[ -z "${VIRTUAL_ENV:-}" && -f .venv/bin/activate ]]; then
  # shellcheck disable=SC1091
  source .venv/bin/activate                          # made by ci/cpu.sh on a fresh machine
fi

tg=""
if [[ -n ${TILEGYM_DIR:-} ]]; then
  # an explicit copy is the only one tried: a wrong path skips, never silently tests another
  if [[ -d $TILEGYM_DIR/tests/ops && -d $TILEGYM_DIR/src/tilegym ]]; then
    tg=$(cd "$TILEGYM_DIR" && pwd)
  else
    echo "== tilegym: SKIP: TILEGYM_DIR=$TILEGYM_DIR has no tests/ops and src/tilegym"
    exit 0
  fi
fi
for d in ../shared/peers/tilegym /work/shared/peers/tilegym .peers/tilegym ".cache/TileGym-$COMMIT"; do
  [[ -z $tg ]] || break
  if [[ -d $d/tests/ops && -d $d/src/tilegym ]]; then tg=$(cd "$d" && pwd); fi
done
if [[ -z $tg ]] && command -v curl >/dev/null; then
  echo "== tilegym: fetching NVIDIA/TileGym@$COMMIT from GitHub"
  mkdir -p .cache
  curl -fsSL --connect-timeout 20 --max-time 180 "https://github.com/NVIDIA/TileGym/archive/$COMMIT.tar.gz" \
    | tar -xz -C .cache 2>/dev/null && tg=$ROOT/.cache/TileGym-$COMMIT
  [[ -d $tg/tests/ops ]] || tg=""
fi
if [[ -z $tg ]]; then
  echo "== tilegym: SKIP: no TileGym checkout (set TILEGYM_DIR to a clone of NVIDIA/TileGym"
  echo "   at $COMMIT; github.com was not reachable to fetch it)"
  exit 0
fi

echo "== tilegym: $tg tests/ops in interpreter mode (spak.sim.pytest_plugin)"
cd "$tg"
export PYTHONPATH=$ROOT:$tg/src${PYTHONPATH:+:$PYTHONPATH}
# TileGym's own knobs (tests/config.py): the fewest benchmark repetitions for perf tests
export WARMUP=${WARMUP:-0} REP=${REP:-0} MIN_REP=${MIN_REP:-1} INITIAL_REP=${INITIAL_REP:-1}
# CUPTI=0: TileGym's switch for a machine without CUPTI (the simulated GPU has none): perf tests
# time with torch.cuda.Event (emulated) instead of torch.profiler's CUDA activity
export CUPTI=${CUPTI:-0}
if [[ ${FULL:-0} == 1 ]]; then
  time python -m spak.sim -m pytest -p no:cacheprovider -rfEs tests/ops "$@"
else
  export SPAK_SIM_TEST_TIMEOUT=${SPAK_SIM_TEST_TIMEOUT:-120}
  time timeout 1200 python "$ROOT/ci/pytest_ids.py" "$ROOT/ci/tilegym_ci.txt" \
    -p spak.sim.pytest_plugin -p no:cacheprovider -q -rfEs "$@"
fi
