#!/usr/bin/env python3
"""Makes the SmolVLA demo's synthetic control task and a small SmolVLA policy folder to train.

The task: a point mass (blue) on a square table and a target (red), both drawn into a camera
image; the state is the mass's position and the actions are the velocities of a proportional
controller that brings it to the target over the chunk. The target is only in the image, so a
policy must look to act well. --targets N draws each episode's target from N fixed places on a
circle instead of anywhere on the table, and --target-radius draws it larger than the mass: a
simpler task, in reach of a tiny model's short run.

usage: smolvla_demo_data.py OUT_DIR [--episodes N] [--targets N] [--target-radius PIXELS]
                            [--image SIZE] [--width W] [--layers L] [--seed S]
Writes OUT_DIR/data (episodes.jsonl and frames/*.png, docs/SMOLVLA.md's format) and
OUT_DIR/policy (LeRobot's config.json with "type": "smolvla", vlm/config.json and
vlm/tokenizer.json; no weights, so training starts from random ones).
Needs only Python's standard library.
"""
import argparse
import json
import math
import os
import random
import shutil
import struct
import zlib

CHUNK = 8
GAIN = 0.3
RECORDS_PER_EPISODE = 4
INSTRUCTIONS = ["move the blue dot onto the red dot", "reach the red target", "go to the red mark"]


def write_png(path, size, pixels):
    """pixels: rows of (r, g, b) tuples; an RGB 8-bit PNG."""
    raw = b"".join(b"\x00" + bytes(channel for pixel in row for channel in pixel) for row in pixels)

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)
    with open(path, "wb") as file:
        file.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def render(size, mass, target, target_radius):
    """A dark table with the target and the mass as squares (positions in [-1, 1])."""
    pixels = [[(30, 30, 30) for _ in range(size)] for _ in range(size)]
    for (x, y), colour, radius in ((target, (230, 40, 40), target_radius),
                                   (mass, (40, 90, 240), max(1, size // 16))):
        cx = int(round((x + 1) / 2 * (size - 1)))
        cy = int(round((1 - (y + 1) / 2) * (size - 1)))
        for row in range(max(0, cy - radius), min(size, cy + radius + 1)):
            for column in range(max(0, cx - radius), min(size, cx + radius + 1)):
                pixels[row][column] = colour
    return pixels


def controller_chunk(position, target):
    """CHUNK velocities of the proportional controller from `position`, and the positions."""
    x, y = position
    actions = []
    for _ in range(CHUNK):
        velocity = (GAIN * (target[0] - x), GAIN * (target[1] - y))
        actions.append([round(velocity[0], 6), round(velocity[1], 6)])
        x, y = x + velocity[0], y + velocity[1]
    return actions


def target_for(rng, targets):
    """Anywhere on the table, or one of `targets` places on a circle of radius 0.6."""
    if targets == 0:
        return (rng.uniform(-0.8, 0.8), rng.uniform(-0.8, 0.8))
    angle = 2 * math.pi * (rng.randrange(targets) + 0.5) / targets
    return (0.6 * math.cos(angle), 0.6 * math.sin(angle))


def make_data(out, episodes, targets, target_radius, size, rng):
    frames = os.path.join(out, "frames")
    os.makedirs(frames, exist_ok=True)
    with open(os.path.join(out, "episodes.jsonl"), "w") as records:
        for episode in range(episodes):
            target = target_for(rng, targets)
            position = (rng.uniform(-0.9, 0.9), rng.uniform(-0.9, 0.9))
            instruction = INSTRUCTIONS[episode % len(INSTRUCTIONS)]
            for step in range(RECORDS_PER_EPISODE):
                name = "frames/%05d_%d.png" % (episode, step)
                write_png(os.path.join(out, name), size, render(size, position, target, target_radius))
                actions = controller_chunk(position, target)
                record = {"episode": episode, "images": [name],
                          "state": [round(position[0], 6), round(position[1], 6)],
                          "instruction": instruction, "actions": actions}
                records.write(json.dumps(record) + "\n")
                # The next record starts where two controller steps lead.
                for velocity in actions[:2]:
                    position = (position[0] + velocity[0], position[1] + velocity[1])


def make_policy(out, size, width, layers, tokenizer):
    os.makedirs(os.path.join(out, "vlm"), exist_ok=True)
    with open(tokenizer) as file:
        vocab = json.load(file)
    tokens = max(list(vocab["model"]["vocab"].values()) + [token["id"] for token in vocab.get("added_tokens", [])]) + 1
    patch = max(4, size // 8)
    vlm = {
        "model_type": "smolvlm",
        "scale_factor": 2,
        "vision_config": {"model_type": "smolvlm_vision", "hidden_size": width // 2, "intermediate_size": width,
                          "num_hidden_layers": 2, "num_attention_heads": 2, "patch_size": patch,
                          "image_size": size, "num_channels": 3, "layer_norm_eps": 1e-6,
                          "hidden_act": "gelu_pytorch_tanh"},
        "text_config": {"model_type": "llama", "vocab_size": tokens, "hidden_size": width,
                        "intermediate_size": 2 * width, "num_hidden_layers": layers,
                        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": width // 4,
                        "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "hidden_act": "silu",
                        "max_position_embeddings": 2048, "tie_word_embeddings": True},
    }
    policy = {
        "type": "smolvla", "n_obs_steps": 1, "chunk_size": CHUNK, "n_action_steps": CHUNK,
        "input_features": {"observation.images.top": {"type": "VISUAL", "shape": [3, size, size]},
                           "observation.state": {"type": "STATE", "shape": [2]}},
        "output_features": {"action": {"type": "ACTION", "shape": [2]}},
        "max_state_dim": 2, "max_action_dim": 2, "resize_imgs_with_padding": [size, size],
        "num_steps": 10, "vlm_model_name": "vlm", "attention_mode": "cross_attn",
        "num_vlm_layers": layers, "num_expert_layers": -1, "self_attn_every_n_layers": 2,
        "expert_width_multiplier": 0.75, "min_period": 4e-3, "max_period": 4.0,
        "train_expert_only": False, "freeze_vision_encoder": False, "train_state_proj": True,
        "tokenizer_max_length": 48,
    }
    with open(os.path.join(out, "config.json"), "w") as file:
        json.dump(policy, file, indent=2)
    with open(os.path.join(out, "vlm", "config.json"), "w") as file:
        json.dump(vlm, file, indent=2)
    shutil.copyfile(tokenizer, os.path.join(out, "vlm", "tokenizer.json"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out")
    parser.add_argument("--episodes", type=int, default=120)
    parser.add_argument("--targets", type=int, default=0)
    parser.add_argument("--target-radius", type=int, help="in pixels (default: the mass's)")
    parser.add_argument("--image", type=int, default=32)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tokenizer", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                                            "tests", "fixtures", "tokenizer", "smollm2_like",
                                                            "tokenizer.json"))
    arguments = parser.parse_args()
    rng = random.Random(arguments.seed)
    target_radius = arguments.target_radius or max(1, arguments.image // 16)
    make_data(os.path.join(arguments.out, "data"), arguments.episodes, arguments.targets, target_radius,
              arguments.image, rng)
    make_policy(os.path.join(arguments.out, "policy"), arguments.image, arguments.width, arguments.layers,
                arguments.tokenizer)


if __name__ == "__main__":
    main()
