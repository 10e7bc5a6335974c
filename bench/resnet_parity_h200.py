"""ResNet-50 parity against torchvision itself, for a machine with torchvision and safetensors
(the H200's Python): torchvision.models.resnet50() with random weights (batch-norm affine
parameters and running statistics randomised too, so no normalisation is an identity) is saved
as a safetensors state dict, num_batches_tracked included; ten batches of 4 random 224x224
images and labels likewise. torchvision then runs in float64: inference logits (running
statistics) on batch 0, and ten SGD steps (lr 0.01, momentum 0.9) in training mode, keeping the
first step's logits and every parameter's gradient, every loss, and every parameter and running
statistic at the end. Meganeura's side is the test ResNetParity.Resnet50MatchesTorchvision of
test_parity, which loads the state dict through the CLI's loader and checks, per precision:

  strict: logits and losses rel. L2 < 1e-4, per-parameter gradient norms within 1e-3, running
          statistics within 1e-5 (parameters 1e-4) after the ten steps
  fast:   logits < 1e-2, gradient norms within 5e-2, running statistics and parameters 1e-2

Usage: python3 bench/resnet_parity_h200.py TEST_PARITY_BINARY [WORK_DIR] [--precision strict|fast|both]
Exit status 0 when every requested precision passes.
"""
import argparse
import json
import os
import subprocess
import sys

import torch
import torchvision
from safetensors.torch import save_file

STEPS, BATCH, SIDE = 10, 4, 224


def random_model():
    torch.manual_seed(0)
    model = torchvision.models.resnet50()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                shape = module.weight.shape
                module.weight.copy_(torch.rand(shape, generator=generator) + 0.5)
                module.bias.copy_(torch.rand(shape, generator=generator) * 0.6 - 0.3)
                module.running_mean.copy_(torch.rand(shape, generator=generator) * 0.6 - 0.3)
                module.running_var.copy_(torch.rand(shape, generator=generator) + 0.5)
    return model


def reference(model, images, labels, device):
    """torchvision's results in float64, under the names the test gives its own."""
    results = {}
    initial = {name: value.clone() for name, value in model.state_dict().items()}
    model = model.double().to(device)
    model.eval()
    with torch.no_grad():
        results["eval.logits"] = model(images[0].double().to(device))
    model.load_state_dict(initial)
    model = model.double().to(device)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    losses = []
    for step in range(STEPS):
        optimizer.zero_grad()
        logits = model(images[step].double().to(device))
        loss = torch.nn.functional.cross_entropy(logits, labels[step].long().to(device))
        loss.backward()
        if step == 0:
            results["train.logits"] = logits.detach()
            for name, parameter in model.named_parameters():
                results["grad." + name] = parameter.grad.detach().clone()
        losses.append(loss.item())
        optimizer.step()
    results["train.losses"] = torch.tensor(losses)
    for name, value in model.state_dict().items():
        if not name.endswith("num_batches_tracked"):
            results["final." + name] = value
    return {name: value.float().cpu().contiguous() for name, value in results.items()}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("binary", help="test_parity built from this tree")
    parser.add_argument("work", nargs="?", default="/tmp/resnet50-parity")
    parser.add_argument("--precision", default="both", choices=["strict", "fast", "both"])
    args = parser.parse_args()
    os.makedirs(args.work, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    model = random_model()
    state = {name: value.contiguous() for name, value in model.state_dict().items()}
    save_file(state, os.path.join(args.work, "resnet50.safetensors"))
    generator = torch.Generator().manual_seed(2)
    images = torch.randn(STEPS, BATCH, 3, SIDE, SIDE, generator=generator)
    labels = torch.randint(0, 1000, (STEPS, BATCH), generator=generator, dtype=torch.int32)
    save_file({"images": images, "labels": labels}, os.path.join(args.work, "batches.safetensors"))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    results = reference(model, images, labels, device)
    save_file(results, os.path.join(args.work, "torchvision.safetensors"),
              metadata={"state_dict_names": json.dumps(list(state))})
    print("torchvision %s side written to %s (reference on %s, float64)" % (torchvision.__version__, args.work, device),
          flush=True)

    failed = False
    for precision in (["strict", "fast"] if args.precision == "both" else [args.precision]):
        environment = dict(os.environ, MEGANEURA_RESNET50_PARITY=args.work, MEGANEURA_RESNET50_PRECISION=precision)
        run = subprocess.run([args.binary, "--gtest_filter=ResNetParity.Resnet50MatchesTorchvision"],
                             env=environment, capture_output=True, text=True)
        lines = [line for line in run.stdout.splitlines()
                 if "worst relative" in line or "Failure" in line or "Expected" in line or "OK ]" in line
                 or "FAILED ]" in line or "SKIPPED" in line or "error" in line]
        print("%s: %s" % (precision, "PASS" if run.returncode == 0 else "FAIL"))
        for line in lines[:40]:
            print("  " + line)
        if run.returncode != 0 and not lines:
            print(run.stdout[-3000:] + run.stderr[-3000:])
        failed = failed or run.returncode != 0
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
