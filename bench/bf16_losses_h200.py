"""Issue 40's bf16 check on the GPU machine: the losses of 200 training steps in --precision bf16
track strict f32 within the usual mixed-precision noise, for SmolLM2-135M and ResNet-50.

  SmolLM2-135M: transformers builds LlamaForCausalLM at SmolLM2-135M's config with random weights
      (save_pretrained); `meganeura train` fine-tunes it on tests/fixtures/tokenizer/corpus.txt
      (seq 128, batch 8, lr 5e-4, 200 steps) in strict, fast and bf16 from the same weights and
      batches. The yardstick: the same model trained by PyTorch in f32 and under autocast to
      bfloat16 (batches cut from the same corpus by the same tokenizer, AdamW with warmup and
      cosine), whose two loss curves differ by what bf16 mixed precision costs there.
  ResNet-50: `meganeura fashion-folder` writes Fashion-MNIST at 64 px (4096 images); `meganeura
      train --model resnet50` runs 200 steps of batch 64 in strict, fast and bf16.

The figure per run: the mean over steps 101-200 of |loss - strict loss| / strict loss (each
precision against its own framework's f32). bf16 passes where that is below the largest of 2 %,
twice PyTorch's own bf16 figure and twice the workload's fast (f16) figure, the mixed-precision
noise measured beside it. Prints one JSON line per run and a table.

Usage: python3 bench/bf16_losses_h200.py MEGANEURA_BINARY TOKENIZER_JSON FASHION_DIR OUT_DIR
       [WORKLOADS]
WORKLOADS: smollm2, resnet50 or both, comma-separated (default both); FASHION_DIR is unread
without resnet50.
"""
import gzip
import json
import math
import os
import shutil
import subprocess
import sys

import torch

binary, tokenizer_json, fashion_dir, out = sys.argv[1:5]
workloads = set((sys.argv[5] if len(sys.argv) > 5 else "smollm2,resnet50").split(","))
if not workloads or not workloads <= {"smollm2", "resnet50"}:
    sys.exit(f"bf16_losses_h200.py: WORKLOADS {sys.argv[5]!r} names none or others than smollm2 "
             "and resnet50 (comma-separated)")
os.makedirs(out, exist_ok=True)
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
STEPS, LR, SEQ, BATCH = 200, 5e-4, 128, 8
PRECISIONS = ("strict", "fast", "bf16")


