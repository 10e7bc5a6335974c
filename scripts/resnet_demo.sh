#!/usr/bin/env bash
# ResNet on real images end to end: Fashion-MNIST written out as an image folder of 64x64 PNGs
# (meganeura fashion-folder), a ResNet trained on it (meganeura train --model ...), then the
# checkpoint classifying test images (meganeura infer). Prints the test accuracy and images/s.
#
# The default is sized for CI on Lavapipe (CTest runs it as Demo.ResNet): a ResNet-18 of width 8
# on the first 1000 images of each split for 3 epochs. RESNET_DEMO_FULL=1 runs the full one on a
# GPU: torchvision's ResNet-50 on all 60000 training images, evaluated on the 10000 test images;
# where torchvision and CUDA are installed it prints PyTorch's training images/s for the same
# network and batch beside ours (bench/resnet_demo_pytorch.py). Exits 1 unless the test accuracy
# reaches the size's bar: 50 % at CI size (chance is 10 %), 90 % for the full run.
# MEGANEURA_DEMO_PRECISION=fast uses f16 operands; FASHION_MNIST=DIR reads the data set from DIR
# instead of the default folder.
set -euo pipefail
cd "$(dirname "$0")/.."
binary=${MEGANEURA:-./build/meganeura}
out=${RESNET_DEMO_DIR:-runs/resnet_demo}
precision=${MEGANEURA_DEMO_PRECISION:-strict}
if [ "${RESNET_DEMO_FULL:-0}" = 1 ]; then
  folder_options=()
  train_options=(--model resnet50 --epochs 12 --batch 128 --lr 2e-3 --min-crop 0.5)
  minimum_accuracy=90
else
  folder_options=(--limit 1000)
  train_options=(--model resnet18 --width 8 --epochs 3 --batch 32 --lr 3e-3 --min-crop 0.5)
  minimum_accuracy=50
fi

data="$out/fashion-64"
mkdir -p "$out"
# The image folder is made once and kept for reruns; it is written beside and renamed when
# complete, so an interrupted run leaves nothing half-written to reuse.
if [ ! -d "$data" ]; then
  rm -rf "$data.partial"
  "$binary" fashion-folder "$data.partial" --size 64 "${folder_options[@]}" \
    ${FASHION_MNIST:+--data "$FASHION_MNIST"}
  mv "$data.partial" "$data"
fi
rm -rf "$out/run"
"$binary" train --data "$data" --size 64 --out "$out/run" --precision "$precision" \
  "${train_options[@]}" | tee "$out/train.txt"
"$binary" infer "$out/run/checkpoint.safetensors" --data "$data/test" \
  --precision "$precision" | tee "$out/infer.txt"
"$binary" infer "$out/run/checkpoint.safetensors" \
  "$(find "$data/test/9-ankle-boot" -name '*.png' | sort | head -n 1)"
echo "meganeura $(grep 'images/s' "$out/train.txt" | tail -n 1)"
if [ "${RESNET_DEMO_FULL:-0}" = 1 ] &&
  python3 -c "import torch, torchvision; assert torch.cuda.is_available()" 2>/dev/null; then
  python3 bench/resnet_demo_pytorch.py 50 64 128 "$precision"
fi
accuracy=$(sed -n 's/^accuracy: \([0-9.]*\)%$/\1/p' "$out/infer.txt")
echo "test accuracy: $accuracy % (the bar: $minimum_accuracy %)"
awk -v accuracy="$accuracy" -v bar="$minimum_accuracy" 'BEGIN { exit !(accuracy >= bar) }' ||
  { echo "resnet_demo: the test accuracy is below $minimum_accuracy %" >&2; exit 1; }
