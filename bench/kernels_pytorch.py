"""PyTorch side of `meganeura bench kernels`: the same cases and shapes, strict f32 (TF32 off),
one JSON object per case; the "... fast" twins run with f16 inputs (against Meganeura's
--precision fast), and so do the "... f16" twins of the GEMM, SmolLM and SmolVLA products
(against Meganeura's f16 tensors); the "... bf16" twin of the GEMM runs with bfloat16 inputs
(against Meganeura's bf16 tensors in --precision bf16).

Like the Meganeura side, each case's inputs are replicated until the copies hold more than
--rotate MiB (more than the GPU's L2 cache), and one timed run computes the case once on every
copy. The run is captured once as a CUDA graph and replayed, so the time is GPU time without
Python's launch overhead (cases that cannot be captured are timed eagerly; "timing" in the JSON
says which); CUDA events bracket each replay, and the case's time is the median over --runs
runs (after warm-up runs for WARMUP_SECONDS, at least 3) of the run's time divided by the number of copies.

Usage: python3 bench/kernels_pytorch.py [--filter TEXT] [--runs 20] [--rotate 96] [--small]
       [--no-fast]
Without CUDA it runs on the CPU with wall-clock timing (a smoke test, not a benchmark).
"""
import argparse
import json
import math
import time

import torch
import torch.nn.functional as F

MAX_COPIES = 128
WARMUP_SECONDS = 1.0  # as kWarmupSeconds in src/cli/bench_timing.hpp, which says why


def attention(q, k, v):
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return torch.softmax(scores, -1) @ v


def grouped_attention(q, k, v, mask=None):
    """Attention of q's heads over k's and v's fewer heads (grouped-query), with an additive mask."""
    if hasattr(F, "scaled_dot_product_attention") and \
            tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 5):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return torch.softmax(scores if mask is None else scores + mask, -1) @ v


def plain(fn):
    """A case whose one call is fn(*inputs)."""
    return lambda inputs: (lambda: fn(*inputs))


def attention_backward(inputs):
    """What the backward pass adds to a saved forward: the gradients of q, k and v."""
    q, k, v, grad = inputs
    for tensor in (q, k, v):
        tensor.requires_grad_(True)
    out = attention(q, k, v)
    return lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)


def attention_training(inputs):
    """One training step's attention: the forward and the gradients of q, k and v."""
    q, k, v, grad = inputs
    for tensor in (q, k, v):
        tensor.requires_grad_(True)
    return lambda: torch.autograd.grad(attention(q, k, v), (q, k, v), grad)


