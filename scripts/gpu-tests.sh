#!/usr/bin/env bash
# Runs the mixer-cuda test binary on a machine with a GPU, every test included (the GPU tests are
# #[ignore]d so that `cargo test` on a machine without one reports them as ignored), as G
# processes side by side (each takes every G-th test name), with MIXERS_REQUIRE_CUDA=1 so that a
# test that finds no device fails instead of skipping. Prints each group's summary and every
# failure; the groups' logs go to $OUT (default /tmp).
#
#     scripts/gpu-tests.sh BINARY [G]      # e.g. target/release/deps/all-<hash>, G = 11
#
# Build the binary with `cargo test --release -p mixer-cuda --test all --no-run` (the path is in
# its output). Environment: T (seconds per group, default 420), TT (seconds for the timing tests,
# run alone after the groups, default 300), SHARD=i/n (only every n-th test from the i-th, from 0:
# the binary in n device calls, e.g. SHARD=0/2 then SHARD=1/2; the timing tests run with shard 0). The whole binary took about 290–380 s of wall time as
# 11 groups on one H200 (2026-12-03). Prints each group's summary, every failure and the tests
# that did not finish; exits 0 only when every test passed.
set -uo pipefail
bin=${1:?usage: scripts/gpu-tests.sh BINARY [G]}
groups=${2:-11}
out=${OUT:-/tmp}
export MIXERS_REQUIRE_CUDA=1
all=$("$bin" --list --include-ignored 2>/dev/null | sed -n 's/: test$//p')
if [ -n "${SHARD:-}" ]; then
  shard=${SHARD%/*} shards=${SHARD#*/}
  all=$(printf '%s\n' "$all" | awk -v i="$shard" -v n="$shards" '/_timing/ ? i == 0 : (NR - 1) % n == i')
fi
# The timing tests (names with `_timing`) run after the groups, one at a time: side by side they
# measure each other, and ten processes' large inputs ran an 80 GB H100 out of memory.
names=$(printf '%s\n' "$all" | grep -v '_timing')
timing=$(printf '%s\n' "$all" | grep '_timing')
echo "tests: $(printf '%s\n' "$all" | grep -c .) ($(printf '%s\n' "$timing" | grep -c .) timing tests last)"
rm -f "$out"/gpu-tests-*.log
for g in $(seq 0 $((groups - 1))); do
  picked=$(printf '%s\n' "$names" | awk -v g="$g" -v n="$groups" 'NR % n == g')
  # shellcheck disable=SC2086 # one argument per test name
  (timeout "${T:-420}" "$bin" --include-ignored --exact --test-threads=1 $picked >"$out/gpu-tests-$g.log" 2>&1
   echo "group $g: exit $?") &
done
wait
if [ -n "$timing" ]; then
  # shellcheck disable=SC2086 # one argument per test name
  timeout "${TT:-300}" "$bin" --include-ignored --exact --test-threads=1 $timing >"$out/gpu-tests-timing.log" 2>&1
  echo "timing tests: exit $?"
fi
grep -h "test result" "$out"/gpu-tests-*.log
grep -h -E "^test .* FAILED" "$out"/gpu-tests-*.log
# Tests that reported neither ok nor FAILED (their group hit the time limit).
done_tests=$(grep -h -E "^test .* \.\.\. (ok|FAILED)$" "$out"/gpu-tests-*.log | sed -E 's/^test (.*) \.\.\. (ok|FAILED)$/\1/')
unfinished=$(comm -23 <(printf '%s\n' "$all" | sort) <(printf '%s\n' "$done_tests" | sort))
[ -n "$unfinished" ] && printf 'unfinished: %s\n' $unfinished
grep -h -A25 "^---- " "$out"/gpu-tests-*.log | head -200
! grep -q -E "^test .* FAILED|^test result: FAILED" "$out"/gpu-tests-*.log && [ -z "$unfinished" ]
