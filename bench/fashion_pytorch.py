"""PyTorch baseline for the Fashion-MNIST classifier job: the same CNN/MLP, batch and optimizer as
`meganeura train`, timed on the same GPU. Prints one JSON object per (framework, model, mode).

Usage: python3 bench/fashion_pytorch.py --model cnn --batch 64 --steps 200
Random inputs of the right shapes are used: the timing does not depend on pixel values.
"""
import argparse
import json
import time

import torch
import torch.nn as nn


def build(model: str) -> nn.Module:
    if model == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128),
                             nn.ReLU(), nn.Linear(128, 10))
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(32 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


def timed(fn, steps: int, device: str) -> float:
    for _ in range(10):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--eval-batch", type=int, default=500)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    model = build(args.model).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    images = torch.rand(args.batch, 1, 28, 28, device=device)
    labels = torch.randint(0, 10, (args.batch,), device=device)

    def train_step():
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()

    train_s = timed(train_step, args.steps, device)
    eval_images = torch.rand(args.eval_batch, 1, 28, 28, device=device)

    @torch.no_grad()
    def infer():
        model(eval_images)

    infer_s = timed(infer, args.steps, device)
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    common = {"framework": f"pytorch {torch.__version__} eager", "model": args.model, "device": device,
              "gpu_name": name}
    print(json.dumps({**common, "mode": "train", "batch": args.batch,
                      "timings": {"training_ms": train_s * 1e3},
                      "images_per_second": args.batch / train_s}))
    print(json.dumps({**common, "mode": "infer", "batch": args.eval_batch,
                      "timings": {"inference_ms": infer_s * 1e3},
                      "images_per_second": args.eval_batch / infer_s}))


if __name__ == "__main__":
    main()
