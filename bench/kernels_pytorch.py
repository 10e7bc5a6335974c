"""PyTorch side of `meganeura bench kernels`: the same cases, timed with CUDA events (median of
--runs after warm-up), strict f32 (TF32 off). Prints one JSON object per case.

Usage: python3 bench/kernels_pytorch.py [--runs 20] [--small]
"""
import argparse
import json

import torch
import torch.nn.functional as F


def cases(small):
    s = 8 if small else 1
    out = []

    def gemm(name, m, n, k, ta, tb):
        a_shape = (k, m) if ta else (m, k)
        b_shape = (n, k) if tb else (k, n)
        fn = lambda a, b: (a.t() if ta else a) @ (b.t() if tb else b)
        out.append((name, [a_shape, b_shape], fn, 2.0 * m * n * k, 4.0 * (m * k + k * n + m * n)))

    gemm("gemm 4096^3", 4096 // s, 4096 // s, 4096 // s, False, False)
    gemm("smollm q_proj 128x576x576", 128, 576, 576, False, True)
    gemm("smollm up 128x1536x576", 128, 1536, 576, False, True)
    gemm("smollm down 128x576x1536", 128, 576, 1536, False, True)
    gemm("smollm lm_head 128x49152x576", 128, 49152 // s, 576, False, True)
    gemm("smollm up dW 1536x576x128", 1536, 576, 128, True, False)
    gemm("smollm up dX 128x576x1536", 128, 576, 1536, False, False)
    elements = (64 << 20) // s // s
    out.append(("pointwise add 64M", [(elements,), (elements,)], lambda a, b: a + b, 0, 12.0 * elements))
    out.append(("pointwise gelu 64M", [(elements,)], lambda a: F.gelu(a), 0, 8.0 * elements))
    rows, width = 16384 // s, 4096 // s
    out.append(("row sum 16384x4096", [(rows, width)], lambda a: a.sum(1), 0, 4.0 * rows * width))
    out.append(("softmax 16384x4096", [(rows, width)], lambda a: torch.softmax(a, 1), 0, 8.0 * rows * width))

    def conv(name, c, o, hw, kernel, stride):
        side = hw // s
        padding = kernel // 2
        size = (side + 2 * padding - kernel) // stride + 1
        out.append((name, [(4, c, side, side), (o, c, kernel, kernel)],
                    lambda x, w: F.conv2d(x, w, stride=stride, padding=padding),
                    2.0 * 4 * o * size * size * c * kernel * kernel, 0))

    conv("resnet conv 7x7/2 3->64 224", 3, 64, 224, 7, 2)
    conv("resnet conv 3x3 64->64 56", 64, 64, 56, 3, 1)
    conv("resnet conv 1x1 256->64 56", 256, 64, 56, 1, 1)
    conv("resnet conv 3x3/2 128->128 56", 128, 128, 56, 3, 2)
    tokens = 1500 // s

    def attention(q, k, v):
        scores = (q @ k.transpose(-1, -2)) / 8.0
        return torch.softmax(scores, -1) @ v

    out.append(("whisper attention 1500x6x64", [(1, 6, tokens, 64)] * 3,
                getattr(F, "scaled_dot_product_attention", attention), 4.0 * 6 * tokens * tokens * 64, 0))
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--small", action="store_true")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = "cuda"
    for name, shapes, fn, flops, nbytes in cases(args.small):
        inputs = [torch.rand(shape, device=device) * 2 - 1 for shape in shapes]
        for _ in range(3):
            fn(*inputs)
        times = []
        for _ in range(args.runs):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(*inputs)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        ms = sorted(times)[len(times) // 2]
        record = {"framework": f"pytorch {torch.__version__}", "case": name, "ms": ms}
        if flops:
            record["gflops"] = flops / ms / 1e6
        else:
            record["gbps"] = nbytes / ms / 1e6
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
