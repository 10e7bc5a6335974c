#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine: install, build, train a CNN on Fashion-MNIST on the
# best available GPU (Lavapipe when there is none), save a checkpoint, then deploy it for
# inference on the test set.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
out=runs/quickstart
./build/meganeura train --out "$out" --overwrite
./build/meganeura infer "$out/checkpoint.safetensors"
