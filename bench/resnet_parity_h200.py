"""ResNet-50 parity against torchvision itself, for a machine with torchvision and safetensors
(the H200's Python): torchvision.models.resnet50() with random weights (batch-norm affine
parameters and running statistics randomised too, so no normalisation is an identity) is saved
as a safetensors state dict, num_batches_tracked included; ten batches of 4 random 224x224
images and labels likewise. The CI twin's procedure (tests/parity/resnet_twin.py,
`reference_and_float32`) then runs torchvision in float64 and again in float32 (CUDA, TF32 off):
inference logits (running statistics) on batch 0; ten chained SGD steps (lr 0.01, momentum 0.9)
in training mode, keeping the first step's logits and gradients, every loss, and the state
(parameters, running statistics, momentum buffers) after every step; and in float32 each step
alone from the float64 chain's state before it. Meganeura's side is the test
ResNetParity.Resnet50MatchesTorchvision of test_parity, which loads the state dict through the
CLI's loader and, per precision, checks the chained run and then every step alone from float64's
state before it. Each bound is max(floor, 10 x PyTorch float32's worst error of that kind in the
same comparison; for the steps alone, the median over the steps against float32's median and
every step against float32's largest), since ten chained steps of this network amplify rounding
until float32 and float64 PyTorch disagree by tens of percent (docs/RESNET.md); in fast
precision a bound is also at least 2 x PyTorch AMP's error in the same comparison (the same
chained run and steps alone under torch.autocast float16 with loss scaling, written beside as
"amp." + name), since on these random weights AMP's own early-layer gradients miss the fast
floors; the floors:

  strict: logits and losses rel. L2 < 1e-4, per-parameter gradient norms within 1e-3, gradients
          (and momentum buffers) 1e-2, running statistics 1e-5, parameters 1e-4
  fast:   1e-2, 5e-2, 2e-1, 1e-2 and 1e-2

Before the fast run it prints PyTorch's own mixed precision on the same first training step
(torch.autocast float16 with GradScaler-style loss scaling, bench/amp_gradients.py): its
per-parameter gradient-norm errors against float64's, worst first, beside PyTorch float32's, which
says whether an f16 implementation can meet the 5e-2 gradient-norm gate on these random weights
at all (printed, not gated).

It prints, per precision, PASS or FAIL, every chained step's loss beside float64's and PyTorch
float32's, the worst tensor of each kind of the chained run and of every step alone (with
PyTorch float32's error beside it), and the first failed checks; the test's whole output goes to
WORK_DIR/test_<precision>.log. The results file is a few GB (a state per step).

Usage: python3 bench/resnet_parity_h200.py TEST_PARITY_BINARY [WORK_DIR] [--precision strict|fast|both]
Exit status 0 when every requested precision passes.
"""
import argparse
import copy
import json
import os
import subprocess
import sys

import torch
import torchvision
from safetensors.torch import save_file

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "parity"))
import resnet_twin  # noqa: E402  (the CI twin's reference procedure, shared so both check alike)
from amp_gradients import amp_gradient_norms, relative_errors  # noqa: E402

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


def print_amp_errors(model, images, labels, results, count=8):
    """PyTorch AMP's and PyTorch float32's per-parameter gradient-norm errors of the first training
    step against float64's (results' grad.<name> and float32.grad.<name>), AMP's worst first."""
    def norms_of(prefix):
        return {name[len(prefix):]: float(value.double().norm()) for name, value in results.items()
                if name.startswith(prefix)}
    reference = norms_of("grad.")
    float32 = relative_errors(norms_of("float32.grad."), reference)
    amp_model = copy.deepcopy(model).cuda().train()
    x, y = images[0].cuda(), labels[0].long().cuda()
    amp = relative_errors(amp_gradient_norms(
        amp_model.named_parameters(), lambda: torch.nn.functional.cross_entropy(amp_model(x), y)),
        reference)
    print("first step's gradient norms against float64 (bound 5e-2 fast):")
    print("%-40s %12s %12s" % ("parameter", "pytorch amp", "float32"))
    for name in sorted(amp, key=lambda name: -amp[name])[:count]:
        print("%-40s %12.3g %12.3g" % (name, amp[name], float32.get(name, float("nan"))))
    print("parameters past 5e-2: PyTorch AMP %d, float32 %d, of %d" % (
        sum(error > 5e-2 for error in amp.values()), sum(error > 5e-2 for error in float32.values()),
        len(amp)), flush=True)


