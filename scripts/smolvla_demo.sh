#!/usr/bin/env bash
# SmolVLA demo: a synthetic control task (scripts/smolvla_demo_data.py: a point mass and a
# target drawn in a camera image, actions = controller velocities that reach the target), a
# small SmolVLA policy trained on it from random weights by flow matching, the held-out action
# error of sampled chunks before and after training, and one chunk from `meganeura act`.
#
#   scripts/smolvla_demo.sh                 # CI size: a tiny model (CTest's Demo.SmolVLA)
#   SMOLVLA_DEMO_SIZE=full scripts/smolvla_demo.sh   # more data, a wider model, longer (a GPU)
#
# The CI size draws each target from 4 places and draws it large in a 16 px image, which a tiny
# model learns to find within its short run (a small target anywhere on the table it does not);
# the full size puts a small target anywhere.
# Variables: MEGANEURA (the binary, default build/meganeura), SMOLVLA_DEMO_OUT (default
# runs/smolvla_demo), SMOLVLA_DEMO_SIZE (ci or full). Exits non-zero unless the trained error
# is below half the untrained one and below that of the best blind guess (the training
# records' mean chunk, which ignores image and state), so the policy must have looked.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
binary="${MEGANEURA:-$here/../build/meganeura}"
out="${SMOLVLA_DEMO_OUT:-runs/smolvla_demo}"
size="${SMOLVLA_DEMO_SIZE:-ci}"
validation=0.1
case "$size" in
  ci) data_args=(--episodes 100 --targets 4 --target-radius 3 --image 16 --width 64 --layers 2)
      train_args=(--batch 8 --epochs 9 --lr 2e-3) ;;
  full) data_args=(--episodes 2000 --image 64 --width 256 --layers 8)
        train_args=(--batch 32 --epochs 10 --lr 3e-4) ;;
  *) echo "SMOLVLA_DEMO_SIZE must be ci or full" >&2; exit 2 ;;
esac
rm -rf "$out"
mkdir -p "$out"
python3 "$here/smolvla_demo_data.py" "$out" "${data_args[@]}"
"$binary" train --model "$out/policy" --data "$out/data" --out "$out/run" \
  --validation "$validation" --warmup 10 --checkpoint-every 100000 "${train_args[@]}" |
  tee "$out/train.txt"
"$binary" act "$out/run/model" --image "$out/data/frames/00000_0.png" --state "$(python3 -c "
import json; print(','.join(str(v) for v in json.loads(open('$out/data/episodes.jsonl').readline())['state']))")" \
  --instruction "move the blue dot onto the red dot" --repeat 3 > "$out/act.json"
echo "act: $(head -c 200 "$out/act.json")..."
python3 - "$out" "$validation" <<'PY'
import json, re, sys
out, validation = sys.argv[1], float(sys.argv[2])
text = open(f"{out}/train.txt").read()
trained, untrained = map(float, re.search(r"held-out action error: ([\d.]+) \(untrained ([\d.]+)\)", text).groups())
# The training job holds out the highest-numbered episodes, round(validation * episodes) of them.
records = [json.loads(line) for line in open(f"{out}/data/episodes.jsonl")]
episodes = sorted({record["episode"] for record in records})
first_held = episodes[-min(max(int(validation * len(episodes) + 0.5), 1), len(episodes) - 1)]
training = [record["actions"] for record in records if record["episode"] < first_held]
held = [record["actions"] for record in records if record["episode"] >= first_held]
mean = [[sum(chunk[t][d] for chunk in training) / len(training) for d in range(len(training[0][0]))]
        for t in range(len(training[0]))]
blind = sum(abs(chunk[t][d] - mean[t][d]) for chunk in held for t in range(len(mean))
            for d in range(len(mean[0]))) / (len(held) * len(mean) * len(mean[0]))
print("held-out action error: %.4f trained, %.4f untrained (%.0f%% of it), %.4f blind guess"
      % (trained, untrained, 100 * trained / untrained, blind))
sys.exit(0 if trained < 0.5 * untrained and trained < blind else 1)
PY
