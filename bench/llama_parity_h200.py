"""SmolLM2-135M parity on the GPU machine (issue 33's gates), and the folder round trip a new
user makes: transformers builds LlamaForCausalLM at SmolLM2-135M's exact config with random
weights and save_pretrained; Meganeura loads that folder.

  strict: forward logits rel. L2 < 1e-4, every parameter's gradient norm within 1e-3,
          64 greedy tokens identical to transformers' generate;
  fast:   logits rel. L2 < 1e-2, gradient norms within 5e-2.
Then `meganeura train --model` fine-tunes the folder for a few steps, and transformers opens the
folder it writes: its logits must equal Meganeura's of the same folder (rel. L2 < 1e-4).

Usage: python3 bench/llama_parity_h200.py BIN_DIR TOKENIZER_JSON OUT_DIR
(BIN_DIR holds the meganeura and llama_parity binaries; TOKENIZER_JSON is copied into the folder.)
Prints one JSON line per check and a table; exits 1 if a gate fails.
"""
import json
import os
import subprocess
import sys

import torch

bin_dir, tokenizer_json, out = sys.argv[1:4]
os.makedirs(out, exist_ok=True)
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
from transformers import LlamaForCausalLM  # noqa: E402

from smollm2_folder import write_smollm2_folder  # noqa: E402

folder = os.path.join(out, "smollm2-135m")
model = write_smollm2_folder(folder, tokenizer_json).cuda()

generator = torch.Generator().manual_seed(1)
ids = torch.randint(0, 49152, (1, 128), generator=generator)
with open(os.path.join(out, "ids.json"), "w") as f:
    json.dump(ids[0].tolist(), f)
model.zero_grad()
result = model(input_ids=ids.cuda(), labels=ids.cuda())
result.loss.backward()
reference_logits = result.logits.detach().double().cpu().flatten()
reference_norms = {n: float(p.grad.double().norm()) for n, p in model.named_parameters()}
results, failures = [], []


def record(check, value, bound, **extra):
    row = {"check": check, "value": value, "bound": bound, "pass": bool(value < bound), **extra}
    results.append(row)
    print(json.dumps(row), flush=True)
    if not row["pass"]:
        failures.append(check)


def relative_l2(a, b):
    return float((a - b).norm() / b.norm())


def meganeura_logits(precision, model_dir, tag):
    path = os.path.join(out, f"meganeura_{tag}_{precision}.json")
    subprocess.run([os.path.join(bin_dir, "llama_parity"), model_dir, os.path.join(out, "ids.json"),
                    path, precision], check=True)
    with open(path) as f:
        return json.load(f)


for precision, logit_bound, norm_bound in (("strict", 1e-4, 1e-3), ("fast", 1e-2, 5e-2)):
    ours = meganeura_logits(precision, folder, "random")
    record(f"logits {precision}", relative_l2(torch.tensor(ours["logits"], dtype=torch.float64),
                                              reference_logits), logit_bound)
    worst_name, worst = None, 0.0
    for name, expected in reference_norms.items():
        error = abs(ours["gradient_norms"][name] - expected) / max(expected, 1e-30)
        if error >= worst:
            worst_name, worst = name, error
    record(f"gradient norms {precision} (worst parameter)", worst, norm_bound, parameter=worst_name,
           loss_scale=ours["loss_scale"])

# 64 greedy tokens from a 16-token prompt given as text through the tokenizer.
prompt = "The meganeura was a giant dragonfly of the late Carboniferous,"
from tokenizers import Tokenizer  # noqa: E402
prompt_ids = Tokenizer.from_file(tokenizer_json).encode(prompt, add_special_tokens=False).ids
with torch.no_grad():
    expected = model.generate(torch.tensor([prompt_ids]).cuda(), max_new_tokens=64, min_new_tokens=64,
                              do_sample=False)[0, len(prompt_ids):].tolist()
run = subprocess.run([os.path.join(bin_dir, "meganeura"), "generate", folder, "--prompt", prompt,
                      "--max-tokens", "64", "--temperature", "0", "--json"],
                     check=True, capture_output=True, text=True)
generated = json.loads(run.stdout)
agree = 0
while agree < min(len(expected), len(generated["generated_ids"])) and \
        expected[agree] == generated["generated_ids"][agree]:
    agree += 1
record("greedy tokens differing (of 64)", 64 - agree, 1,
       prompt_ids_equal=generated["prompt_ids"] == prompt_ids,
       decode_tokens_per_second=generated["decode_tokens_per_second"])
if generated["prompt_ids"] != prompt_ids:
    failures.append("prompt ids")

# Fine-tune a few steps, then transformers opens the folder that train writes.
with open(os.path.join(out, "text.jsonl"), "w") as f:
    for i in range(400):
        f.write(json.dumps({"text": f"Line {i}: the dragonfly flew {i % 7} times over the swamp."}) + "\n")
run_dir = os.path.join(out, "finetune")
subprocess.run([os.path.join(bin_dir, "meganeura"), "train", "--model", folder, "--data",
                os.path.join(out, "text.jsonl"), "--out", run_dir, "--seq", "64", "--batch", "4",
                "--max-steps", "20", "--lr", "1e-4"], check=True)
tuned = LlamaForCausalLM.from_pretrained(os.path.join(run_dir, "model")).cuda().float()
with torch.no_grad():
    tuned_logits = tuned(input_ids=ids.cuda()).logits.double().cpu().flatten()
ours = meganeura_logits("strict", os.path.join(run_dir, "model"), "tuned")
record("fine-tuned folder reopened in transformers: logits",
       relative_l2(torch.tensor(ours["logits"], dtype=torch.float64), tuned_logits), 1e-4,
       changed_from_start=relative_l2(tuned_logits, reference_logits))

with open(os.path.join(out, "parity.json"), "w") as f:
    json.dump(results, f, indent=1)
print("\n%-52s %12s %10s %s" % ("check", "value", "bound", "result"))
for row in results:
    print("%-52s %12.3g %10.0e %s" % (row["check"], row["value"], row["bound"], "pass" if row["pass"] else "FAIL"))
sys.exit(1 if failures else 0)
