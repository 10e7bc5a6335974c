"""Whisper-tiny parity on the GPU machine (issue 35's gates), and the folder round trip: transformers
builds WhisperForConditionalGeneration at whisper-tiny's exact config with random weights and
save_pretrained; Meganeura loads that folder.

  strict: logits rel. L2 < 1e-4, every trained tensor's gradient norm within 1e-3,
          greedy tokens of 30 s of speech identical to transformers' generate;
  fast:   logits rel. L2 < 1e-2, gradient norms within 5e-2; beside it, PyTorch's own f16 autocast
          on the same weights (bench/amp_gradients.py): its worst error and its error at the five
          parameters where ours is worst (printed, not gated).
Then `meganeura train --model` trains the folder for a few steps on the same speech, and
transformers opens the folder it writes: its logits must equal Meganeura's (rel. L2 < 1e-4).

Usage: python3 bench/whisper_parity_h200.py BIN_DIR SPEECH_WAV OUT_DIR
(BIN_DIR holds the meganeura binary and bench/whisper_parity; SPEECH_WAV a 16 kHz 16-bit mono WAV,
e.g. tests/fixtures/audio/speech_16k.wav, repeated to 30 s.) The folder gets a byte-level
tokenizer.json with Whisper's special tokens at their ids (the weights are random, so the text
means nothing; the token ids are compared). Prints one JSON line per check and a table; exits 1 if
a gate fails.
"""
import json
import os
import subprocess
import sys
import wave

import numpy as np
import torch

bin_dir, speech_wav, out = sys.argv[1:4]
os.makedirs(out, exist_ok=True)
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from amp_gradients import amp_gradient_norms, print_beside, relative_errors  # noqa: E402
from transformers import (GenerationConfig, WhisperConfig, WhisperFeatureExtractor,  # noqa: E402
                          WhisperForConditionalGeneration)

SOT, EOT, EN, TRANSCRIBE, TRANSLATE, PREV, NO_TIMESTAMPS = 50258, 50257, 50259, 50359, 50358, 50361, 50363
SUPPRESS = [1, 2, 7, 8, 9, 10, 14, 25, 26, 27, 28, 29, 31, 58, 59, 60, 61, 62, 63, 90, 91, 92, 93,
            359, 503, 522, 542, 873, 893, 902, 918, 922, 931, 1350, 1853, 1982, 2460, 2627, 3246,
            3253, 3268, 3536, 3846, 3961, 4183, 4667, 6585, 6647, 7273, 9061, 9383, 10428, 10929,
            11938, 12033, 12331, 12562, 13793, 14157, 14635, 15265, 15618, 16553, 16604, 18362,
            18956, 20075, 21675, 22520, 26130, 26161, 26435, 28279, 29464, 31650, 32302, 32470,
            36865, 42863, 47425, 49870, 50254, 50258, 50358, 50359, 50360, 50361, 50362]
PROMPT = [SOT, EN, TRANSCRIBE, NO_TIMESTAMPS]
NEW_TOKENS = 64

folder = os.path.join(out, "whisper-tiny-random")
config = WhisperConfig(vocab_size=51865, num_mel_bins=80, d_model=384, encoder_layers=4,
                       decoder_layers=4, encoder_attention_heads=6, decoder_attention_heads=6,
                       encoder_ffn_dim=1536, decoder_ffn_dim=1536, max_source_positions=1500,
                       max_target_positions=448, activation_function="gelu", scale_embedding=False,
                       decoder_start_token_id=SOT, bos_token_id=EOT, eos_token_id=EOT,
                       pad_token_id=EOT, begin_suppress_tokens=[220, EOT], suppress_tokens=SUPPRESS)
torch.manual_seed(0)
model = WhisperForConditionalGeneration(config).float()
generation = GenerationConfig(
    decoder_start_token_id=SOT, bos_token_id=EOT, eos_token_id=EOT, pad_token_id=EOT,
    is_multilingual=True, lang_to_id={"<|en|>": EN},
    task_to_id={"transcribe": TRANSCRIBE, "translate": TRANSLATE},
    no_timestamps_token_id=NO_TIMESTAMPS, prev_sot_token_id=PREV, max_initial_timestamp_index=50,
    suppress_tokens=SUPPRESS, begin_suppress_tokens=[220, EOT], max_length=448)
