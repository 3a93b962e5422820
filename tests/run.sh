#!/usr/bin/env bash
# The whole suite, in two lanes on two cores, each about half of it:
#   lane 1: the integration and e2e tests that share the session's local Ray, then the
#           notebooks (each that needs Ray starts and stops its own, once the session's
#           is gone; those, RAY_NOTEBOOKS, run beside the others: by then the two cores
#           are no longer both busy), then the own server's differential fuzzer against
#           h11 (its streams cached: test_differential.py), then the own-Ray tests of
#           LANE1_OWN_RAY (a token-auth cluster on a Ray temp dir, HOME and ports of its
#           own, every address given: nothing a local Ray of lane 2 would find), then the
#           unit tests of LANE1_UNIT (no Ray; the HTTP servers' own tests, on free ports);
#   lane 2: the other unit tests (no Ray: CPU-bound; the native front's with the front
#           built with ASan and UBSan, tests/sanitize.sh), then the tests that start a Ray
#           of their own
#           (marker `own_ray`: `raybatch up` in a process of its own, cluster scenarios),
#           on free ports of their own, but those of LANE1_OWN_RAY.
# Every test still runs on every push but those marked `soak` (they measure: `make soak`;
# pyproject's addopts leaves them out, and so do the -m expressions here).
# RAYBATCH_TEST_LANES=1 runs them one after another.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
if [ "${RAYBATCH_TEST_LANES:-2}" = 1 ]; then
  "$PY" -m pytest -q && "$PY" -m pytest -q --nbmake notebooks
  exit $?
fi
lane2_log=$(mktemp)
trap 'rm -f "$lane2_log"' EXIT
start=$(date +%s)
took() { echo "---- $1 took $(( $(date +%s) - start )) s from the start ----"; }
# The own server's h11 differential fuzzer runs in lane 1 (after the notebooks), the
# front's in lane 2: each lane about half of the suite.
H11_FUZZ=tests/unit/deployments/http/test_differential.py
# Own-Ray and unit tests that run at the end of lane 1 instead (each lane then ends about
# together; the suite keeps both cores busy throughout, so an idle lane is lost time).
LANE1_OWN_RAY=(tests/integration/test_cluster_auth.py)
LANE1_UNIT=tests/unit/deployments/http
(
  front_tests=$(bash tests/sanitize.sh --list)
  # shellcheck disable=SC2046
  "$PY" -m pytest -q -p no:cacheprovider --durations=15 tests/unit \
    $(printf -- '--ignore=%s ' $front_tests $H11_FUZZ "$LANE1_UNIT")
  unit_rc=$?
  took "tests/unit"
  PY="$PY" bash tests/sanitize.sh
  front_rc=$?
  took "the native front's tests, sanitized"
  # shellcheck disable=SC2046
  "$PY" -m pytest -q -p no:cacheprovider --durations=15 -m "own_ray and not soak" \
    tests/integration tests/e2e $(printf -- '--ignore=%s ' "${LANE1_OWN_RAY[@]}")
  own_rc=$?
  took "the own-Ray tests"
  [ "$unit_rc" = 0 ] && [ "$front_rc" = 0 ] && [ "$own_rc" = 0 ]
) >"$lane2_log" 2>&1 &
lane2=$!
"$PY" -m pytest -q --durations=15 -m "not own_ray and not soak" tests/integration tests/e2e
ray_rc=$?
took "the session-Ray tests"
# The notebooks that start a Ray run beside those that need none (their output after).
RAY_NOTEBOOKS=(notebooks/03_serving_on_ray.ipynb)
ray_nb_log=$(mktemp)
trap 'rm -f "$lane2_log" "$ray_nb_log"' EXIT
"$PY" -m pytest -q -p no:cacheprovider --nbmake "${RAY_NOTEBOOKS[@]}" >"$ray_nb_log" 2>&1 &
ray_nb=$!
# shellcheck disable=SC2046
"$PY" -m pytest -q -p no:cacheprovider --nbmake notebooks \
  $(printf -- '--ignore=%s ' "${RAY_NOTEBOOKS[@]}")
nb_rc=$?
wait "$ray_nb"
ray_nb_rc=$?
echo "---- the notebooks that start a Ray (${RAY_NOTEBOOKS[*]}), beside the above ----"
cat "$ray_nb_log"
took "the notebooks"
"$PY" -m pytest -q -p no:cacheprovider "$H11_FUZZ"
fuzz_rc=$?
took "the h11 differential"
"$PY" -m pytest -q -p no:cacheprovider --durations=15 -m "own_ray and not soak" \
  "${LANE1_OWN_RAY[@]}"
lane1_own_rc=$?
took "the own-Ray tests of lane 1 (${LANE1_OWN_RAY[*]})"
front_tests=$(bash tests/sanitize.sh --list)
# shellcheck disable=SC2046
"$PY" -m pytest -q -p no:cacheprovider --durations=5 "$LANE1_UNIT" \
  $(printf -- '--ignore=%s ' $front_tests $H11_FUZZ)
lane1_unit_rc=$?
took "the unit tests of lane 1 ($LANE1_UNIT)"
wait "$lane2"
lane2_rc=$?
echo "---- lane 2 (ran beside the above): tests/unit, then the own-Ray tests ----"
cat "$lane2_log"
echo "---- the suite took $(( $(date +%s) - start )) s ----"
[ "$ray_rc" = 0 ] && [ "$nb_rc" = 0 ] && [ "$ray_nb_rc" = 0 ] && [ "$fuzz_rc" = 0 ] &&
  [ "$lane1_own_rc" = 0 ] && [ "$lane1_unit_rc" = 0 ] && [ "$lane2_rc" = 0 ]
