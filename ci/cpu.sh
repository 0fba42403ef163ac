#!/usr/bin/env bash
# The CPU loop, as a newcomer runs it from the README: install, `spak sim`, the tests.
# Needs no GPU and no CUDA compiler. Run from anywhere; works in the repo root.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

python=${PYTHON:-python3}
if [[ -z "${VIRTUAL_ENV:-}" ]]; then        # a fresh machine: make our own venv
  "$python" -m venv .venv
  # shellcheck disable=SC1091
  source .venv/bin/activate
fi
python --version

echo "== install (README set-up, command 1)"
python -m pip install -e ".[test]"
# Ray, for tests/test_sweep_ray.py (spak sweep --ray on a local Ray instance with fake GPU
# resources). Optional: without it those tests skip and say so.
python -m pip install -e ".[cluster]" || echo "ray did not install: tests/test_sweep_ray.py will skip"

echo "== spak sim (README set-up, command 2)"
sim_rc=0
time spak sim || sim_rc=$?           # a failed gate still lets the tests run and report
# the same gates under the models of the GPUs we do not own (RTX 5070, L4)
time spak sim --model sm_120 || sim_rc=$?
time spak sim --model sm_89 || sim_rc=$?

echo "== tests (the README's test command)"
time python -m pytest -q

exit "$sim_rc"
