#!/usr/bin/env python3
"""Writes a randomly initialised Whisper model folder in the layout transformers' save_pretrained
writes (config.json, model.safetensors, generation_config.json, preprocessor_config.json,
tokenizer.json), for training from scratch (scripts/whisper_demo.sh). Needs numpy only.

The tokenizer is byte-level BPE like Whisper's (GPT-2's byte-to-unicode alphabet, a leading
space kept as 'Ġ') with merges learnt from --corpus, and Whisper's special tokens after them.
The weights are initialised as transformers' WhisperPreTrainedModel._init_weights does: linear,
convolution and embedding weights ~ N(0, init_std), biases 0, LayerNorm 1 and 0, the encoder's
positions the sinusoids of transformers' sinusoids().

  make_whisper_folder.py --out DIR --corpus transcripts.txt [--size ci|tiny] [--merges N]
      [--chunk-seconds S] [--seed N]

--size ci is a small model for CPU runs (Lavapipe); tiny is whisper-tiny's shape (d_model 384,
4 + 4 layers, 6 heads, 1536 ffn) with this tokenizer's vocabulary. --chunk-seconds sets the
window (the encoder takes 100 frames a second, so 2 * max_source_positions = 100 * S).
"""
import argparse
import collections
import json
import math
import os
import struct

import numpy as np

SPECIAL_TOKENS = ["<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|translate|>",
                  "<|transcribe|>", "<|notimestamps|>"]

SIZES = {
    "ci": dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
               decoder_attention_heads=4, encoder_ffn_dim=256, decoder_ffn_dim=256),
    "tiny": dict(d_model=384, encoder_layers=4, decoder_layers=4, encoder_attention_heads=6,
                 decoder_attention_heads=6, encoder_ffn_dim=1536, decoder_ffn_dim=1536),
}


