#!/usr/bin/env bash
# A class-conditional diffusion model on Fashion-MNIST: a small UNet2DConditionModel (the class
# given through cross-attention to a learned class embedding) trained in pixel space at 32 px,
# sampled per class with classifier-free guidance, and judged by the Fashion-MNIST classifier of
# 'meganeura train': the share of samples it labels as the class they were drawn for.
#
#   bash scripts/unet_demo.sh            # CI size: a short smoke run (Lavapipe: a minute or two)
#   UNET_DEMO=full bash scripts/unet_demo.sh   # the real run (a few minutes on an H200)
#   FASHION_MNIST=DIR                          # the data set's folder, if not the default
#
# Writes runs/unet-demo/: classifier/ (its checkpoint), unet-config/ (the U-Net's config.json),
# unet/ (checkpoint, metrics, training.png, model/ and ema/ diffusers folders, samples.png: one
# row per class) and samples.safetensors + samples.png from 'meganeura sample' on ema/.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${UNET_DEMO_OUT:-runs/unet-demo}
binary=${MEGANEURA:-./build/meganeura}
mkdir -p "$out/unet-config"

if [[ "${UNET_DEMO:-ci}" == full ]]; then
  channels='[64, 128, 256]'; down='["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"]'
  up='["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"]'; layers=2; groups=32
  classifier_args=(--epochs 3)
  train_args=(--batch 128 --epochs 12 --lr 5e-4 --warmup 500 --sample-steps 50 --per-class 10)
  sample_args=(--steps 50 --count 8)
else
  channels='[32, 64]'; down='["DownBlock2D", "CrossAttnDownBlock2D"]'
  up='["CrossAttnUpBlock2D", "UpBlock2D"]'; layers=1; groups=8
  classifier_args=(--epochs 1 --limit 6000)
  train_args=(--batch 2 --limit 512 --max-steps 4 --lr 1e-3 --sample-steps 3 --per-class 1)
  sample_args=(--steps 3 --count 1)
fi
if [[ -n "${FASHION_MNIST:-}" ]]; then
  classifier_args+=(--data "$FASHION_MNIST")
  train_args+=(--data "$FASHION_MNIST")
fi
cat > "$out/unet-config/config.json" <<JSON
{
  "_class_name": "UNet2DConditionModel",
  "in_channels": 1,
  "out_channels": 1,
  "sample_size": 32,
  "block_out_channels": $channels,
  "down_block_types": $down,
  "up_block_types": $up,
  "mid_block_type": "UNetMidBlock2DCrossAttn",
  "layers_per_block": $layers,
  "attention_head_dim": 4,
  "cross_attention_dim": 64,
  "norm_num_groups": $groups,
  "norm_eps": 1e-05,
  "flip_sin_to_cos": true,
  "freq_shift": 0,
  "act_fn": "silu"
}
JSON

# CLASSIFIER=CKPT reuses a classifier checkpoint instead of training one.
classifier=${CLASSIFIER:-$out/classifier/checkpoint.safetensors}
[[ -n "${CLASSIFIER:-}" ]] || "$binary" train --out "$out/classifier" --overwrite \
  "${classifier_args[@]}"
"$binary" train --model "$out/unet-config" --out "$out/unet" --overwrite --tokens 4 --guidance 2 \
  --classifier "$classifier" "${train_args[@]}"
"$binary" sample "$out/unet/ema" --guidance 2 --seed 1 --out "$out/samples.safetensors" \
  "${sample_args[@]}"
