#!/usr/bin/env bash
# fuzz.sh PKG TARGET FUZZTIME: runs one fuzz target for FUZZTIME (make fuzz runs each).
#
# Go's fuzzing coordinator can end a run bounded by time with a bare "context deadline
# exceeded" and no failing input, when a worker is still busy as the time runs out on a
# loaded machine (golang/go#75804; fixed in Go 1.27). Such a run has found nothing and
# counts as passed, with a line saying so. A run that wrote a failing input under
# PKG/testdata/fuzz/TARGET, or failed in any other way, fails. So does one that was
# minimizing a failing input when the time ran out: the coordinator then writes the
# input and still reports the bare deadline, and the listing stays the same if the
# file was there under that name before; a write that failed adds its error below
# the deadline's line. Only a failure whose report is that one line passes.
set -uo pipefail
pkg=$1 target=$2 fuzztime=$3
GO=${GO:-go}
corpus="$pkg/testdata/fuzz/$target"
before=$(ls "$corpus" 2>/dev/null)
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$GO" test -run '^$' -fuzz "^$target\$" -fuzztime "$fuzztime" "$pkg" 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] && exit 0
# report: the lines between the one "--- FAIL" and the "FAIL" that ends it.
report=$(awk '/^--- FAIL/ { on = 1; next } /^FAIL$/ { on = 0 } on' "$out")
if [ "$(ls "$corpus" 2>/dev/null)" = "$before" ] &&
  [ "$(grep -c -- '^--- FAIL' "$out")" -eq 1 ] &&
  [ "$report" = '    context deadline exceeded' ] &&
  ! grep -q '^fuzz: minimizing' "$out"; then
  echo "fuzz.sh: $target ended with Go's 'context deadline exceeded' and wrote no failing input (golang/go#75804): nothing found" >&2
  exit 0
fi
exit "$rc"
