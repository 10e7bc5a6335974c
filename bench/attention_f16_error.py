#!/usr/bin/env python3
"""What an f16 flash-attention backward does to Whisper-tiny's encoder gradients, on Debian's
PyTorch 1.13 on the CPU (the fast precision's attention gradients, bench/whisper_parity_h200.py).

Whisper-tiny (transformers' config and random initialisation: weights N(0, 0.02), zero biases,
sinusoidal encoder positions) runs in float64 on the log-mel features of 30 s of
tests/fixtures/audio/speech_16k.wav (repeated), with random decoder tokens, as the parity script
feeds it. The backward of each encoder self-attention records its operands; the script then
emulates the f16 backward on them and turns its dq, dk, dv into the gradients of that layer's q,
k and v projections, so each error is the attention backward's alone:

  q, k, v and dO rounded to f16 (scale folded into q before rounding, as our kernels do);
  S = q k^T and dP = dO v^T from those f16 operands, exact sums kept in f32;
  P = exp(S - lse) with lse from the same scores; O = f16(P) v / rowsum(P) (the forward's);
  delta_i = rowsum(dO * O); dS = P (dP - delta) scale rounded to f16;
  dQ = dS k, dK = dS^T q, dV = f16(P)^T dO with f32 results.

Variants (one column each):
  ours              attention_grad_q_coopmat.comp / attention_grad_kv_coopmat.comp as they were
                    (delta from the f32 dO and O);
  ds-f32            ours with dS kept in f32 for the dQ and dK products;
  scaled            ours over dO times 64 / max |dO| per head, divided out of the results
                    (passes/scale_attention_gradients.cpp, the fast precision's default);
  amp-flash         PyTorch's flash kernel on f16 tensors (delta from the f16 dO and O), no loss
                    scaling;
  amp-flash-scaled  the same with the loss scaled by 2^16, GradScaler's initial scale.
It also prints, per layer, how spread out attention is and how small dO and dS are.

usage: attention_f16_error.py [--layers N] [--variants A,B,...] [--check-layers 0,3]
"""
import argparse
import math
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "parity"))
import whisper_features  # noqa: E402

F = torch.nn.functional
D_MODEL, HEADS, FFN, MELS, FRAMES, VOCAB, TARGETS = 384, 6, 1536, 80, 3000, 51865, 448
SOT, EOT, EN, TRANSCRIBE, NO_TIMESTAMPS = 50258, 50257, 50259, 50359, 50363


def f16(t):
    return t.to(torch.float16).to(torch.float64)


def f32(t):
    return t.to(torch.float32).to(torch.float64)


