#!/usr/bin/env bash
# The whole suite, in two lanes on two cores: the unit tests (no Ray: CPU-bound, most of
# them the own HTTP server's hostile and differential cases) run beside the integration
# and e2e tests (one local Ray, mostly waiting on it), then the notebooks (each starts its
# own Ray, so they run after the suite's Ray is gone). Every test still runs on every push.
# RAYBATCH_TEST_LANES=1 runs them one after another instead.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
if [ "${RAYBATCH_TEST_LANES:-2}" = 1 ]; then
  "$PY" -m pytest -q && "$PY" -m pytest -q --nbmake notebooks
  exit $?
fi
unit_log=$(mktemp)
trap 'rm -f "$unit_log"' EXIT
start=$(date +%s)
"$PY" -m pytest -q -p no:cacheprovider tests/unit >"$unit_log" 2>&1 &
unit=$!
"$PY" -m pytest -q tests/integration tests/e2e
ray_rc=$?
wait "$unit"
unit_rc=$?
echo "---- tests/unit (ran beside the above) ----"
cat "$unit_log"
echo "---- the suite took $(( $(date +%s) - start )) s ----"
"$PY" -m pytest -q --nbmake notebooks
nb_rc=$?
[ "$ray_rc" = 0 ] && [ "$unit_rc" = 0 ] && [ "$nb_rc" = 0 ]
