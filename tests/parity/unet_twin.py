"""CI side of the U-Net parity test: runs bench/unet_twin.py's UNet2DConditionModel in float64 on
the weights and inputs Meganeura used, and writes what the test compares.

argv: <config.json> <weights.safetensors> <inputs.safetensors> <out.safetensors> <steps> <lr>
inputs: "sample", "timestep", "encoder_hidden_states", "noise" (the training target), and for the
samplers "latents" (standard normal, one image), "context" ([2, T, D], unconditional row first),
"guidance" ([1]) and "sampler_steps" ([1]).
Writes: "noise_pred", "loss" ([1]), "grad.<name>" of every parameter, "losses" ([steps]: the loss
of each of `steps` AdamW steps on the same batch, lr `lr`, betas 0.9/0.999, eps 1e-8, weight decay
0.01), "ddim" and "euler" (the final latents of each sampler with classifier-free guidance,
before the AdamW steps change the weights).
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import safetensors_lite  # noqa: E402
import unet_twin  # noqa: E402


def main():
    config_path, weights_path, inputs_path, out_path, steps, lr = sys.argv[1:7]
    steps, lr = int(steps), float(lr)
    with open(config_path) as file:
        config = json.load(file)
    torch.manual_seed(0)
    model = unet_twin.UNet2DConditionModel(config).double()
    weights = {name: value.double() for name, value in safetensors_lite.load(weights_path).items()}
    state = model.state_dict()
    assert set(weights) == set(state), (sorted(set(weights) ^ set(state)))[:10]
    model.load_state_dict(weights)
    inputs = {name: value.double() for name, value in safetensors_lite.load(inputs_path).items()}
    out = {}

    with torch.no_grad():
        alphas = unet_twin.alphas_cumprod()
        sampler_steps = int(inputs["sampler_steps"][0])
        model_fn = unet_twin.guided(model, inputs["context"], float(inputs["guidance"][0]))
        out["ddim"] = unet_twin.ddim_sample(model_fn, inputs["latents"], sampler_steps, alphas)
        out["euler"] = unet_twin.euler_sample(model_fn, inputs["latents"], sampler_steps, alphas)

    def loss_of():
        prediction = model(inputs["sample"], inputs["timestep"], inputs["encoder_hidden_states"])
        return prediction, torch.nn.functional.mse_loss(prediction, inputs["noise"])

    prediction, loss = loss_of()
    loss.backward()
    out["noise_pred"] = prediction
    out["loss"] = loss.reshape(1)
    for name, parameter in model.named_parameters():
        out["grad." + name] = parameter.grad.clone()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        step_loss = loss_of()[1]
        step_loss.backward()
        optimizer.step()
        losses.append(float(step_loss))
    out["losses"] = torch.tensor(losses if losses else [0.0], dtype=torch.float64)
    safetensors_lite.save(out_path, {name: value.detach().float().contiguous() for name, value in out.items()})


if __name__ == "__main__":
    main()
