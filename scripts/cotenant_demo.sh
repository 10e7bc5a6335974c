#!/usr/bin/env bash
# The co-tenancy case study (docs/EMBEDDING.md): an offscreen Vulkan app renders at a fixed rate
# while Meganeura fine-tunes the Fashion CNN on the same device and queue in chunks. Prints frame
# times and missed frames with and without training, training steps/s, and a JSON line.
#   bash scripts/cotenant_demo.sh            # small: 20 Hz, 128x128 (Lavapipe: a minute at most)
#   FULL=1 bash scripts/cotenant_demo.sh     # the study's setting on a GPU: 90 Hz, 2048x2048
#   RECORD=1 ...                             # chunks recorded into the app's own command buffers
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/examples/cotenant/cotenant ] || bash scripts/build.sh
if [ "${FULL:-0}" = 1 ]; then
  exec build/examples/cotenant/cotenant --hz 90 --seconds 10 --size 2048 --triangles 200000 \
    --shading 32 --model cnn --batch 256 --budget-ms 2 --train-ms-per-frame "${TRAIN_MS:-7}" \
    --record "${RECORD:-0}"
fi
exec build/examples/cotenant/cotenant --hz 20 --seconds 3 --size 128 --triangles 500 \
  --shading 2 --model cnn --batch 8 --budget-ms 10 --chunks-per-frame 1 --record "${RECORD:-0}"
