#!/usr/bin/env bash
# The plan's CPU side beyond the tests (issue 5): every kernel variant the plan names
# compiles for every target GPU -- sm_90 (H100/H200), sm_120 (RTX 5070), sm_89 (L4) --
# with tileiras on this CPU, and every CPU gate of plans/fmha.toml passes.
# Run after ci/cpu.sh, which installs SPAK (into .venv on a fresh machine).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [[ -z "${VIRTUAL_ENV:-}" && -f .venv/bin/activate ]]; then
  # shellcheck disable=SC1091
  source .venv/bin/activate
fi

echo "== spak compile --arch sm_90,sm_120,sm_89 (tileiras on the CPU, no GPU)"
rc=0
time python -m spak compile --arch sm_90,sm_120,sm_89 || rc=$?

echo "== spak plan (the CPU gates of plans/fmha.toml; the compiles were checked above)"
time python -m spak plan --no-compile --out "${TMPDIR:-/tmp}/spak-plan-ci" || rc=$?

exit "$rc"