def byte_alphabet():
    """GPT-2's bytes_to_unicode: printable bytes map to themselves, the others above 255."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    characters = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            characters.append(256 + extra)
            extra += 1
    return {byte: chr(c) for byte, c in zip(printable, characters)}


def learn_merges(lines, count, alphabet):
    words = collections.Counter()
    for line in lines:
        for word in line.split():
            # Whisper's words start with a space, as the transcripts are encoded.
            words[tuple(alphabet[b] for b in (" " + word).encode())] += 1
    merges = []
    for _ in range(count):
        pairs = collections.Counter()
        for symbols, frequency in words.items():
            for pair in zip(symbols, symbols[1:]):
                pairs[pair] += frequency
        if not pairs:
            break
        best = max(pairs.items(), key=lambda item: (item[1], item[0]))[0]
        merges.append(best)
        merged = collections.Counter()
        for symbols, frequency in words.items():
            out, i = [], 0
            while i < len(symbols):
                if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == best:
                    out.append(symbols[i] + symbols[i + 1])
                    i += 2
                else:
                    out.append(symbols[i])
                    i += 1
            merged[tuple(out)] += frequency
        words = merged
    return merges


def tokenizer_json(merges, alphabet):
    vocab = {}
    for byte in range(256):
        vocab[alphabet[byte]] = len(vocab)
    for left, right in merges:
        vocab.setdefault(left + right, len(vocab))
    added = []
    for token in SPECIAL_TOKENS:
        added.append({"id": len(vocab) + len(added), "content": token, "single_word": False,
                      "lstrip": False, "rstrip": False, "normalized": False, "special": True})
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": True}
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None, "pre_tokenizer": byte_level, "post_processor": byte_level,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "", "fuse_unk": False,
                  "byte_fallback": False, "ignore_merges": False, "vocab": vocab,
                  "merges": [left + " " + right for left, right in merges]},
    }, {token["content"]: token["id"] for token in added}, len(vocab) + len(added)


def sinusoids(length, channels):
    increment = math.log(10000) / (channels // 2 - 1)
    timescales = np.exp(-increment * np.arange(channels // 2, dtype=np.float32)).astype(np.float32)
    scaled = np.arange(length, dtype=np.float32)[:, None] * timescales[None, :]
    return np.concatenate([np.sin(scaled), np.cos(scaled)], axis=1).astype(np.float32)


def tensor_shapes(c):
    d = c["d_model"]
    shapes = [("model.encoder.conv1.weight", (d, c["num_mel_bins"], 3)),
              ("model.encoder.conv1.bias", (d,)), ("model.encoder.conv2.weight", (d, d, 3)),
              ("model.encoder.conv2.bias", (d,)),
              ("model.encoder.embed_positions.weight", (c["max_source_positions"], d))]

    def attention(prefix):
        for name in ("k_proj", "v_proj", "q_proj", "out_proj"):
            shapes.append((f"{prefix}.{name}.weight", (d, d)))
            if name != "k_proj":
                shapes.append((f"{prefix}.{name}.bias", (d,)))

    def norm(prefix):
        shapes.extend([(prefix + ".weight", (d,)), (prefix + ".bias", (d,))])

    def mlp(prefix, hidden):
        shapes.extend([(prefix + "fc1.weight", (hidden, d)), (prefix + "fc1.bias", (hidden,)),
                       (prefix + "fc2.weight", (d, hidden)), (prefix + "fc2.bias", (d,))])

    for i in range(c["encoder_layers"]):
        p = f"model.encoder.layers.{i}."
        attention(p + "self_attn")
        norm(p + "self_attn_layer_norm")
        mlp(p, c["encoder_ffn_dim"])
        norm(p + "final_layer_norm")
    norm("model.encoder.layer_norm")
    shapes.append(("model.decoder.embed_tokens.weight", (c["vocab_size"], d)))
    shapes.append(("model.decoder.embed_positions.weight", (c["max_target_positions"], d)))
    for i in range(c["decoder_layers"]):
        p = f"model.decoder.layers.{i}."
        attention(p + "self_attn")
        norm(p + "self_attn_layer_norm")
        attention(p + "encoder_attn")
        norm(p + "encoder_attn_layer_norm")
        mlp(p, c["decoder_ffn_dim"])
        norm(p + "final_layer_norm")
    norm("model.decoder.layer_norm")
    return shapes


def save_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, array in tensors:
        data = np.ascontiguousarray(array, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--size", choices=sorted(SIZES), default="ci")
    parser.add_argument("--merges", type=int, default=120)
    parser.add_argument("--chunk-seconds", type=int, default=30)
    parser.add_argument("--max-target-positions", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    with open(args.corpus, encoding="utf-8") as file:
        lines = [line.strip() for line in file if line.strip()]
    alphabet = byte_alphabet()
    tokenizer, special, vocab_size = tokenizer_json(learn_merges(lines, args.merges, alphabet),
                                                    alphabet)
    frames = 100 * args.chunk_seconds
    config = dict(SIZES[args.size])
    config.update({
        "model_type": "whisper", "architectures": ["WhisperForConditionalGeneration"],
        "vocab_size": vocab_size, "num_mel_bins": 80, "max_source_positions": frames // 2,
        "max_target_positions": args.max_target_positions or (32 if args.size == "ci" else 448),
        "activation_function": "gelu", "scale_embedding": False, "tie_word_embeddings": True,
        "init_std": 0.02, "dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0,
        "use_cache": True, "is_encoder_decoder": True,
        "bos_token_id": special["<|endoftext|>"], "eos_token_id": special["<|endoftext|>"],
        "pad_token_id": special["<|endoftext|>"],
        "decoder_start_token_id": special["<|startoftranscript|>"],
        "begin_suppress_tokens": [tokenizer["model"]["vocab"][alphabet[ord(" ")]],
                                  special["<|endoftext|>"]],
        "suppress_tokens": [],
    })
    generation = {
        "decoder_start_token_id": config["decoder_start_token_id"],
        "eos_token_id": config["eos_token_id"], "pad_token_id": config["pad_token_id"],
        "bos_token_id": config["bos_token_id"], "is_multilingual": True,
        "lang_to_id": {"<|en|>": special["<|en|>"]},
        "task_to_id": {"transcribe": special["<|transcribe|>"],
                       "translate": special["<|translate|>"]},
        "no_timestamps_token_id": special["<|notimestamps|>"],
        "suppress_tokens": [], "begin_suppress_tokens": config["begin_suppress_tokens"],
        "max_length": config["max_target_positions"],
    }
    preprocessor = {
        "chunk_length": args.chunk_seconds, "dither": 0.0,
        "feature_extractor_type": "WhisperFeatureExtractor", "feature_size": 80,
        "hop_length": 160, "n_fft": 400, "n_samples": 16000 * args.chunk_seconds,
        "nb_max_frames": frames, "padding_side": "right", "padding_value": 0.0,
        "processor_class": "WhisperProcessor", "return_attention_mask": False,
        "sampling_rate": 16000,
    }

    rng = np.random.default_rng(args.seed)
    tensors = []
    for name, shape in tensor_shapes(config):
        if name == "model.encoder.embed_positions.weight":
            values = sinusoids(*shape)
        elif "layer_norm" in name:
            values = np.ones(shape) if name.endswith(".weight") else np.zeros(shape)
        elif name.endswith(".bias"):
            values = np.zeros(shape)
        else:
            values = rng.normal(0.0, config["init_std"], size=shape)
        tensors.append((name, values))

    os.makedirs(args.out, exist_ok=True)
    for file_name, content in (("config.json", config), ("generation_config.json", generation),
                               ("preprocessor_config.json", preprocessor),
                               ("tokenizer.json", tokenizer)):
        with open(os.path.join(args.out, file_name), "w", encoding="utf-8") as file:
            json.dump(content, file, indent=2, sort_keys=file_name != "tokenizer.json",
                      ensure_ascii=False)
    save_safetensors(os.path.join(args.out, "model.safetensors"), tensors)
    print(f"{args.out}: Whisper {args.size}, vocabulary {vocab_size}, d_model "
          f"{config['d_model']}, windows of {args.chunk_seconds} s")


if __name__ == "__main__":
    main()
