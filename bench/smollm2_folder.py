"""The SmolLM2-135M model folder the GPU machine's scripts start from: transformers'
LlamaForCausalLM at SmolLM2-135M's exact config with random weights (seed 0), written by
save_pretrained, with a tokenizer.json copied beside it.

  python3 bench/smollm2_folder.py FOLDER TOKENIZER_JSON
"""
import os
import shutil
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def write_smollm2_folder(folder, tokenizer_json):
    """Writes the folder and returns the model (f32, on the CPU)."""
    config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                         num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=100000.0,
                         tie_word_embeddings=True, bos_token_id=0, eos_token_id=0,
                         initializer_range=0.041666666666666664)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).float()
    model.save_pretrained(folder, safe_serialization=True)
    shutil.copy(tokenizer_json, os.path.join(folder, "tokenizer.json"))
    return model


if __name__ == "__main__":
    write_smollm2_folder(*sys.argv[1:3])
