"""A PyTorch twin of transformers' LlamaForCausalLM (modeling_llama.py's semantics: RMSNorm in
f32, rotate-half rotary embeddings, grouped-query attention by repeating keys and values, a
causal softmax, SiLU-gated MLP, tied or separate lm_head, the shifted causal-LM loss), written
for Debian's PyTorch 1.13 on the CPU, in float64. The parity tests feed it the weights Meganeura
started from and compare.

argv: <config.json> <weights.safetensors> <batches.bin> <batch> <seq> <out.safetensors> <steps> <lr>
batches.bin holds steps+1 batches of batch*seq int32 token ids (one batch when steps is 0).
Writes to out.safetensors: "logits" of the first batch, "loss" ([1]), "grad.<name>" of every
parameter for the first batch, and "losses" ([steps]): the loss of each of `steps` AdamW steps
(betas 0.9/0.999, eps 1e-8, weight decay 0.1, global-norm clipping at 1.0) on the batches.
"""
import json
import math
import struct
import sys

import torch

from train_parity import read_safetensors


def rope_frequencies(config, head_dim):
    theta = config.get("rope_theta") or config.get("rope_parameters", {}).get("rope_theta", 10000.0)
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inverse = (1.0 / (theta ** exponents)).float().double()
    scaling = config.get("rope_scaling") or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "linear":
        inverse = inverse / scaling["factor"]
    elif kind == "llama3":
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old = scaling["original_max_position_embeddings"]
        wavelength = 2 * math.pi / inverse
        scaled = torch.where(wavelength > old / low, inverse / factor, inverse)
        smooth = (old / wavelength - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelength < old / high) & ~(wavelength > old / low)
        inverse = torch.where(medium, smoothed, scaled)
    return inverse


class Llama(torch.nn.Module):
    def __init__(self, config, tensors):
        super().__init__()
        self.config = config
        self.params = torch.nn.ParameterDict(
            {name.replace(".", "/"): torch.nn.Parameter(value) for name, value in tensors.items()})

    def weight(self, name):
        return self.params[name.replace(".", "/")]

    def has(self, name):
        return name.replace(".", "/") in self.params

    def linear(self, x, prefix):
        bias = self.weight(prefix + ".bias") if self.has(prefix + ".bias") else None
        return torch.nn.functional.linear(x, self.weight(prefix + ".weight"), bias)

    def rms_norm(self, x, name):
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight(name) * (x * torch.rsqrt(variance + self.config["rms_norm_eps"]))

    def forward(self, ids):
        c = self.config
        heads, kv_heads = c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"])
        head_dim = c.get("head_dim") or c["hidden_size"] // heads
        batch, seq = ids.shape
        angles = torch.arange(seq, dtype=torch.float32).double()[:, None] * rope_frequencies(c, head_dim)[None, :]
        angles = torch.cat([angles, angles], dim=-1)
        cos, sin = angles.cos(), angles.sin()

        def rotate(x):
            half = x.shape[-1] // 2
            return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin

        causal = torch.full((seq, seq), float("-inf"), dtype=torch.float64).triu(1)
        h = self.weight("model.embed_tokens.weight")[ids]
        for i in range(c["num_hidden_layers"]):
            p = f"model.layers.{i}."
            x = self.rms_norm(h, p + "input_layernorm.weight")
            q = self.linear(x, p + "self_attn.q_proj").view(batch, seq, heads, head_dim).transpose(1, 2)
            k = self.linear(x, p + "self_attn.k_proj").view(batch, seq, kv_heads, head_dim).transpose(1, 2)
            v = self.linear(x, p + "self_attn.v_proj").view(batch, seq, kv_heads, head_dim).transpose(1, 2)
            q, k = rotate(q), rotate(k)
            k = k.repeat_interleave(heads // kv_heads, dim=1)
            v = v.repeat_interleave(heads // kv_heads, dim=1)
            scores = q @ k.transpose(-1, -2) / math.sqrt(head_dim) + causal
            attended = (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, seq, heads * head_dim)
            h = h + self.linear(attended, p + "self_attn.o_proj")
            x = self.rms_norm(h, p + "post_attention_layernorm.weight")
            gated = torch.nn.functional.silu(self.linear(x, p + "mlp.gate_proj")) * self.linear(x, p + "mlp.up_proj")
            h = h + self.linear(gated, p + "mlp.down_proj")
        h = self.rms_norm(h, "model.norm.weight")
        head = "lm_head.weight" if self.has("lm_head.weight") else "model.embed_tokens.weight"
        return h @ self.weight(head).t()


def causal_lm_loss(logits, ids):
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, tensor in tensors.items():
        data = tensor.detach().to(torch.float32).contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensor.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def main():
    config_path, weights_path, batches_path, batch, seq, out_path, steps, lr = sys.argv[1:9]
    batch, seq, steps, lr = int(batch), int(seq), int(steps), float(lr)
    with open(config_path) as file:
        config = json.load(file)
    model = Llama(config, read_safetensors(weights_path))
    with open(batches_path, "rb") as file:
        ids = torch.frombuffer(bytearray(file.read()), dtype=torch.int32).long().view(-1, batch, seq)
    logits = model(ids[0])
    loss = causal_lm_loss(logits, ids[0])
    loss.backward()
    out = {"logits": logits, "loss": loss.reshape(1)}
    for key, parameter in model.params.items():
        out["grad." + key.replace("/", ".")] = parameter.grad
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)
    losses = []
    for step in range(steps):
        optimizer.zero_grad()
        step_loss = causal_lm_loss(model(ids[step + 1]), ids[step + 1])
        step_loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(float(step_loss))
    out["losses"] = torch.tensor(losses if losses else [0.0], dtype=torch.float64)
    write_safetensors(out_path, out)


if __name__ == "__main__":
    main()
