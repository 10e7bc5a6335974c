"""PyTorch's training images/s at the ResNet demo's configuration, for scripts/resnet_demo.sh to
print beside Meganeura's: torchvision's resnet<depth>(num_classes=10) in eager mode, random
images of size x size and labels, AdamW, after a warm-up; fast adds autocast to f16 with a
GradScaler (AMP). Prints one line: "pytorch eager (<mode>): N images/s".

Usage: python3 bench/resnet_demo_pytorch.py DEPTH SIZE BATCH [strict|fast]
"""
import sys
import time

import torch
import torchvision


def main():
    depth, size, batch = (int(value) for value in sys.argv[1:4])
    mode = sys.argv[4] if len(sys.argv) > 4 else "strict"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    model = getattr(torchvision.models, "resnet%d" % depth)(num_classes=10).cuda().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    fast = mode == "fast"
    scaler = torch.cuda.amp.GradScaler(enabled=fast)
    images = torch.randn(batch, 3, size, size, device="cuda")
    labels = torch.randint(0, 10, (batch,), device="cuda")

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16, enabled=fast):
            loss = torch.nn.functional.cross_entropy(model(images).float(), labels)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

    for _ in range(10):
        step()
    torch.cuda.synchronize()
    steps = 50
    begin = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    print("pytorch eager (%s): %.1f images/s" % (mode, steps * batch / (time.perf_counter() - begin)))


if __name__ == "__main__":
    main()
