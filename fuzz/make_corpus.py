#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (fuzz/corpus/<loader>/): small valid files of each
kind, so that the fuzzer starts from inputs that reach deep into the loaders. Run from anywhere;
needs only Python's standard library. Fixture files of tests/fixtures are copied where small."""
import gzip
import json
import pathlib
import shutil
import struct
import zlib

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
CORPUS = HERE / "corpus"


def safetensors(tensors, metadata=None):
    header, data = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + data


def png(width, height, color_type, channels):
    rows = b"".join(b"\0" + bytes((x * 37 + y * 11) % 256 for x in range(width * channels)) for y in range(height))

    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, color_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def wav(rate, samples):
    data = b"".join(struct.pack("<h", (i * 977) % 20000 - 10000) for i in range(samples))
    return (b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVEfmt " +
            struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16) + b"data" + struct.pack("<I", len(data)) + data)


def idx(count, side):
    labels = struct.pack(">II", 0x801, count) + bytes(i % 10 for i in range(count))
    images = struct.pack(">IIII", 0x803, count, side, side) + bytes((i * 7) % 256 for i in range(count * side * side))
    return labels, images


def write(loader, name, data):
    folder = CORPUS / loader
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data)


def main():
    shutil.rmtree(CORPUS, ignore_errors=True)
    f32 = struct.pack("<6f", 0.5, -1.0, 2.0, 0.25, -0.75, 1.5)
    write("safetensors", "f32.safetensors", safetensors({"w": ("F32", [2, 3], f32), "b": ("BF16", [2], b"\x80\x3f\x00\x40")}))
    write("safetensors", "metadata.safetensors", safetensors({"ids": ("I64", [2], struct.pack("<2q", 1, 7))}, {"format": "pt"}))
    meta = {"format": 1, "step": 2, "epoch": 1, "model": {"architecture": "mlp", "image_size": 28, "classes": 10},
            "optimizer": {"kind": "adam", "learning_rate": 0.002},
            "extra": {"batch": 32, "batcher": {"seed": 0, "batch_size": 32, "epoch": 0, "position": 64}}}
    write("checkpoint", "classifier.safetensors",
          safetensors({"model.fc3.bias": ("F32", [6], f32)}, {"meganeura": json.dumps(meta)}))
    (CORPUS / "model_config").mkdir(parents=True, exist_ok=True)
    for folder in ("llama_tiny_f32", "llama_tiny_bf16_sharded"):
        shutil.copy(ROOT / "tests/fixtures/model_folders" / folder / "config.json", CORPUS / "model_config" / folder)
    for name in ("gpt2_small.json", "metaspace_small.json", "split_small.json", "digits_small.json"):
        (CORPUS / "tokenizer").mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / "tests/fixtures/tokenizer" / name, CORPUS / "tokenizer" / name)
    write("wav", "mono16k.wav", wav(16000, 400))
    write("wav", "mono8k.wav", wav(8000, 100))
    write("image", "gray.png", png(5, 3, 0, 1))
    write("image", "rgba.png", png(4, 4, 6, 4))
    write("image", "gray.pgm", b"P5 3 2 255\n" + bytes(range(10, 70, 10)))
    write("image", "ascii.pgm", b"P2\n# comment\n2 2\n15\n0 5 10 15\n")
    # Inputs the one-hour runs found (docs/RELIABILITY.md): JPEGs whose Huffman table declares
    # 768 codes, or 1020 in counts cut short by the end of the file, and a 41-byte run-length TGA
    # declaring 2056x16392.
    write("image", "jpeg_huffman_overflow", bytes.fromhex(
        "ffffffffd8ffffffffffffffffffffffffffc4ffff00000000030000000000000000ffffff00000000000000"
        "000000000000000000000000000000000040000000000000000000ffffffffffffdfffffffff"))
    write("image", "jpeg_huffman_truncated", bytes.fromhex(
        "ffffd8ffffffffffffffffffffffffffc4ffff1200ffffffff"))
    write("image", "tga_declared_too_large", bytes.fromhex(
        "ff000b0008080808 08ff080808080840 0808080800c93f7c 0100071f08d7ffff ffffffff7f00fffc5d"
        .replace(" ", "")))
    # The idx target's first byte times four is the labels file's length: 4 labels make 12 bytes,
    # and a gzip level is picked whose output is a multiple of four bytes long.
    labels, images = idx(4, 4)
    write("idx", "plain", bytes([len(labels) // 4]) + labels + images)
    packed = next(p for p in (gzip.compress(labels, level, mtime=0) for level in range(1, 10)) if len(p) % 4 == 0)
    write("idx", "gzip", bytes([len(packed) // 4]) + packed + gzip.compress(images, mtime=0))

if __name__ == "__main__":
    main()
