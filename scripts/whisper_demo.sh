#!/usr/bin/env bash
# Speech recognition trained from scratch: espeak-ng speaks digit strings and short phrases in
# several voices and speeds; a randomly initialised Whisper folder (scripts/make_whisper_folder.py)
# is trained on some voices with `meganeura train`, and `meganeura transcribe` transcribes the
# held-out voices before and after. Prints the word error rate of both; exits 1 unless it fell.
#
#   scripts/whisper_demo.sh [WORK_DIR]
#
# Environment:
#   WHISPER_DEMO_SIZE=ci|tiny   ci (default): a small model and data set for a CPU device
#                               (Lavapipe; CTest runs it as Demo.Whisper); tiny: whisper-tiny's
#                               shape and more speech, for a GPU
#   MEGANEURA=path              the binary (default build/meganeura)
#   MEGANEURA_DEVICE            the device, as everywhere
#   PYTHON=path                 the Python with numpy (default /usr/bin/python3)
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
work="${1:-$(mktemp -d /tmp/whisper-demo.XXXXXX)}"
size="${WHISPER_DEMO_SIZE:-ci}"
meganeura="${MEGANEURA:-$here/../build/meganeura}"
python="${PYTHON:-/usr/bin/python3}"
command -v espeak-ng >/dev/null || { echo "whisper_demo: espeak-ng is not installed (scripts/setup.sh installs it)" >&2; exit 1; }
[ -x "$meganeura" ] || { echo "whisper_demo: no binary at $meganeura: build it or set MEGANEURA" >&2; exit 1; }

case "$size" in
  ci)   clips=6;  speeds="150 190";     epochs=12; batch=8;  lr=2e-3; chunk=3 ;;
  tiny) clips=40; speeds="130 160 190"; epochs=30; batch=16; lr=5e-4; chunk=30 ;;
  *) echo "whisper_demo: WHISPER_DEMO_SIZE must be ci or tiny" >&2; exit 1 ;;
esac
train_voices="en-us en-us+m3 en-gb+f2 en-gb-scotland en-gb-x-rp+m1 en-029+f4"
test_voices="en+m7 en-gb-x-gbclan+f1"

# Clips of an earlier run in the same folder would join the sets: start them empty.
rm -rf "$work/train" "$work/test"
mkdir -p "$work/train" "$work/test"
echo "whisper_demo: speech in $work ($size)"
# The utterances: digit strings (seeded, the same for every voice) and a few phrases.
"$python" - "$work" "$clips" <<'EOF'
import random, sys
work, clips = sys.argv[1], int(sys.argv[2])
digits = "zero one two three four five six seven eight nine".split()
phrases = ["hello world", "good morning", "thank you", "stop now", "go left", "turn right"]
rng = random.Random(7)
lines = [" ".join(rng.choice(digits) for _ in range(rng.randint(1, 3))) for _ in range(clips)]
lines += phrases[: max(2, clips // 3)]
with open(f"{work}/utterances.txt", "w") as file:
    file.write("\n".join(lines) + "\n")
EOF
make_set() {  # folder, voices
  local folder=$1 voices=$2 n=0
  while IFS= read -r text; do
    for voice in $voices; do
      for speed in $speeds; do
        n=$((n + 1))
        espeak-ng -v "$voice" -s "$speed" -w "$folder/clip$n.wav" "$text"
        printf '%s\n' "$text" > "$folder/clip$n.txt"
      done
    done
  done < "$work/utterances.txt"
  echo "whisper_demo: $(ls "$folder"/*.wav | wc -l) clips in $folder"
}
make_set "$work/train" "$train_voices"
make_set "$work/test" "$test_voices"

"$python" "$here/make_whisper_folder.py" --out "$work/initial" --corpus "$work/utterances.txt" \
  --size "$size" --chunk-seconds "$chunk" --merges 80

word_error_rate() {  # model folder -> prints the WER in percent of the held-out set
  "$meganeura" transcribe "$1" "$work"/test/*.wav --json --max-tokens 24 > "$work/transcripts.jsonl"
  "$python" - "$work/transcripts.jsonl" <<'EOF'
import json, sys
errors = words = 0
for line in open(sys.argv[1]):
    result = json.loads(line)
    reference = open(result["file"][:-4] + ".txt").read().split()
    hypothesis = result["text"].split()
    # Levenshtein distance over words.
    row = list(range(len(hypothesis) + 1))
    for i, word in enumerate(reference, 1):
        previous, row[0] = row[0], i
        for j, guess in enumerate(hypothesis, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (word != guess))
    errors += row[-1]
    words += len(reference)
print(f"{100.0 * errors / words:.1f}")
EOF
}

before=$(word_error_rate "$work/initial")
echo "whisper_demo: word error rate before training: $before %"
"$meganeura" train --model "$work/initial" --data "$work/train" --out "$work/run" --overwrite \
  --epochs "$epochs" --batch "$batch" --lr "$lr" --warmup 20 --validation 0 \
  --checkpoint-every 100000
after=$(word_error_rate "$work/run/model")
echo "whisper_demo: word error rate on held-out voices: $before % before training, $after % after"
head -n 4 "$work/transcripts.jsonl" | "$python" -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print("  %-40s -> %s" % (open(r["file"][:-4] + ".txt").read().strip(), r["text"]))'
"$python" -c "import sys; sys.exit(0 if float('$after') < float('$before') else 1)" ||
  { echo "whisper_demo: the word error rate did not fall" >&2; exit 1; }