model.generation_config = generation
model.save_pretrained(folder, safe_serialization=True)
extractor = WhisperFeatureExtractor(feature_size=80)
extractor.save_pretrained(folder)


def byte_alphabet():
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    characters, extra = printable[:], 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            characters.append(256 + extra)
            extra += 1
    return [chr(c) for c in characters]  # in GPT-2's vocabulary order


special = {SOT: "<|startoftranscript|>", EOT: "<|endoftext|>", EN: "<|en|>",
           TRANSCRIBE: "<|transcribe|>", TRANSLATE: "<|translate|>", PREV: "<|startofprev|>",
           NO_TIMESTAMPS: "<|notimestamps|>"}
byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
tokenizer = {
    "version": "1.0", "truncation": None, "padding": None, "normalizer": None,
    "pre_tokenizer": byte_level, "post_processor": byte_level, "decoder": byte_level,
    "added_tokens": [{"id": i, "content": special.get(i, f"<|token{i}|>"), "single_word": False,
                      "lstrip": False, "rstrip": False, "normalized": False, "special": True}
                     for i in range(256, config.vocab_size)],
    "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
              "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
              "ignore_merges": False, "vocab": {c: i for i, c in enumerate(byte_alphabet())},
              "merges": []},
}
with open(os.path.join(folder, "tokenizer.json"), "w", encoding="utf-8") as f:
    json.dump(tokenizer, f, ensure_ascii=False)

# 30 s of speech: the WAV repeated and cut to one window.
with wave.open(speech_wav) as w:
    assert w.getframerate() == 16000 and w.getnchannels() == 1 and w.getsampwidth() == 2
    samples = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