def amp_sgd_step(model, optimizer, images, labels):
    """One SGD step under torch.autocast float16 with GradScaler-style loss scaling: the loss times
    a scale that starts at 2^16 and halves while a gradient is not finite (the batch-norm
    statistics of a retried forward are put back first), the gradients divided by it."""
    buffers = {name: value.clone() for name, value in model.named_buffers()}
    scale = 65536.0
    while True:
        optimizer.zero_grad()
        with torch.autocast("cuda", dtype=torch.float16):
            logits = model(images)
        loss = torch.nn.functional.cross_entropy(logits.float(), labels)
        (loss * scale).backward()
        gradients = [p.grad for p in model.parameters() if p.grad is not None]
        if all(bool(torch.isfinite(g).all()) for g in gradients) or scale <= 1.0:
            break
        scale /= 2
        with torch.no_grad():
            for name, value in model.named_buffers():
                value.copy_(buffers[name])
    for gradient in gradients:
        gradient.div_(scale)
    optimizer.step()
    return logits.float(), loss


def amp_results(model, images, labels, learning_rate, momentum, states):
    """PyTorch AMP's results under "amp." + the names the test compares: the chained run's and
    every step alone from the float64 chain's state before it, as resnet_twin gives float32's."""
    make_model = lambda: copy.deepcopy(model).float()  # noqa: E731
    results, _ = resnet_twin.reference(make_model, images, labels, learning_rate, momentum,
                                       torch.float32, "cuda", step_of=amp_sgd_step)
    results.update(resnet_twin.one_step_results(make_model, images, labels, learning_rate, momentum,
                                                states, "cuda", step_of=amp_sgd_step))
    return {"amp." + name: value for name, value in results.items()}


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
    results, states = resnet_twin.reference_and_float32(lambda: copy.deepcopy(model).double(), images,
                                                        labels, 0.01, 0.9, device, states_too=True)
    if args.precision != "strict" and device == "cuda":
        print_amp_errors(model, images, labels, results)
        results.update(amp_results(model, images, labels, 0.01, 0.9, states))
    save_file(results, os.path.join(args.work, "torchvision.safetensors"),
              metadata={"state_dict_names": json.dumps(list(state))})
    print("torchvision %s side written to %s (reference on %s, float64)" % (torchvision.__version__, args.work, device),
          flush=True)

    failed = False
    for precision in (["strict", "fast"] if args.precision == "both" else [args.precision]):
        environment = dict(os.environ, MEGANEURA_RESNET50_PARITY=args.work, MEGANEURA_RESNET50_PRECISION=precision)
        run = subprocess.run([args.binary, "--gtest_filter=ResNetParity.Resnet50MatchesTorchvision"],
                             env=environment, capture_output=True, text=True)
        log = os.path.join(args.work, "test_%s.log" % precision)
        with open(log, "w") as handle:
            handle.write(run.stdout + run.stderr)
        lines = run.stdout.splitlines()
        failures = [lines[i] + " " + lines[i + 1] for i in range(len(lines) - 1) if lines[i].startswith("Expected")]
        print("%s: %s (%d failed checks; the whole output in %s)" % (
            precision, "PASS" if run.returncode == 0 else "FAIL", len(failures), log))
        for line in lines:
            if line.startswith("parity ") or "OK ]" in line or "FAILED ]" in line or "SKIPPED" in line:
                print("  " + line)
        for line in failures[:20]:
            print("  " + line)
        if run.returncode != 0 and not failures:
            print(run.stdout[-3000:] + run.stderr[-3000:])
        failed = failed or run.returncode != 0
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
