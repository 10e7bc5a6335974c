#!/usr/bin/env bash
# The soak run of docs/RELIABILITY.md on the H200: transformers builds SmolLM2-135M with random
# weights (bench/llama_parity_h200.py's folder), and bench/soak.py trains it on the repository's
# documentation as text for $SECONDS_TOTAL seconds (default 480: one device call), killed
# $KILLS times (default 3) and resumed, checkpoints every $CHECKPOINT_EVERY steps (default 200).
# Run after `PART=none bash bench/workloads_h200.sh` (which unpacks the binaries to
# /tmp/mgbuild); results in $OUT/soak.
set -u
export LD_LIBRARY_PATH=/tmp/mglib/usr/lib/x86_64-linux-gnu:$PWD/.dev/lib
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export MEGANEURA_CACHE_DIR=/tmp/meganeura-cache PYTHONUNBUFFERED=1
folder=/tmp/soak-smollm2
python3 - "$folder" tests/fixtures/tokenizer/smollm2_like/tokenizer.json <<'PY'
import shutil, sys
import torch
from transformers import LlamaConfig, LlamaForCausalLM
folder, tokenizer = sys.argv[1:3]
config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                     num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                     rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True,
                     bos_token_id=0, eos_token_id=0)
torch.manual_seed(0)
LlamaForCausalLM(config).float().save_pretrained(folder, safe_serialization=True)
shutil.copy(tokenizer, f"{folder}/tokenizer.json")
PY
for i in $(seq 20); do cat README.md docs/*.md; done > /tmp/soak-text.txt
mkdir -p "$OUT/soak"
python3 bench/soak.py --binary /tmp/mgbuild/meganeura --model "$folder" --data /tmp/soak-text.txt \
  --out "$OUT/soak" --seconds "${SECONDS_TOTAL:-480}" --kills "${KILLS:-3}" \
  --checkpoint-every "${CHECKPOINT_EVERY:-200}"
