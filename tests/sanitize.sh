#!/usr/bin/env bash
# The native front's tests, with the front built with AddressSanitizer and
# UndefinedBehaviorSanitizer: any report (an overflow, a use after free, undefined
# behaviour) fails the run. tests/run.sh runs the front's tests this way (only the
# differential fuzzer runs plainly too); where gcc has no libasan they run on the installed
# front, with a line saying so. `make test-sanitized` runs this alone.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
CC=${CC:-gcc}
# run only here (tests/run.sh leaves them out of the plain unit run)
FRONT_TESTS=(tests/unit/deployments/http/test_front.py tests/unit/deployments/http/test_front_hostile.py
             tests/unit/deployments/http/test_front_safety.py
             tests/unit/deployments/http/test_front_requests.py
             tests/unit/deployments/http/test_front_streams.py
             tests/unit/deployments/http/test_front_bounds.py)
# and the differential fuzzer, which also runs plainly with its 20,000 streams: here fewer
# (a sanitized front is slower), RAYBATCH_SANITIZED_FUZZ_STREAMS
FUZZ=tests/unit/deployments/http/test_front_differential.py
export RAYBATCH_FRONT_FUZZ_STREAMS=${RAYBATCH_SANITIZED_FUZZ_STREAMS:-3000}
asan=$("$CC" -print-file-name=libasan.so 2>/dev/null || true)
if [ "${1:-}" = --list ]; then printf '%s\n' "${FRONT_TESTS[@]}"; exit 0; fi
if [ -z "$asan" ] || [ ! -e "$asan" ]; then
  echo "note: no libasan for $CC (apt-get install gcc): the front's tests run unsanitized"
  exec "$PY" -m pytest -q -p no:cacheprovider "${FRONT_TESTS[@]}" "$FUZZ"
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
so="$out/_front$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')"
"$CC" -shared -fPIC -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined \
  -fno-sanitize-recover=undefined \
  -I"$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')" \
  -Ideployments/http/native/llhttp deployments/http/native/_front.c deployments/http/native/llhttp/{api,http,llhttp}.c \
  -o "$so"
# Python's own allocations are not the front's: leaks are not checked, everything else is.
LD_PRELOAD="$asan" ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 RAYBATCH_FRONT_SO="$so" \
  "$PY" -m pytest -q -p no:cacheprovider --durations=5 "${FRONT_TESTS[@]}" "$FUZZ"
