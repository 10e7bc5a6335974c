#!/usr/bin/env bash
# Installs, builds and runs the whole test suite (CPU reference, Vulkan on whatever device is
# present: Lavapipe in CI, with the validation layer on in the GPU tests), then the sanitizer
# and fuzz checks of scripts/sanitize.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
export MEGANEURA_CACHE_DIR="${MEGANEURA_CACHE_DIR:-$PWD/build/kernel-cache}"
(cd build && ctest --output-on-failure -j "$(nproc)" --timeout 900)
# Sanitizers and a short fuzz run of every loader (docs/RELIABILITY.md);
# MEGANEURA_SKIP_SANITIZE=1 leaves them out.
if [ "${MEGANEURA_SKIP_SANITIZE:-0}" != 1 ]; then
  bash scripts/sanitize.sh
fi