def cases(small):
    """(name, input shapes, make(inputs) -> one call, flops, bytes), as `meganeura bench kernels`."""
    s = 8 if small else 1
    out = []

    def gemm(name, m, n, k, ta, tb):
        a_shape = (k, m) if ta else (m, k)
        b_shape = (n, k) if tb else (k, n)
        fn = lambda a, b: (a.t() if ta else a) @ (b.t() if tb else b)
        out.append((name, [a_shape, b_shape], plain(fn), 2.0 * m * n * k, 0))

    gemm("gemm 4096^3", 4096 // s, 4096 // s, 4096 // s, False, False)

    # y = x W^T with x [128, in] and W [out, in]; dX = dY W; dW = dY^T x. Names give M x N x K.
    def linear(layer, inputs, outputs):
        tokens = 128
        gemm(f"smollm {layer} {tokens}x{outputs}x{inputs}", tokens, outputs, inputs, False, True)
        gemm(f"smollm {layer} dX {tokens}x{inputs}x{outputs}", tokens, inputs, outputs, False, False)
        gemm(f"smollm {layer} dW {outputs}x{inputs}x{tokens}", outputs, inputs, tokens, True, False)

    linear("q_proj", 576, 576)
    linear("up", 576, 1536)
    linear("down", 1536, 576)
    linear("lm_head", 576, 49152 // s)

    elements = (64 << 20) // s // s
    out.append(("pointwise add 64M", [(elements,), (elements,)], plain(lambda a, b: a + b), 0,
                12.0 * elements))
    out.append(("pointwise add 64M+2", [(elements + 2,), (elements + 2,)],
                plain(lambda a, b: a + b), 0, 12.0 * (elements + 2)))
    out.append(("pointwise gelu 64M", [(elements,)], plain(F.gelu), 0, 8.0 * elements))
    rows, width = 16384 // s, 4096 // s
    out.append(("pointwise bias add 16384x4096", [(rows, width), (width,)],
                plain(lambda a, b: a + b), 0, 8.0 * rows * width + 4.0 * width))
    out.append(("row sum 16384x4096", [(rows, width)], plain(lambda a: a.sum(1)), 0,
                4.0 * rows * width + 4.0 * rows))
    out.append(("softmax 16384x4096", [(rows, width)], plain(lambda a: torch.softmax(a, 1)), 0,
                8.0 * rows * width))

    def conv(name, c, o, hw, kernel, stride):
        batch, side, padding = 4, max(hw // s, 3), kernel // 2
        size = (side + 2 * padding - kernel) // stride + 1
        x, w, dy = (batch, c, side, side), (o, c, kernel, kernel), (batch, o, size, size)
        flops = 2.0 * batch * o * size * size * c * kernel * kernel
        out.append((name, [x, w], plain(lambda x_, w_: F.conv2d(x_, w_, stride=stride, padding=padding)),
                    flops, 0))
        out.append((name + " dX", [dy, w],
                    plain(lambda dy_, w_: torch.nn.grad.conv2d_input(x, w_, dy_, stride=stride,
                                                                     padding=padding)),
                    flops, 0))
        out.append((name + " dW", [x, dy],
                    plain(lambda x_, dy_: torch.nn.grad.conv2d_weight(x_, w, dy_, stride=stride,
                                                                      padding=padding)),
                    flops, 0))

    conv("resnet conv 7x7/2 3->64 224", 3, 64, 224, 7, 2)
    conv("resnet conv 3x3 64->64 56", 64, 64, 56, 3, 1)
    conv("resnet conv 1x1 256->64 56", 256, 64, 56, 1, 1)
    conv("resnet conv 1x1 512->128 28", 512, 128, 28, 1, 1)
    conv("resnet conv 3x3/2 128->128 56", 128, 128, 56, 3, 2)
    conv("resnet conv 3x3 128->128 28", 128, 128, 28, 3, 1)
    conv("resnet conv 3x3 256->256 14", 256, 256, 14, 3, 1)
    conv("resnet conv 3x3 512->512 7", 512, 512, 7, 3, 1)

    heads, tokens, head_dim = 6, 1500 // s, 64
    head = (1, heads, tokens, head_dim)
    attention_flops = 4.0 * heads * tokens * tokens * head_dim
    out.append(("whisper attention 1500x6x64", [head] * 3, plain(attention), attention_flops, 0))
    out.append(("whisper attention 1500x6x64 bwd", [head] * 4, attention_backward,
                2.5 * attention_flops, 0))
    out.append(("whisper attention 1500x6x64 train", [head] * 4, attention_training,
                3.5 * attention_flops, 0))

    # SmolVLA's action expert at a chunk of 50 actions: y = x W^T, x [50, in] and W [out, in].
    def expert(layer, inputs, outputs):
        gemm(f"smolvla expert {layer} 50x{outputs}x{inputs}", 50, outputs, inputs, False, True)

    expert("q_proj", 720, 960)
    expert("k_proj", 720, 320)
    expert("o_proj", 960, 720)
    expert("up", 720, 2048)
    expert("down", 2048, 720)

    # SmolVLA's vision tower (SigLIP of SmolVLM2-500M) over one 512 x 512 image's 1,024 patches.
    def vision(layer, inputs, outputs):
        patches = 1024 // s
        name = f"smolvla vision {layer} {patches}x{outputs}x{inputs}"
        gemm(name, patches, outputs, inputs, False, True)

    vision("q_proj", 768, 768)
    vision("fc1", 768, 3072)
    vision("fc2", 3072, 768)

    def flow_attention(keys, masked):
        queries, q_heads, kv_heads, width = 50, 15, 5, 64
        shapes = [(1, q_heads, queries, width), (1, kv_heads, keys, width), (1, kv_heads, keys, width)]
        if masked:
            shapes.append((1, 1, queries, keys))
        out.append((f"smolvla flow attention 50x{keys} 15/5" + (" masked" if masked else ""), shapes,
                    plain(grouped_attention), 4.0 * q_heads * queries * keys * width, 0))

    flow_attention(113, True)
    flow_attention(163, True)
    flow_attention(163, False)

    def unet(side):
        batch, channels, extent = 2, 320, side // s
        fn = lambda x, gw, gb, w, b: F.conv2d(F.silu(F.group_norm(x, 32, gw, gb, eps=1e-5)), w, b,
                                              padding=1)
        out.append((f"unet groupnorm+silu+conv3x3 2x320x{side}x{side}",
                    [(batch, channels, extent, extent), (channels,), (channels,),
                     (channels, channels, 3, 3), (channels,)],
                    plain(fn), 2.0 * batch * channels * extent * extent * channels * 9, 0))
        plane, w = (batch, channels, extent, extent), (channels, channels, 3, 3)
        out.append((f"unet conv3x3 dW 2x320x{side}x{side}", [plane, plane],
                    plain(lambda x_, dy_: torch.nn.grad.conv2d_weight(x_, w, dy_, padding=1)),
                    2.0 * batch * channels * extent * extent * channels * 9, 0))

    unet(32)
    unet(64)
    return out


# The cases that also run in f16, as "<name> fast" (Meganeura's --precision fast twins).
FAST_CASE_PREFIXES = ("gemm 4096^3", "smollm", "resnet conv 3x3 64->64", "resnet conv 3x3/2",
                      "whisper attention", "unet", "smolvla")


# The cases that also run on f16 tensors in Meganeura, as "<name> f16"; here the same as "fast".
F16_CASE_PREFIXES = ("gemm 4096^3", "smollm", "smolvla expert", "smolvla vision")


# The cases that also run in bfloat16, as "<name> bf16" (Meganeura's --precision bf16 twins).
BF16_CASE_PREFIXES = ("gemm 4096^3",)


def with_fast_twins(strict_cases):
    """(name, shapes, make, flops, bytes, dtype): every case in f32, the listed ones also in f16
    and bfloat16."""
    listed = [(*case, torch.float32) for case in strict_cases]
    twins = [(name + suffix, *rest, dtype)
             for suffix, prefixes, dtype in ((" fast", FAST_CASE_PREFIXES, torch.float16),
                                             (" f16", F16_CASE_PREFIXES, torch.float16),
                                             (" bf16", BF16_CASE_PREFIXES, torch.bfloat16))
             for name, *rest in strict_cases if name.startswith(prefixes)]
    return listed + twins


def rotation_copies(shapes, rotate_bytes):
    input_bytes = sum(4.0 * math.prod(shape) for shape in shapes)
    return min(MAX_COPIES, max(1, math.ceil(rotate_bytes / input_bytes)))


class Timer:
    """Median per-copy time of running every copy's call once, over `runs` runs."""

    def __init__(self, device, graphs):
        self.cuda = device == "cuda"
        self.graphs = graphs and self.cuda

    def run_all(self, calls):
        for call in calls:
            call()

    def capture(self, calls):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # capture wants its warm-up off the default stream
            self.run_all(calls)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.run_all(calls)
        return graph.replay

    def time(self, calls, runs):
        replay, timing = (lambda: self.run_all(calls)), "eager"
        if self.graphs:
            try:
                replay, timing = self.capture(calls), "cuda graph"
            except Exception:  # capture support varies by op and version: time it eagerly
                torch.cuda.synchronize()
        # As in `meganeura bench`: back-to-back runs for WARMUP_SECONDS (at least 3) first, so
        # that the GPU's clocks, lowered while idle, are up again before anything is timed.
        start = time.perf_counter()
        warmups = 0
        while warmups < 3 or time.perf_counter() - start < WARMUP_SECONDS:
            replay()
            self.synchronize()
            warmups += 1
        times = []
        for _ in range(runs):
            if self.cuda:
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                replay()
                end.record()
                torch.cuda.synchronize()
                elapsed = start.elapsed_time(end)
            else:
                begin = time.perf_counter()
                replay()
                elapsed = (time.perf_counter() - begin) * 1e3
            times.append(elapsed / len(calls))
        return sorted(times)[len(times) // 2], timing

    def synchronize(self):
        if self.cuda:
            torch.cuda.synchronize()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--filter", default="", help="only cases whose name contains this")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rotate", type=float, default=None,
                        help="MiB of inputs to rotate through (default 96; --small: 1)")
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--no-graphs", action="store_true", help="time eagerly, no CUDA graphs")
    parser.add_argument("--no-fast", action="store_true",
                        help="leave out the \"fast\", \"f16\" and \"bf16\" twins")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rotate_bytes = (args.rotate if args.rotate is not None else 1 if args.small else 96) * 2**20
    framework = f"pytorch {torch.__version__}"
    timer = Timer(device, not args.no_graphs)
    generator = torch.Generator().manual_seed(0)

    copy_bytes = (16 if args.small else 256) << 20
    copy_name = f"copy {copy_bytes >> 20}MiB"
    if args.filter in copy_name:
        source = torch.empty(copy_bytes // 4, device=device)
        target = torch.empty_like(source)
        ms, timing = timer.time([lambda: target.copy_(source)], args.runs)
        print(json.dumps({"framework": framework, "case": copy_name, "ms": ms,
                          "gbps": 2.0 * copy_bytes / ms / 1e6, "timing": timing}), flush=True)

    for name, shapes, make, flops, nbytes, dtype in with_fast_twins(cases(args.small)):
        if args.filter not in name or (args.no_fast and dtype != torch.float32):
            continue
        if dtype != torch.float32 and device != "cuda":
            continue  # CPU PyTorch 1.13 lacks f16 kernels for these ops
        copies = rotation_copies(shapes, rotate_bytes)
        # Drawn on the CPU: a failed CUDA-graph capture of an earlier case leaves CUDA's
        # generator unusable ("Offset increment outside graph capture").
        calls = [make([(torch.rand(shape, generator=generator) * 2 - 1).to(device, dtype)
                       for shape in shapes])
                 for _ in range(copies)]
        ms, timing = timer.time(calls, args.runs)
        record = {"framework": framework, "case": name, "ms": ms, "copies": copies,
                  "timing": timing, "dtype": str(dtype).replace("torch.", "")}
        if flops:
            record["gflops"] = flops / ms / 1e6
        else:
            record["gbps"] = nbytes / ms / 1e6
        print(json.dumps(record), flush=True)
        del calls
        if device == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
