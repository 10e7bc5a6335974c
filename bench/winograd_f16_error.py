#!/usr/bin/env python3
"""The rounding error of a Winograd 3x3 weight gradient whose transformed tiles are f16, as the
fast precision's products read them (docs/KERNELS.md, the Winograd weight gradient).

For F(2 x 2, 3 x 3) and F(4 x 4, 3 x 3) (the points of src/ops/winograd.hpp, and other point sets
for F(4 x 4) given with --points), the script computes dW = G^T [sum over tiles (A dY A^T) .
(B^T d B)] G in f64 with the transformed tiles rounded to f16, and prints its normalised error
||dW - exact|| / ||exact|| against the direct sum, beside that of the direct sum over f16
operands (an im2col product in f16). Inputs are uniform in [-1, 1], as the op harness draws them.

usage: winograd_f16_error.py [--batch N] [--channels C] [--size H] [--seed S]
                             [--points P1,P2,P3,P4,P5]...
"""
import argparse

import numpy as np

# src/ops/winograd.hpp: B^T (input), A (grad) and G (filter) of each variant.
F2 = (np.array([1, 0, -1, 0, 0, 1, 1, 0, 0, -1, 1, 0, 0, 1, 0, -1.0]).reshape(4, 4),
      np.array([1, 0, 1, 1, 1, -1, 0, -1.0]).reshape(4, 2),
      np.array([1, 0, 0, 0.5, 0.5, 0.5, 0.5, -0.5, 0.5, 0, 0, 1]).reshape(4, 3))
F4 = (np.array([4, 0, -5, 0, 1, 0, 0, -4, -4, 1, 1, 0, 0, 4, -4, -1, 1, 0,
                0, -2, -1, 2, 1, 0, 0, 2, -1, -2, 1, 0, 0, 4, 0, -5, 0, 1.0]).reshape(6, 6),
      np.array([1, 0, 0, 0, 1, 1, 1, 1, 1, -1, 1, -1, 1, 2, 4, 8, 1, -2, 4, -8,
                0, 0, 0, 1.0]).reshape(6, 4),
      np.array([1 / 4, 0, 0, -1 / 6, -1 / 6, -1 / 6, -1 / 6, 1 / 6, -1 / 6, 1 / 24, 1 / 12,
                1 / 6, 1 / 24, -1 / 12, 1 / 6, 0, 0, 1]).reshape(6, 3))


def variant_from_points(points, outputs=4, kernel=3):
    """A and G of the Toom-Cook construction on `points` and infinity, and B^T solved from the
    condition that makes the product exact: sum_j G[j,k] A[j,i] B^T[j,l] = [l == i + k]."""
    n = outputs + kernel - 1
    a = np.zeros((n, outputs))
    g = np.zeros((n, kernel))
    for j, p in enumerate(points):
        a[j] = [p ** i for i in range(outputs)]
        g[j] = [p ** k / np.prod([p - q for q in points if q != p]) for k in range(kernel)]
    a[n - 1, outputs - 1] = 1
    g[n - 1, kernel - 1] = 1
    rows, rhs = [], []
    for i in range(outputs):
        for k in range(kernel):
            for l in range(n):
                row = np.zeros((n, n))
                row[:, l] = g[:, k] * a[:, i]
                rows.append(row.ravel())
                rhs.append(1.0 if l == i + k else 0.0)
    solution = np.linalg.lstsq(np.array(rows), np.array(rhs), rcond=None)[0]
    residual = np.abs(np.array(rows) @ solution - np.array(rhs)).max()
    if residual > 1e-9:
        raise SystemExit(f"points {points}: no exact transform (residual {residual:.1e})")
    return solution.reshape(n, n), a, g


def f16(values):
    return values.astype(np.float16).astype(np.float64)


def direct_weight_gradient(x, dy):
    _, _, height, width = x.shape
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    result = np.zeros((dy.shape[1], x.shape[1], 3, 3))
    for u in range(3):
        for v in range(3):
            result[:, :, u, v] = np.einsum("nohw,nchw->oc", dy,
                                           padded[:, :, u:u + height, v:v + width])
    return result


def winograd_weight_gradient(x, dy, transforms, round_tiles):
    input_t, grad_t, filter_t = transforms
    outputs = grad_t.shape[1]
    tile = outputs + 2
    batch, _, height, width = x.shape
    tiles_h, tiles_w = -(-height // outputs), -(-width // outputs)
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1 + tiles_h * outputs - height),
                        (1, 1 + tiles_w * outputs - width)))
    grads = np.pad(dy, ((0, 0), (0, 0), (0, tiles_h * outputs - height),
                        (0, tiles_w * outputs - width)))
    products = np.zeros((dy.shape[1], x.shape[1], tile, tile))
    for n in range(batch):
        for i in range(tiles_h):
            for j in range(tiles_w):
                d = padded[n, :, i * outputs:i * outputs + tile, j * outputs:j * outputs + tile]
                g = grads[n, :, i * outputs:(i + 1) * outputs, j * outputs:(j + 1) * outputs]
                v = np.einsum("ab,cbd,ed->cae", input_t, d, input_t)
                u = np.einsum("ab,obd,ed->oae", grad_t, g, grad_t)
                if round_tiles:
                    u, v = f16(u), f16(v)
                products += np.einsum("oxy,cxy->ocxy", u, v)
    return np.einsum("xa,ocxy,yb->ocab", filter_t, products, filter_t)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--channels", type=int, default=32)
    parser.add_argument("--size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--points", action="append", default=[],
                        help="five finite points for an F(4 x 4) variant, e.g. 0,1,-1,2,-0.5")
    args = parser.parse_args()
    generator = np.random.default_rng(args.seed)
    shape = (args.batch, args.channels, args.size, args.size)
    x, dy = generator.uniform(-1, 1, shape), generator.uniform(-1, 1, shape)
    exact = direct_weight_gradient(x, dy)

    def error(values):
        return np.linalg.norm(values - exact) / np.linalg.norm(exact)

    print(f"direct sum over f16 operands      {error(direct_weight_gradient(f16(x), f16(dy))):.2e}")
    variants = [("F(2 x 2)", F2), ("F(4 x 4)", F4)]
    for text in args.points:
        points = tuple(float(p) for p in text.split(","))
        variants.append((f"F(4 x 4) on {text}", variant_from_points(points)))
    for name, transforms in variants:
        in_f64 = error(winograd_weight_gradient(x, dy, transforms, False))
        in_f16 = error(winograd_weight_gradient(x, dy, transforms, True))
        print(f"{name:<34s}{in_f16:.2e} (f64 tiles: {in_f64:.1e})")


if __name__ == "__main__":
    main()
