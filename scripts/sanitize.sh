#!/usr/bin/env bash
# The reliability checks of docs/RELIABILITY.md, run by scripts/test.sh after the suite:
# 1. the CPU tests (loaders, ops, switches) and a short GPU subset (kernel cache, device
#    selection) built with AddressSanitizer + UndefinedBehaviorSanitizer (build-sanitize/);
# 2. every fuzz target for FUZZ_SECONDS (default 10) from its seed corpus (build-fuzz/, clang).
# A finding fails the script. New inputs the fuzzer finds go to build-fuzz/corpus, never into
# the repository's seeds.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="$(nproc)"
fuzz_seconds="${FUZZ_SECONDS:-10}"

# Unoptimized: instrumented code builds in well under half the time at -O0 than at -O3, which
# dominates this script, and these tests run in seconds either way.
cmake -S . -B build-sanitize -G Ninja -DCMAKE_BUILD_TYPE=Release \
  "-DCMAKE_CXX_FLAGS_RELEASE=-O0 -DNDEBUG" -DMEGANEURA_SANITIZE=ON
cmake --build build-sanitize -j "$jobs" --target test_io test_config test_ops test_vk
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export MEGANEURA_CACHE_DIR="$PWD/build-sanitize/kernel-cache"
for test in test_io test_config test_ops; do
  ASAN_OPTIONS=detect_leaks=1 "build-sanitize/tests/$test" --gtest_brief=1
done
# The Vulkan loader and Mesa keep allocations until exit by design; leaks are checked on the CPU
# tests above, memory errors here.
ASAN_OPTIONS=detect_leaks=0 build-sanitize/tests/test_vk --gtest_brief=1 \
  --gtest_filter='PipelineCache*:DeviceSelection*:Buffer*'

cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=clang++ \
  -DMEGANEURA_FUZZ=ON -DMEGANEURA_TESTS=OFF
cmake --build build-fuzz -j "$jobs" --target fuzzers
for seeds in fuzz/corpus/*/; do
  loader="$(basename "$seeds")"
  mkdir -p "build-fuzz/corpus/$loader"
  "build-fuzz/fuzz/fuzz_$loader" -max_total_time="$fuzz_seconds" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 "build-fuzz/corpus/$loader" "$seeds" 2>&1 |
    grep -E "^(stat::number_of_executed_units|INFO: Seed|==|SUMMARY)|ERROR" || true
  test "${PIPESTATUS[0]}" -eq 0
done