def losses_of(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    return {r["step"]: r["loss"] for r in records if "loss" in r and "step" in r}


def deviation(losses, reference):
    steps = [s for s in range(STEPS // 2 + 1, STEPS + 1) if s in losses and s in reference]
    return sum(abs(losses[s] - reference[s]) / reference[s] for s in steps) / len(steps)


def train(run_dir, arguments, precision):
    shutil.rmtree(run_dir, ignore_errors=True)
    run = subprocess.run([binary, "train", *arguments, "--precision", precision, "--out", run_dir,
                          "--max-steps", str(STEPS), "--log-every", "1"],
                         check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    # A device without the precision's matrices falls back to strict and says so: then the run
    # would compare strict with strict.
    if f"precision: {precision} (" not in run.stderr and precision != "strict":
        sys.exit(f"{precision} did not run on cooperative matrices: " +
                 next((line for line in run.stderr.splitlines() if "precision:" in line), "?"))
    return losses_of(run_dir)


rows = []


def record(workload, precision, losses, reference):
    row = {"workload": workload, "precision": precision, "first_loss": losses[1],
           "last_loss": losses[STEPS], "mean_relative_deviation": deviation(losses, reference)}
    rows.append(row)
    print(json.dumps(row), flush=True)


def smollm2_losses():
    """Ours in every precision, then PyTorch's f32 and bf16 autocast; returns all four and
    PyTorch's own bf16 figure."""
    from transformers import LlamaForCausalLM
    from tokenizers import Tokenizer

    from smollm2_folder import write_smollm2_folder

    folder = os.path.join(out, "smollm2-135m")
    write_smollm2_folder(folder, tokenizer_json)
    corpus = os.path.join(out, "corpus.txt")
    with gzip.open("tests/fixtures/tokenizer/corpus.txt.gz", "rb") as source, \
            open(corpus, "wb") as f:
        f.write(source.read())

    ours = {p: train(os.path.join(out, f"smollm2-{p}"),
                     ["--model", folder, "--data", corpus, "--seq", str(SEQ), "--batch",
                      str(BATCH), "--epochs", "3", "--lr", str(LR)], p) for p in PRECISIONS}
    for p in PRECISIONS:
        record("smollm2-135m", p, ours[p], ours["strict"])

    with open(corpus, encoding="utf-8") as f:
        ids = Tokenizer.from_file(tokenizer_json).encode(f.read(), add_special_tokens=False).ids
    sequences = torch.tensor(ids[:len(ids) // (SEQ + 1) * (SEQ + 1)]).view(-1, SEQ + 1)
    order = torch.randperm(len(sequences), generator=torch.Generator().manual_seed(0))

    def pytorch_losses(bf16):
        torch.manual_seed(0)
        model = LlamaForCausalLM.from_pretrained(folder).float().cuda()
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
        warmup = STEPS // 10

        def factor(step):
            if step < warmup:
                return (step + 1) / warmup
            return 0.5 * (1 + math.cos(math.pi * (step - warmup) / (STEPS - warmup)))

        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        losses = {}
        for step in range(STEPS):
            picked = order[(step * BATCH + torch.arange(BATCH)) % len(order)]
            batch = sequences[picked].cuda()
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
                logits = model(input_ids=batch[:, :-1]).logits
            loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                                     batch[:, 1:].reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            losses[step + 1] = float(loss)
        return losses

    torch_f32 = pytorch_losses(False)
    torch_bf16 = pytorch_losses(True)
    record("smollm2-135m (PyTorch)", "f32", torch_f32, torch_f32)
    record("smollm2-135m (PyTorch)", "bf16 autocast", torch_bf16, torch_f32)
    return ({"smollm2": ours, "pytorch": {"f32": torch_f32, "bf16": torch_bf16}},
            rows[-1]["mean_relative_deviation"])


def resnet50_losses():
    """ResNet-50 on Fashion-MNIST at 64 px, every precision."""
    images = os.path.join(out, "fashion-64")
    subprocess.run([binary, "fashion-folder", images, "--size", "64", "--limit", "4096", "--data",
                    fashion_dir], check=True, stdout=subprocess.DEVNULL)
    resnet = {p: train(os.path.join(out, f"resnet-{p}"),
                       ["--model", "resnet50", "--data", images, "--size", "64", "--batch", "64",
                        "--epochs", "4"], p) for p in PRECISIONS}
    for p in PRECISIONS:
        record("resnet-50", p, resnet[p], resnet["strict"])
    return {"resnet": resnet}


# PyTorch's own bf16 figure bounds every workload's: without smollm2 it is not measured (0).
curves, yardstick = {}, 0.0
if "smollm2" in workloads:
    smollm2_curves, yardstick = smollm2_losses()
    curves.update(smollm2_curves)
if "resnet50" in workloads:
    curves.update(resnet50_losses())

with open(os.path.join(out, "bf16_losses.json"), "w") as f:
    json.dump({"rows": rows, **curves}, f)
fast_figure = {r["workload"]: r["mean_relative_deviation"] for r in rows if r["precision"] == "fast"}
bounds = {w: max(0.02, 2 * yardstick, 2 * f) for w, f in fast_figure.items()}
failures = [r for r in rows
            if r["precision"] == "bf16" and r["mean_relative_deviation"] >= bounds[r["workload"]]]
print("\n%-24s %-14s %10s %10s %22s" % ("workload", "precision", "loss 1", "loss 200",
                                         "mean |dev| 101-200"))
for r in rows:
    print("%-24s %-14s %10.4f %10.4f %21.3f%%" % (r["workload"], r["precision"], r["first_loss"],
                                                  r["last_loss"], 100 * r["mean_relative_deviation"]))
for workload, bound in bounds.items():
    print(f"{workload} bf16 bound: {100 * bound:.2f} % (2 %, twice PyTorch's bf16 autocast figure "
          "or twice fast's)")
sys.exit(1 if failures else 0)
