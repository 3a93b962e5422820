#!/usr/bin/env bash
# The whole suite, in two lanes on two cores:
#   lane 1: the integration and e2e tests that share the session's local Ray, then the
#           notebooks (each that needs Ray starts and stops its own, once the session's
#           is gone; those, RAY_NOTEBOOKS, run beside the others: by then the two cores
#           are no longer both busy), then items of the queue below;
#   lane 2: the unit tests (no Ray: CPU-bound; the native front's with the front built
#           with ASan and UBSan, tests/sanitize.sh), then items of the queue.
# The queue: what needs no session Ray, each item taken by whichever lane is free first,
# the longest first, so that the two lanes end about together however the machine's load
# falls on them (a fixed split that ends together on a quiet machine leaves one lane
# minutes behind when another process takes a core):
#   - each file of tests that start a Ray of their own (marker `own_ray`: `raybatch up` in
#     a process of its own, cluster scenarios), on free ports and temp dirs of their own;
#     the files that make a lab of network-namespace hosts (`benchmarks.cluster.lab`: one
#     set of names and addresses per machine) one item, one after another;
#   - the HTTP servers' own unit tests (LANE1_UNIT, on free ports), and the own server's
#     differential fuzzer against h11 (its streams cached: test_differential.py).
# Every test still runs on every push but those marked `soak` (they measure: `make soak`;
# pyproject's addopts leaves them out, and so do the -m expressions here).
# RAYBATCH_TEST_LANES=1 runs them one after another.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
# Setup compiles only what the running product imports (raybatch.bytecode); pytest, the
# test extras and the notebooks' modules compile on first import and are kept, wherever
# the environment says not to write bytecode (else each of the suite's processes parses them).
unset PYTHONDONTWRITEBYTECODE
if [ "${RAYBATCH_TEST_LANES:-2}" = 1 ]; then
  "$PY" -m pytest -q && "$PY" -m pytest -q --nbmake notebooks
  exit $?
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
start=$(date +%s)
took() { echo "---- $1 took $(( $(date +%s) - start )) s from the start ----"; }
H11_FUZZ=tests/unit/deployments/http/test_differential.py
LANE1_UNIT=tests/unit/deployments/http
front_tests=$(bash tests/sanitize.sh --list)

# The queue, one item a line: seconds it takes on a quiet 2-core box (its place in the
# queue: the longest first), a label, its kind (own: own-Ray tests; unit) and its paths.
own=$(grep -l "pytest.mark.own_ray" tests/integration/test_*.py tests/e2e/test_*.py)
# shellcheck disable=SC2086
lab=$(grep -l "benchmarks.cluster.lab" $own | tr '\n' ' ')
expected() {  # measured on the quiet 2-core box; a file not named here: 30
  case "$1" in
    lab) echo 160 ;; *test_up_stop.py) echo 100 ;; *test_multinode.py) echo 45 ;;
    *test_gpu_yaml.py) echo 44 ;; *test_k8s_autoscaling.py) echo 38 ;;
    *test_cluster_auth.py) echo 35 ;; "$LANE1_UNIT") echo 35 ;; "$H11_FUZZ") echo 10 ;;
    *) echo 30 ;;
  esac
}
{
  [ -z "$lab" ] || printf '%s\t%s\t%s\t%s\n' "$(expected lab)" "the lab's tests" own "$lab"
  for f in $own; do
    case " $lab " in *" $f "*) continue ;; esac
    printf '%s\t%s\t%s\t%s\n' "$(expected "$f")" "$f" own "$f"
  done
  printf '%s\t%s\t%s\t%s\n' "$(expected "$LANE1_UNIT")" "the unit tests of $LANE1_UNIT" \
    unit "$LANE1_UNIT $(printf -- '--ignore=%s ' $front_tests $H11_FUZZ)"
  printf '%s\t%s\t%s\t%s\n' "$(expected "$H11_FUZZ")" "the h11 differential" unit "$H11_FUZZ"
} | sort -t "$(printf '\t')" -k1,1nr | cut -f2- > "$work/queue"

next_item() {  # the queue's first item, taken off it (nothing once it is empty)
  flock "$work/queue.lock" sh -c 'head -n 1 "$1"; sed -i 1d "$1"' _ "$work/queue"
}
drain() {  # $1: the lane; runs the queue's items until none is left; 0 if all passed
  local rc=0 item label kind paths
  while item=$(next_item) && [ -n "$item" ]; do
    IFS=$'\t' read -r label kind paths <<<"$item"
    local how=(--durations=5)
    [ "$kind" = own ] && how=(--durations=15 -m "own_ray and not soak")
    # shellcheck disable=SC2086
    "$PY" -m pytest -q -p no:cacheprovider "${how[@]}" $paths || rc=1
    took "$label (lane $1)"
  done
  return $rc
}

(
  # shellcheck disable=SC2046
  "$PY" -m pytest -q -p no:cacheprovider --durations=15 tests/unit \
    $(printf -- '--ignore=%s ' $front_tests $H11_FUZZ "$LANE1_UNIT")
  unit_rc=$?
  took "tests/unit"
  PY="$PY" bash tests/sanitize.sh
  front_rc=$?
  took "the native front's tests, sanitized"
  drain 2
  queue_rc=$?
  [ "$unit_rc" = 0 ] && [ "$front_rc" = 0 ] && [ "$queue_rc" = 0 ]
) >"$work/lane2.log" 2>&1 &
lane2=$!
"$PY" -m pytest -q --durations=15 -m "not own_ray and not soak" tests/integration tests/e2e
ray_rc=$?
took "the session-Ray tests"
# The notebooks that start a Ray run beside those that need none (their output after).
RAY_NOTEBOOKS=(notebooks/03_serving_on_ray.ipynb)
"$PY" -m pytest -q -p no:cacheprovider --nbmake "${RAY_NOTEBOOKS[@]}" >"$work/nb.log" 2>&1 &
ray_nb=$!
# shellcheck disable=SC2046
"$PY" -m pytest -q -p no:cacheprovider --nbmake notebooks \
  $(printf -- '--ignore=%s ' "${RAY_NOTEBOOKS[@]}")
nb_rc=$?
wait "$ray_nb"
ray_nb_rc=$?
echo "---- the notebooks that start a Ray (${RAY_NOTEBOOKS[*]}), beside the above ----"
cat "$work/nb.log"
took "the notebooks"
drain 1
queue_rc=$?
wait "$lane2"
lane2_rc=$?
echo "---- lane 2 (ran beside the above): tests/unit, then items of the queue ----"
cat "$work/lane2.log"
echo "---- the suite took $(( $(date +%s) - start )) s ----"
[ "$ray_rc" = 0 ] && [ "$nb_rc" = 0 ] && [ "$ray_nb_rc" = 0 ] && [ "$queue_rc" = 0 ] &&
  [ "$lane2_rc" = 0 ]
