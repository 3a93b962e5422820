#!/usr/bin/env bash
# The whole suite, in three lanes on two cores. Three, not two: much of the integration
# tests' time is waiting (a Ray starting, a deploy, a fault's timeout), and two lanes kept
# the two cores only two-thirds busy.
#   lane 1 (printed as it runs): the integration and e2e tests that share the session's
#           local Ray, then the own server's differential fuzzer against h11 (its streams
#           cached: test_differential.py);
#   lane 2: the unit tests (no Ray; the native front's with the front built with ASan and
#           UBSan, tests/sanitize.sh), then the tests that start a Ray of their own on this
#           machine (marker `own_ray`: `raybatch up` in a process of its own, clusters of
#           `ray.cluster_utils`), on free ports of their own;
#   lane 3: the tests of LANE3_OWN_RAY: the lab's (hosts in network namespaces, one lab at a
#           time, its head on a Ray temp dir of its own) and the token-auth cluster's (a Ray
#           temp dir, HOME and ports of its own: nothing a local Ray of lane 2 would find
#           or join), and test_gpu_yaml.py (a `raybatch up` as lane 2's, here to even the
#           lanes); then the notebooks (those that need a Ray start their own, beside the
#           others), then the HTTP servers' own unit tests (LANE3_UNIT, on free ports).
# Every test still runs on every push but those marked `soak` (they measure: `make soak`;
# pyproject's addopts leaves them out, and so do the -m expressions here).
# RAYBATCH_TEST_LANES=1 runs them one after another.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
if [ "${RAYBATCH_TEST_LANES:-3}" = 1 ]; then
  "$PY" -m pytest -q && "$PY" -m pytest -q --nbmake notebooks
  exit $?
fi
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
start=$(date +%s)
took() { echo "---- $1 took $(( $(date +%s) - start )) s from the start ----"; }
H11_FUZZ=tests/unit/deployments/http/test_differential.py
LANE3_OWN_RAY=(tests/integration/test_lab.py tests/integration/test_cluster_faults.py
               tests/integration/test_cluster_faults_state.py
               tests/integration/test_cluster_auth.py tests/integration/test_gpu_yaml.py)
LANE3_UNIT=tests/unit/deployments/http
RAY_NOTEBOOKS=(notebooks/03_serving_on_ray.ipynb)
front_tests=$(bash tests/sanitize.sh --list)

lane2() {
  # shellcheck disable=SC2046
  "$PY" -m pytest -q -p no:cacheprovider --durations=15 tests/unit \
    $(printf -- '--ignore=%s ' $front_tests $H11_FUZZ "$LANE3_UNIT")
  local unit_rc=$?
  took "tests/unit"
  PY="$PY" bash tests/sanitize.sh
  local front_rc=$?
  took "the native front's tests, sanitized"
  # shellcheck disable=SC2046
  "$PY" -m pytest -q -p no:cacheprovider --durations=15 -m "own_ray and not soak" \
    tests/integration tests/e2e $(printf -- '--ignore=%s ' "${LANE3_OWN_RAY[@]}")
  local own_rc=$?
  took "the own-Ray tests of lane 2"
  [ "$unit_rc" = 0 ] && [ "$front_rc" = 0 ] && [ "$own_rc" = 0 ]
}

lane3() {
  "$PY" -m pytest -q -p no:cacheprovider --durations=15 -m "own_ray and not soak" \
    "${LANE3_OWN_RAY[@]}"
  local own_rc=$?
  took "the own-Ray tests of lane 3 (${LANE3_OWN_RAY[*]})"
  # The notebooks that start a Ray run beside those that need none (their output after).
  "$PY" -m pytest -q -p no:cacheprovider --nbmake "${RAY_NOTEBOOKS[@]}" \
    >"$logs/ray-notebooks" 2>&1 &
  local ray_nb=$!
  # shellcheck disable=SC2046
  "$PY" -m pytest -q -p no:cacheprovider --nbmake notebooks \
    $(printf -- '--ignore=%s ' "${RAY_NOTEBOOKS[@]}")
  local nb_rc=$?
  wait "$ray_nb"
  local ray_nb_rc=$?
  echo "---- the notebooks that start a Ray (${RAY_NOTEBOOKS[*]}), beside the above ----"
  cat "$logs/ray-notebooks"
  took "the notebooks"
  # shellcheck disable=SC2046
  "$PY" -m pytest -q -p no:cacheprovider --durations=5 "$LANE3_UNIT" \
    $(printf -- '--ignore=%s ' $front_tests $H11_FUZZ)
  local unit_rc=$?
  took "the unit tests of lane 3 ($LANE3_UNIT)"
  [ "$own_rc" = 0 ] && [ "$nb_rc" = 0 ] && [ "$ray_nb_rc" = 0 ] && [ "$unit_rc" = 0 ]
}

lane2 >"$logs/lane2" 2>&1 &
lane2_pid=$!
lane3 >"$logs/lane3" 2>&1 &
lane3_pid=$!
"$PY" -m pytest -q --durations=15 -m "not own_ray and not soak" tests/integration tests/e2e
ray_rc=$?
took "the session-Ray tests"
"$PY" -m pytest -q -p no:cacheprovider "$H11_FUZZ"
fuzz_rc=$?
took "the h11 differential"
wait "$lane2_pid"
lane2_rc=$?
echo "---- lane 2 (ran beside the above): tests/unit, then the own-Ray tests ----"
cat "$logs/lane2"
wait "$lane3_pid"
lane3_rc=$?
echo "---- lane 3 (ran beside the above): the lab's and the token cluster's own-Ray tests," \
  "the notebooks, the HTTP servers' unit tests ----"
cat "$logs/lane3"
echo "---- the suite took $(( $(date +%s) - start )) s ----"
[ "$ray_rc" = 0 ] && [ "$fuzz_rc" = 0 ] && [ "$lane2_rc" = 0 ] && [ "$lane3_rc" = 0 ]
