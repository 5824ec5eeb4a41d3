#!/usr/bin/env bash
# The Array API test suite (data-apis/array-api-tests) run against replicate.numpy, and a table of
# its results: passed, failed by reason, skipped (bench/array_api_table.py).
#
# Fetches nothing: ARRAY_API_TESTS_DIR (default /tmp/array-api-tests) is a checkout of the suite
# with its array-api submodule checked out at the commit the suite pins (bench/RESULTS.md,
# "Array API", has the commands). It is copied to a temporary folder and patched there in two
# lines (array_api_table.py --patch: the suite's import fails for a library without complex
# dtypes, which it otherwise supports through ARRAY_API_TESTS_SKIP_DTYPES). Needs pytest,
# pytest-xdist, hypothesis, ndindex and pytest-json-report (pip install 'replicate[bench]').
#
#   bench/array_api.sh [MAX_EXAMPLES (20)] [JOBS (2)]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
suite=${ARRAY_API_TESTS_DIR:-/tmp/array-api-tests}
examples=${1:-20}
jobs=${2:-2}
if [ ! -f "$suite/array_api_tests/__init__.py" ] || [ ! -d "$suite/array-api/src/array_api_stubs" ]; then
    echo "no array-api-tests checkout with its array-api submodule at $suite" \
         "(set ARRAY_API_TESTS_DIR; bench/RESULTS.md, \"Array API\", says how to make one)" >&2
    exit 2
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tar -C "$suite" --exclude=.git -cf - . | (mkdir "$work/suite" && tar -C "$work/suite" -xf -)
python "$root/bench/array_api_table.py" --patch "$work/suite"
cd "$work/suite"
export ARRAY_API_TESTS_MODULE=replicate.numpy ARRAY_API_TESTS_SKIP_DTYPES=complex64,complex128
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
report=${ARRAY_API_REPORT:-$work/report.json}  # (set it to keep the report)
start=$(date +%s)
python -m pytest array_api_tests -q -p no:cacheprovider --max-examples="$examples" --derandomize \
    --disable-deadline --disable-extension fft --json-report --json-report-file="$report" \
    -n "$jobs" >"$work/log.txt" 2>&1 || true
echo "array-api-tests $(git -C "$suite" rev-parse --short HEAD 2>/dev/null || echo '?') against" \
     "replicate.numpy: --max-examples=$examples, $jobs workers, $(( $(date +%s) - start )) s"
python "$root/bench/array_api_table.py" "$report"
