#!/usr/bin/env bash
# The plans' CPU side beyond the tests: every kernel variant each plan names compiles for
# every target GPU -- sm_90 (H100/H200), sm_120 (RTX 5070), sm_89 (L4) -- with tileiras on
# this CPU, and every CPU gate of each plan passes. One plan per kernel family:
# plans/fmha.toml (forward), plans/fmha_bwd.toml (backward), plans/fmha_decode.toml (decode).
# Run after ci/cpu.sh, which installs SPAK (into .venv on a fresh machine).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [[ -z "${VIRTUAL_ENV:-}" && -f .venv/bin/activate ]]; then
  # shellcheck disable=SC1091
  source .venv/bin/activate
fi

rc=0
for plan in plans/fmha.toml plans/fmha_bwd.toml plans/fmha_decode.toml; do
  name=$(basename "$plan" .toml)
  echo "== spak compile --plan $plan --arch sm_90,sm_120,sm_89 (tileiras on the CPU, no GPU)"
  time python -m spak compile --plan "$plan" --arch sm_90,sm_120,sm_89 --jobs 2 || rc=$?
  echo "== spak plan $plan (its CPU gates; the compiles were checked above)"
  time python -m spak plan "$plan" --no-compile --out "${TMPDIR:-/tmp}/spak-plan-ci-$name" || rc=$?
done

exit "$rc"
