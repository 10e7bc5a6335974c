"""Stable Diffusion 1.5 U-Net parity on the GPU machine (issue 37's gates): bench/unet_twin.py
(diffusers' UNet2DConditionModel in plain torch) at SD 1.5's exact config with random weights,
saved as a diffusers folder (config.json + diffusion_pytorch_model.safetensors), against
Meganeura's unet_parity binary on that folder, batch 2 of 64x64 latents with 77 tokens of 768:

  strict: noise prediction rel. L2 < 1e-4, every parameter's gradient norm within 1e-3;
  fast:   noise prediction rel. L2 < 1e-2, gradient norms within 5e-2; beside it, PyTorch's own
          f16 autocast on the same weights (bench/amp_gradients.py): its worst error and its error
          at the five parameters where ours is worst (printed, not gated).
The reference runs in f32 on the GPU with TF32 off.

Usage: python3 bench/unet_parity_h200.py BIN_DIR OUT_DIR
(BIN_DIR holds the unet_parity binary: build/bench after `ninja -C build unet_parity`.)
Prints one JSON line per check and a table; exits 1 if a gate fails.
"""
import json
import os
import subprocess
import sys

import torch

here = os.path.dirname(os.path.abspath(__file__))
# bench/ first: tests/parity/unet_twin.py is the CI driver of the same twin, not the twin.
sys.path.insert(0, os.path.join(here, "..", "tests", "parity"))
sys.path.insert(0, here)
import safetensors_lite  # noqa: E402
from amp_gradients import amp_gradient_norms, print_beside, relative_errors  # noqa: E402
import unet_twin  # noqa: E402

bin_dir, out = sys.argv[1:3]
os.makedirs(out, exist_ok=True)
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False

folder = os.path.join(out, "sd15-unet")
os.makedirs(folder, exist_ok=True)
torch.manual_seed(0)
model = unet_twin.UNet2DConditionModel(unet_twin.SD15_CONFIG).float()
with open(os.path.join(folder, "config.json"), "w") as f:
    json.dump(unet_twin.SD15_CONFIG, f, indent=1)
safetensors_lite.save(os.path.join(folder, "diffusion_pytorch_model.safetensors"), model.state_dict(),
                      {"format": "pt"})
model = model.cuda()

generator = torch.Generator().manual_seed(1)
inputs = {"sample": torch.randn(2, 4, 64, 64, generator=generator),
          "timestep": torch.tensor([981.0, 37.0]),
          "encoder_hidden_states": torch.randn(2, 77, 768, generator=generator),
          "noise": torch.randn(2, 4, 64, 64, generator=generator)}
inputs_path = os.path.join(out, "inputs.safetensors")
safetensors_lite.save(inputs_path, inputs)
cuda_inputs = {name: value.cuda() for name, value in inputs.items()}
model.zero_grad()
prediction = model(cuda_inputs["sample"], cuda_inputs["timestep"], cuda_inputs["encoder_hidden_states"])
loss = torch.nn.functional.mse_loss(prediction, cuda_inputs["noise"])
loss.backward()
reference = prediction.detach().double().cpu().flatten()
reference_norms = {n: float(p.grad.double().norm()) for n, p in model.named_parameters()}
# PyTorch's own f16 autocast, beside the fast gate: printed, not gated.
amp_errors = relative_errors(amp_gradient_norms(
    model.named_parameters(),
    lambda: torch.nn.functional.mse_loss(
        model(cuda_inputs["sample"], cuda_inputs["timestep"],
              cuda_inputs["encoder_hidden_states"]).float(), cuda_inputs["noise"])),
    reference_norms)
results, failures = [], []


def record(check, value, bound, **extra):
    row = {"check": check, "value": value, "bound": bound, "pass": bool(value < bound), **extra}
    results.append(row)
    print(json.dumps(row), flush=True)
    if not row["pass"]:
        failures.append(check)


for precision, prediction_bound, norm_bound in (("strict", 1e-4, 1e-3), ("fast", 1e-2, 5e-2)):
    path = os.path.join(out, f"meganeura_{precision}.json")
    subprocess.run([os.path.join(bin_dir, "unet_parity"), folder, inputs_path, path, precision], check=True)
    with open(path) as f:
        ours = json.load(f)
    predicted = torch.tensor(ours["noise_pred"], dtype=torch.float64)
    record(f"noise prediction {precision}", float((predicted - reference).norm() / reference.norm()),
           prediction_bound, loss=ours["loss"], reference_loss=float(loss))
    worst_name, worst = None, 0.0
    for name, expected in reference_norms.items():
        error = abs(ours["gradient_norms"][name] - expected) / max(expected, 1e-30)
        if error >= worst:
            worst_name, worst = name, error
    record(f"gradient norms {precision} (worst parameter)", worst, norm_bound, parameter=worst_name,
           coop_dispatches=ours["coop_dispatches"], loss_scale=ours["loss_scale"],
           pytorch_amp_error=amp_errors[worst_name])
    if precision == "fast":
        print_beside(relative_errors(ours["gradient_norms"], reference_norms), amp_errors)

with open(os.path.join(out, "parity.json"), "w") as f:
    json.dump(results, f, indent=1)
print("\n%-44s %12s %10s %s" % ("check", "value", "bound", "result"))
for row in results:
    print("%-44s %12.3g %10.0e %s" % (row["check"], row["value"], row["bound"], "pass" if row["pass"] else "FAIL"))
sys.exit(1 if failures else 0)