def sinusoids(length, channels):
    increment = math.log(10000) / (channels // 2 - 1)
    inverse = torch.exp(-increment * torch.arange(channels // 2, dtype=torch.float64))
    scaled = torch.arange(length, dtype=torch.float64)[:, None] * inverse[None, :]
    return torch.cat([scaled.sin(), scaled.cos()], dim=1)


def random_whisper(layers, seed=0):
    """transformers' WhisperPreTrainedModel._init_weights at whisper-tiny's shapes."""
    generator = torch.Generator().manual_seed(seed)
    weights = {}

    def normal(name, *shape):
        weights[name] = torch.randn(*shape, generator=generator, dtype=torch.float64) * 0.02

    def linear(name, rows, columns, bias=True):
        normal(name + ".weight", rows, columns)
        if bias:
            weights[name + ".bias"] = torch.zeros(rows, dtype=torch.float64)

    def norm(name):
        weights[name + ".weight"] = torch.ones(D_MODEL, dtype=torch.float64)
        weights[name + ".bias"] = torch.zeros(D_MODEL, dtype=torch.float64)

    def attention(prefix):
        for projection in ("q_proj", "k_proj", "v_proj", "out_proj"):
            linear(prefix + "." + projection, D_MODEL, D_MODEL, projection != "k_proj")

    normal("model.encoder.conv1.weight", D_MODEL, MELS, 3)
    weights["model.encoder.conv1.bias"] = torch.zeros(D_MODEL, dtype=torch.float64)
    normal("model.encoder.conv2.weight", D_MODEL, D_MODEL, 3)
    weights["model.encoder.conv2.bias"] = torch.zeros(D_MODEL, dtype=torch.float64)
    weights["model.encoder.embed_positions.weight"] = sinusoids(FRAMES // 2, D_MODEL)
    for side in ("encoder", "decoder"):
        for i in range(layers):
            p = f"model.{side}.layers.{i}."
            attention(p + "self_attn")
            norm(p + "self_attn_layer_norm")
            if side == "decoder":
                attention(p + "encoder_attn")
                norm(p + "encoder_attn_layer_norm")
            linear(p + "fc1", FFN, D_MODEL)
            linear(p + "fc2", D_MODEL, FFN)
            norm(p + "final_layer_norm")
        norm(f"model.{side}.layer_norm")
    normal("model.decoder.embed_tokens.weight", VOCAB, D_MODEL)
    weights["model.decoder.embed_tokens.weight"][EOT] = 0  # padding_idx
    normal("model.decoder.embed_positions.weight", TARGETS, D_MODEL)
    return weights


def emulated_backward(q, k, v, grad_out, scale, variant):
    """dq, dk, dv of softmax(q k^T scale) v for the cotangent grad_out, as the f16 flash-attention
    backward `variant` computes them (see the module's docstring)."""
    if variant in ("scaled", "amp-flash-scaled"):
        # dO times 64 / max |dO| of its head, or 2^16, divided out of the results.
        loss_scale = (64.0 / grad_out.abs().amax((-2, -1), keepdim=True) if variant == "scaled"
                      else 65536.0)
        base = "ours" if variant == "scaled" else "amp-flash"
        return tuple(g / loss_scale for g in
                     emulated_backward(q, k, v, grad_out * loss_scale, scale, base))
    qh, kh, vh, doh = f16(q * scale), f16(k), f16(v), f16(grad_out)
    scores = f32(qh @ kh.transpose(-1, -2))
    lse = f32(torch.logsumexp(scores, -1, keepdim=True))
    p = f32(torch.exp(scores - lse))
    out = f32((f16(p) @ vh) / p.sum(-1, keepdim=True))  # the forward's output
    if variant == "amp-flash":  # O and dO are f16 tensors
        delta = f32((doh * f16(out)).sum(-1, keepdim=True))
    else:
        delta = f32((f32(grad_out) * out).sum(-1, keepdim=True))
    dp = f32(doh @ vh.transpose(-1, -2))
    ds = f32(p * (dp - delta) * scale)
    weights = ds if variant == "ds-f32" else f16(ds)
    dq = f32(weights @ kh)
    dk = f32(weights.transpose(-1, -2) @ f16(q))
    dv = f32(f16(p).transpose(-1, -2) @ doh)
    return dq, dk, dv


class Attention(torch.autograd.Function):
    """softmax(q k^T scale) v in float64, whose backward records q, k, v and dO in `captured`."""

    @staticmethod
    def forward(ctx, q, k, v, scale, captured):
        ctx.save_for_backward(q, k, v)
        ctx.scale, ctx.captured = scale, captured
        return ((q @ k.transpose(-1, -2)) * scale).softmax(-1) @ v

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v = ctx.saved_tensors
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]
            out = ((leaves[0] @ leaves[1].transpose(-1, -2)) * ctx.scale).softmax(-1) @ leaves[2]
            grads = torch.autograd.grad(out, leaves, grad_out)
        ctx.captured.append((q, k, v, grad_out))
        return (*grads, None, None)


class Whisper:
    """Whisper's loss in float64; each encoder self-attention records its operands (`captured`,
    in the backward) and its input (`layer_inputs`)."""

    def __init__(self, weights, layers):
        self.w = {n: t.clone().requires_grad_(n != "model.encoder.embed_positions.weight")
                  for n, t in weights.items()}
        self.layers = layers
        self.captured, self.layer_inputs = [], []

    def linear(self, x, prefix, bias=True):
        return F.linear(x, self.w[prefix + ".weight"], self.w[prefix + ".bias"] if bias else None)

    def conv(self, x, prefix, stride):
        return F.conv1d(x, self.w[prefix + ".weight"], self.w[prefix + ".bias"], stride=stride,
                        padding=1)

    def norm(self, x, prefix):
        return F.layer_norm(x, x.shape[-1:], self.w[prefix + ".weight"], self.w[prefix + ".bias"])

    def attention(self, x, source, prefix, causal, encoder):
        batch, length, _ = x.shape
        head_dim = D_MODEL // HEADS
        q = split_heads(self.linear(x, prefix + ".q_proj"))
        k = split_heads(self.linear(source, prefix + ".k_proj", bias=False))
        v = split_heads(self.linear(source, prefix + ".v_proj"))
        if encoder:
            self.layer_inputs.append(x.detach())
            out = Attention.apply(q, k, v, head_dim ** -0.5, self.captured)
        else:
            scores = (q @ k.transpose(-1, -2)) * head_dim ** -0.5
            if causal:
                scores = scores + torch.full(scores.shape[-2:], float("-inf"),
                                             dtype=scores.dtype).triu(1)
            out = scores.softmax(-1) @ v
        return self.linear(merge_heads(out), prefix + ".out_proj")

    def loss(self, features, ids, labels):
        x = F.gelu(self.conv(features, "model.encoder.conv1", 1))
        x = F.gelu(self.conv(x, "model.encoder.conv2", 2))
        h = x.permute(0, 2, 1) + self.w["model.encoder.embed_positions.weight"]
        for i in range(self.layers):
            p = f"model.encoder.layers.{i}."
            y = self.norm(h, p + "self_attn_layer_norm")
            h = h + self.attention(y, y, p + "self_attn", False, True)
            y = self.norm(h, p + "final_layer_norm")
            h = h + self.linear(F.gelu(self.linear(y, p + "fc1")), p + "fc2")
        encoded = self.norm(h, "model.encoder.layer_norm")
        h = F.embedding(ids, self.w["model.decoder.embed_tokens.weight"], padding_idx=EOT)
        h = h + self.w["model.decoder.embed_positions.weight"][: ids.shape[1]]
        for i in range(self.layers):
            p = f"model.decoder.layers.{i}."
            y = self.norm(h, p + "self_attn_layer_norm")
            h = h + self.attention(y, y, p + "self_attn", True, False)
            y = self.norm(h, p + "encoder_attn_layer_norm")
            h = h + self.attention(y, encoded, p + "encoder_attn", False, False)
            y = self.norm(h, p + "final_layer_norm")
            h = h + self.linear(F.gelu(self.linear(y, p + "fc1")), p + "fc2")
        h = self.norm(h, "model.decoder.layer_norm")
        logits = h @ self.w["model.decoder.embed_tokens.weight"].t()
        return F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))

    def gradients(self, features, ids, labels):
        self.loss(features, ids, labels).backward()
        self.captured.reverse()  # the backward met the last layer first
        return {n: t.grad for n, t in self.w.items() if t.grad is not None}


def split_heads(t):
    return t.view(t.shape[0], t.shape[1], HEADS, D_MODEL // HEADS).transpose(1, 2)


def merge_heads(t):
    return t.transpose(1, 2).reshape(t.shape[0], t.shape[2], D_MODEL)


def projection_gradients(x, dq, dk, dv, prefix):
    """The gradients of an encoder layer's q, k and v projections from those of q, k and v."""
    x = x.reshape(-1, D_MODEL)
    dq, dk, dv = (merge_heads(t).reshape(-1, D_MODEL) for t in (dq, dk, dv))
    return {prefix + "q_proj.weight": dq.t() @ x, prefix + "q_proj.bias": dq.sum(0),
            prefix + "k_proj.weight": dk.t() @ x, prefix + "v_proj.weight": dv.t() @ x,
            prefix + "v_proj.bias": dv.sum(0)}


def norm_error(actual, expected):
    return abs(float(actual.norm()) - float(expected.norm())) / max(float(expected.norm()), 1e-300)


def l2_error(actual, expected):
    return float((actual - expected).norm()) / max(float(expected.norm()), 1e-300)


def mean_to_spread(t):
    """Per head, the norm of the mean row over the rms distance of the rows from it (averaged)."""
    mean = t.mean(-2, keepdim=True)
    spread = (t - mean).pow(2).sum(-1).mean(-1).sqrt()
    return float((mean.squeeze(-2).norm(dim=-1) / spread).mean())


def speech_features():
    """30 s of the fixture's speech (repeated), as whisper_parity_h200.py feeds transformers."""
    samples, rate = whisper_features.read_wav(
        os.path.join(HERE, "..", "tests", "fixtures", "audio", "speech_16k.wav"))
    assert rate == 16000
    samples = np.tile(samples, 480000 // len(samples) + 1)[:480000].astype(np.float32)
    mel = whisper_features.features_numpy(samples, MELS, 16000, 400, 160)
    return torch.from_numpy(np.ascontiguousarray(mel)).double()[None]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--variants", default="ours,ds-f32,scaled,amp-flash,amp-flash-scaled")
    parser.add_argument("--check-layers", default="",
                        help="comma-separated encoder layers to emulate (default: all)")
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    weights = random_whisper(args.layers)
    features = speech_features()
    generator = torch.Generator().manual_seed(1)
    ids = [SOT, EN, TRANSCRIBE, NO_TIMESTAMPS] + torch.randint(0, EOT, (20,), generator=generator).tolist()
    ids, labels = torch.tensor([ids]), torch.tensor([ids[1:] + [EOT]])
    model = Whisper(weights, args.layers)
    exact = model.gradients(features, ids, labels)
    variants = args.variants.split(",")
    print("relative gradient-norm error / relative L2 error of each encoder layer's projections,")
    print("the attention backward emulated in f16 (everything else float64)")
    print(f"{'parameter':38s} {'|g|':>8s} " + " ".join(f"{v:>17s}" for v in variants))
    worst = {v: (0.0, "") for v in variants}
    for layer, (x, (q, k, v, grad_out)) in enumerate(zip(model.layer_inputs, model.captured)):
        if args.check_layers and str(layer) not in args.check_layers.split(","):
            continue
        prefix = f"model.encoder.layers.{layer}.self_attn."
        scale = (D_MODEL // HEADS) ** -0.5
        probabilities = ((q @ k.transpose(-1, -2)) * scale).softmax(-1)
        print(f"layer {layer}: |mean key| / key spread {mean_to_spread(k):.2f}, |mean value| / "
              f"value spread {mean_to_spread(v):.2f}, largest probability x Sk "
              f"{float(probabilities.max()) * k.shape[-2]:.1f}")
        score_grads = probabilities * (grad_out @ v.transpose(-1, -2) -
                                       (grad_out * (probabilities @ v)).sum(-1, keepdim=True)) * scale
        magnitude = score_grads.abs()
        print(f"  |dO| largest {float(grad_out.abs().max()):.2e}; |dS| median "
              f"{float(magnitude.median()):.2e}, largest {float(magnitude.max()):.2e}, below f16's "
              f"smallest normal (2^-14) {float((magnitude < 2.0 ** -14).double().mean()):.1%}, "
              f"flushed to zero (< 2^-25) {float((magnitude < 2.0 ** -25).double().mean()):.1%}")
        emulated = {name: projection_gradients(x, *emulated_backward(q, k, v, grad_out, scale, name),
                                               prefix) for name in variants}
        for name in emulated[variants[0]]:
            expected = exact[name]
            cells = []
            for variant in variants:
                actual = emulated[variant][name]
                cells.append(f"{norm_error(actual, expected):8.2e}/{l2_error(actual, expected):8.2e}")
                worst[variant] = max(worst[variant], (norm_error(actual, expected), name))
            print(f"{name[len('model.encoder.'):]:38s} {float(expected.norm()):8.2e} " + " ".join(cells))
    for variant in variants:
        print(f"worst gradient-norm error, {variant}: {worst[variant][0]:.3e} ({worst[variant][1]})")


if __name__ == "__main__":
    main()
