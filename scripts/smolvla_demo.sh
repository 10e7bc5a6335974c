#!/usr/bin/env bash
# SmolVLA demo: a synthetic control task (scripts/smolvla_demo_data.py: a point mass and a
# target drawn in a camera image, actions = controller velocities that reach the target), a
# small SmolVLA policy trained on it from random weights by flow matching, the held-out action
# error of sampled chunks before and after training, and one chunk from `meganeura act`.
#
#   scripts/smolvla_demo.sh                 # CI size: a tiny model, a minute or two on Lavapipe
#   SMOLVLA_DEMO_SIZE=full scripts/smolvla_demo.sh   # more data, a wider model, longer (a GPU)
#
# Variables: MEGANEURA (the binary, default build/meganeura), SMOLVLA_DEMO_OUT (default
# runs/smolvla_demo), SMOLVLA_DEMO_SIZE (ci or full). Exits non-zero unless the trained error
# is below half the untrained one.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
binary="${MEGANEURA:-$here/../build/meganeura}"
out="${SMOLVLA_DEMO_OUT:-runs/smolvla_demo}"
size="${SMOLVLA_DEMO_SIZE:-ci}"
case "$size" in
  ci) data_args=(--episodes 40 --image 32 --width 64 --layers 4); train_args=(--batch 8 --epochs 14 --lr 5e-3) ;;
  full) data_args=(--episodes 2000 --image 64 --width 256 --layers 8); train_args=(--batch 32 --epochs 10 --lr 3e-4) ;;
  *) echo "SMOLVLA_DEMO_SIZE must be ci or full" >&2; exit 2 ;;
esac
rm -rf "$out"
mkdir -p "$out"
python3 "$here/smolvla_demo_data.py" "$out" "${data_args[@]}"
"$binary" train --model "$out/policy" --data "$out/data" --out "$out/run" --validation 0.15 \
  --warmup 10 --checkpoint-every 100000 "${train_args[@]}" | tee "$out/train.txt"
"$binary" act "$out/run/model" --image "$out/data/frames/00000_0.png" --state "$(python3 -c "
import json; print(','.join(str(v) for v in json.loads(open('$out/data/episodes.jsonl').readline())['state']))")" \
  --instruction "move the blue dot onto the red dot" --repeat 3 > "$out/act.json"
echo "act: $(head -c 200 "$out/act.json")..."
python3 - "$out/train.txt" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
trained, untrained = map(float, re.search(r"held-out action error: ([\d.]+) \(untrained ([\d.]+)\)", text).groups())
print("held-out action error: %.4f trained, %.4f untrained (%.0f%% of it)" % (trained, untrained, 100 * trained / untrained))
sys.exit(0 if trained < 0.5 * untrained else 1)
PY
