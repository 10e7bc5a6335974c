#!/usr/bin/env bash
# Runs the GPU test suite (or the tests FILTER names, gtest's --gtest_filter syntax) in SHARDS
# processes at once, through gtest's sharding (each process takes every SHARDS-th test), and
# prints every test's verdict and one line of totals; exits non-zero where a shard fails or
# crashes. Most of a cooperative-matrix test's time is the driver compiling its kernels on the
# CPU, which the shards spread over the device machine's cores; the device itself runs them
# side by side. Its logs go to OUT_DIR (shard-N.txt).
# Usage: bash bench/gpu_tests.sh TEST_GPU_BINARY OUT_DIR [FILTER] [SHARDS]
#   FILTER defaults to every test (*), SHARDS to 4.
set -u
if [ $# -lt 2 ] || [ $# -gt 4 ]; then
  echo "usage: bash bench/gpu_tests.sh TEST_GPU_BINARY OUT_DIR [FILTER] [SHARDS]" >&2
  exit 2
fi
binary=$1 out=$2 filter=${3:-*} shards=${4:-4}
[ -x "$binary" ] || { echo "gpu_tests.sh: $binary is not an executable test binary" >&2; exit 2; }
case $shards in
  '' | *[!0-9]* | 0) echo "gpu_tests.sh: SHARDS '$shards' must be a positive integer" >&2; exit 2 ;;
esac
mkdir -p "$out" || exit 2
pids=()
for ((index = 0; index < shards; ++index)); do
  GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$index \
    "$binary" --gtest_filter="$filter" > "$out/shard-$index.txt" 2>&1 &
  pids+=($!)
done
failed_shards=0
for ((index = 0; index < shards; ++index)); do
  wait "${pids[$index]}"
  status=$?
  echo "shard $index exit $status" >> "$out/shard-$index.txt"
  [ "$status" = 0 ] || failed_shards=$((failed_shards + 1))
done
# A test's verdict appears when it ends and, for failures and skips, again in the summary.
verdicts=$(cat "$out"/shard-*.txt | grep -E '^\[ +(OK|FAILED|SKIPPED) +\] [A-Za-z]' | sort -u -k4,4)
echo "$verdicts" | grep -v '^$'
passed=$(echo "$verdicts" | grep -c '^\[       OK \]')
failed=$(echo "$verdicts" | grep -c '^\[  FAILED  \]')
skipped=$(echo "$verdicts" | grep -c '^\[  SKIPPED \]')
echo "gpu tests: $passed passed, $failed failed, $skipped skipped in $shards shards; $failed_shards shards exited non-zero (logs: $out)"
[ "$failed_shards" = 0 ]