samples = np.tile(samples, 480000 // len(samples) + 1)[:480000]
speech_30s = os.path.join(out, "speech_30s.wav")
with wave.open(speech_30s, "wb") as w:
    w.setnchannels(1)
    w.setsampwidth(2)
    w.setframerate(16000)
    w.writeframes(samples.astype("<i2").tobytes())
features = extractor(samples.astype(np.float32) / 32768.0, sampling_rate=16000,
                     return_tensors="pt").input_features
features.numpy().astype("<f4").tofile(os.path.join(out, "features.f32"))

model = model.cuda()
generator = torch.Generator().manual_seed(1)
ids = PROMPT + torch.randint(0, EOT, (20,), generator=generator).tolist()
labels = ids[1:] + [EOT]
with open(os.path.join(out, "tokens.json"), "w") as f:
    json.dump({"decoder_input_ids": ids, "labels": labels}, f)
model.zero_grad()
result = model(input_features=features.cuda(), decoder_input_ids=torch.tensor([ids]).cuda(),
               labels=torch.tensor([labels]).cuda())
result.loss.backward()
reference_logits = result.logits.detach().double().cpu().flatten()
reference_norms = {n: float(p.grad.double().norm()) for n, p in model.named_parameters()
                   if p.grad is not None}
# PyTorch's own f16 autocast (SDPA's flash attention), beside the fast gate: printed, not gated.
amp_errors = relative_errors(amp_gradient_norms(
    model.named_parameters(),
    lambda: model(input_features=features.cuda(), decoder_input_ids=torch.tensor([ids]).cuda(),
                  labels=torch.tensor([labels]).cuda()).loss), reference_norms)
results, failures = [], []


def record(check, value, bound, **extra):
    row = {"check": check, "value": value, "bound": bound, "pass": bool(value < bound), **extra}
    results.append(row)
    print(json.dumps(row), flush=True)
    if not row["pass"]:
        failures.append(check)


def relative_l2(a, b):
    return float((a - b).norm() / b.norm())


def meganeura_side(precision, model_dir, tag):
    path = os.path.join(out, f"meganeura_{tag}_{precision}.json")
    subprocess.run([os.path.join(bin_dir, "bench", "whisper_parity"), model_dir,
                    os.path.join(out, "features.f32"), os.path.join(out, "tokens.json"), path,
                    precision], check=True)
    with open(path) as f:
        return json.load(f)


for precision, logit_bound, norm_bound in (("strict", 1e-4, 1e-3), ("fast", 1e-2, 5e-2)):
    ours = meganeura_side(precision, folder, "random")
    record(f"logits {precision}", relative_l2(torch.tensor(ours["logits"], dtype=torch.float64),
                                              reference_logits), logit_bound)
    record(f"loss {precision} (absolute difference)", abs(ours["loss"] - float(result.loss)),
           logit_bound * 10)
    worst_name, worst = None, 0.0
    missing = [name for name in reference_norms if name not in ours["gradient_norms"]]
    for name, expected in reference_norms.items():
        error = abs(ours["gradient_norms"].get(name, 0.0) - expected) / max(expected, 1e-30)
        if error >= worst:
            worst_name, worst = name, error
    record(f"gradient norms {precision} (worst parameter)", worst, norm_bound,
           parameter=worst_name, missing=missing, loss_scale=ours["loss_scale"],
           pytorch_amp_error=amp_errors[worst_name])
    if precision == "fast":
        print_beside(relative_errors(ours["gradient_norms"], reference_norms), amp_errors)

# Greedy tokens of 30 s of speech: transformers' generate on its features, and `meganeura
# transcribe` on the WAV (its own resampling-free features, within 2e-5 of transformers').
with torch.no_grad():
    sequence = model.generate(features.cuda(), language="en", task="transcribe",
                              return_timestamps=False, max_new_tokens=NEW_TOKENS,
                              do_sample=False)[0].tolist()
if sequence[:len(PROMPT)] == PROMPT:
    sequence = sequence[len(PROMPT):]
expected = sequence[:sequence.index(EOT)] if EOT in sequence else sequence
run = subprocess.run([os.path.join(bin_dir, "meganeura"), "transcribe", folder, speech_30s,
                      "--json", "--max-tokens", str(NEW_TOKENS)],
                     check=True, capture_output=True, text=True)
transcribed = json.loads(run.stdout.splitlines()[-1])
agree = 0
while agree < min(len(expected), len(transcribed["tokens"])) and \
        expected[agree] == transcribed["tokens"][agree]:
    agree += 1
record(f"greedy tokens differing (of {len(expected)})",
       max(len(expected), len(transcribed["tokens"])) - agree, 1,
       real_time_factor=transcribed["real_time_factor"])

# Train a few steps, then transformers opens the folder that train writes.
with open(os.path.join(out, "speech.jsonl"), "w") as f:
    for i in range(8):
        f.write(json.dumps({"audio": speech_30s, "text": f"the dragonfly flew {i} times"}) + "\n")
run_dir = os.path.join(out, "trained")
subprocess.run([os.path.join(bin_dir, "meganeura"), "train", "--model", folder, "--data",
                os.path.join(out, "speech.jsonl"), "--out", run_dir, "--batch", "4",
                "--max-steps", "10", "--epochs", "5", "--validation", "0", "--lr", "1e-4"],
               check=True)
tuned = WhisperForConditionalGeneration.from_pretrained(os.path.join(run_dir, "model")).cuda().float()
with torch.no_grad():
    tuned_logits = tuned(input_features=features.cuda(),
                         decoder_input_ids=torch.tensor([ids]).cuda()).logits.double().cpu().flatten()
ours = meganeura_side("strict", os.path.join(run_dir, "model"), "trained")
record("trained folder reopened in transformers: logits",
       relative_l2(torch.tensor(ours["logits"], dtype=torch.float64), tuned_logits), 1e-4,
       changed_from_start=relative_l2(tuned_logits, reference_logits))

with open(os.path.join(out, "parity.json"), "w") as f:
    json.dump(results, f, indent=1)
print("\n%-52s %12s %10s %s" % ("check", "value", "bound", "result"))
for row in results:
    print("%-52s %12.3g %10.0e %s" % (row["check"], row["value"], row["bound"],
                                       "pass" if row["pass"] else "FAIL"))
sys.exit(1 if failures else 0)
