#!/usr/bin/env bash
# A class-conditional diffusion model on Fashion-MNIST: a small UNet2DConditionModel (the class
# given through cross-attention to a learned class embedding) trained in pixel space at 32 px,
# sampled per class with classifier-free guidance, and judged by the Fashion-MNIST classifier of
# 'meganeura train': the share of samples it labels as the class they were drawn for.
#
#   bash scripts/unet_demo.sh            # CI size: a short smoke run (CTest's Demo.UNet)
#   UNET_DEMO=full bash scripts/unet_demo.sh   # the real run (a few minutes on an H200)
#   FASHION_MNIST=DIR                          # the data set's folder, if not the default
#
# Writes runs/unet-demo/: classifier/ (its checkpoint), unet-config/ (the U-Net's config.json),
# unet/ (checkpoint, metrics, training.png, model/ and ema/ diffusers folders, samples.png: one
# row per class) and samples.safetensors + samples.png from 'meganeura sample' on ema/.
# Exits non-zero unless both grids are PNGs of one row a class with some contrast and the sampled
# values are finite; the full run also needs the classifier to label at least 80 % of the
# samples as the class they were drawn for (the CI run trains far too briefly for that).
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
  minimum_labelled=80
else
  channels='[32, 64]'; down='["DownBlock2D", "CrossAttnDownBlock2D"]'
  up='["CrossAttnUpBlock2D", "UpBlock2D"]'; layers=1; groups=8
  classifier_args=(--epochs 1 --limit 2000)
  train_args=(--batch 2 --limit 512 --max-steps 4 --lr 1e-3 --sample-steps 2 --per-class 1)
  sample_args=(--steps 2 --count 1)
  minimum_labelled=0
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
  --classifier "$classifier" "${train_args[@]}" | tee "$out/train.txt"
"$binary" sample "$out/unet/ema" --guidance 2 --seed 1 --out "$out/samples.safetensors" \
  "${sample_args[@]}"

python3 - "$out" "$minimum_labelled" <<'PY'
import json, math, re, struct, sys, zlib
out, minimum_labelled = sys.argv[1], float(sys.argv[2])

def grid_cells(path):
    """Checks that a PNG is a grid of 32 px cells (2 px apart) with contrast; returns the count."""
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        sys.exit(f"unet_demo: {path} is not a PNG")
    position, idat = 8, b""
    while position < len(data):
        length, kind = struct.unpack(">I4s", data[position:position + 8])
        if kind == b"IHDR":
            width, height = struct.unpack(">II", data[position + 8:position + 16])
        if kind == b"IDAT":
            idat += data[position + 8:position + 8 + length]
        position += 12 + length
    distinct = len(set(zlib.decompress(idat)))
    if (width - 2) % 34 or (height - 2) % 34 or distinct < 16:
        sys.exit(f"unet_demo: {path} is {width}x{height} with {distinct} distinct bytes")
    return (width - 2) // 34 * ((height - 2) // 34)

def sample_values(path):
    data = open(path, "rb").read()
    size = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + size])
    values = []
    for name, entry in header.items():
        if name != "__metadata__" and entry["dtype"] == "F32":
            begin, end = entry["data_offsets"]
            raw = data[8 + size + begin:8 + size + end]
            values += struct.unpack(f"<{len(raw) // 4}f", raw)
    return values

for grid in (f"{out}/unet/samples.png", f"{out}/samples.png"):
    cells = grid_cells(grid)
    if cells == 0 or cells % 10:
        sys.exit(f"unet_demo: {grid} has {cells} samples, not the same number for each of 10 classes")
values = sample_values(f"{out}/samples.safetensors")
if not values or not all(math.isfinite(v) for v in values) or max(values) == min(values):
    sys.exit(f"unet_demo: {out}/samples.safetensors holds no finite, varied samples")
labelled = float(re.search(r"labels as their class: ([\d.]+)%", open(f"{out}/train.txt").read())[1])
print(f"unet_demo: sample grids written; the classifier labels {labelled:.1f} % of the samples as their class")
if labelled < minimum_labelled:
    sys.exit(f"unet_demo: below the {minimum_labelled:.0f} % bar")
PY
