"""SmolVLA parity on the GPU machine (transformers installed): SmolVLA's backbone config (SmolVLM2-500M,
text cut to num_vlm_layers = 16) as transformers' SmolVLMForConditionalGeneration with random weights,
written with save_pretrained and loaded back from that folder; LeRobot's expert weights drawn at random.

1. The twin's image path (tests/parity/smolvla_twin.py: SigLIP tower, pixel shuffle, projection) against
   transformers' vision_model + connector of the loaded model, in float64 (rel. L2 printed, must be < 1e-10).
2. The twin (float64, on the GPU) gives the expert's velocity, the flow-matching loss, every weight's
   gradient and the sampled action chunk; Meganeura's test SmolVLAParity.FolderFromTransformers then
   runs the same weights and inputs, strict (outputs rel. L2 < 1e-4, gradient norms within 1e-3) and
   fast (1e-2, 5e-2). Beside the fast gate, PyTorch's own f16 autocast on the twin's f32 weights
   (bench/amp_gradients.py): its error at each parameter past the gate, and its worst (printed, not
   gated).

usage: python3 bench/smolvla_parity_h200.py [--out DIR] [--binary build/tests/test_parity] [--batch 2]
       [--precision strict|fast|both]
Needs test_parity built (ninja -C build test_parity). Writes DIR (default runs/smolvla_parity):
vlm/ (the save_pretrained folder), config.json, weights.safetensors, inputs.safetensors,
twin.safetensors; prints one line per check and exits non-zero when one fails.
"""
import argparse
import json
import os
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "parity"))

from amp_gradients import amp_gradient_norms, print_beside, relative_errors  # noqa: E402
from safetensors_lite import save  # noqa: E402
from smolvla_twin import SmolVLA, Weights  # noqa: E402
from workloads_pytorch import SMOLVLA_POLICY, SMOLVLM2_500M, smolvla_expert_shapes  # noqa: E402


def relative_l2(actual, expected):
    return float((actual - expected).norm() / expected.norm().clamp_min(1e-30))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="runs/smolvla_parity")
    parser.add_argument("--binary", default=os.path.join(HERE, "..", "build", "tests", "test_parity"))
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--precision", default="both", choices=["strict", "fast", "both"])
    args = parser.parse_args()
    from transformers import SmolVLMConfig, SmolVLMForConditionalGeneration

    os.makedirs(args.out, exist_ok=True)
    policy = dict(SMOLVLA_POLICY, freeze_vision_encoder=False, train_expert_only=False,
                  resize_imgs_with_padding=[512, 512],
                  input_features={"observation.images.top": {"type": "VISUAL", "shape": [3, 512, 512]},
                                  "observation.state": {"type": "STATE", "shape": [6]}},
                  output_features={"action": {"type": "ACTION", "shape": [6]}})
    vlm_config = SMOLVLM2_500M
    torch.manual_seed(0)
    built = SmolVLMForConditionalGeneration(SmolVLMConfig(**vlm_config))
    built.save_pretrained(os.path.join(args.out, "vlm"))
    vlm = SmolVLMForConditionalGeneration.from_pretrained(os.path.join(args.out, "vlm")).cuda().double()
    vlm.model.text_model.layers = vlm.model.text_model.layers[:policy["num_vlm_layers"]]
    tensors = {"model.vlm_with_expert.vlm." + name: value.detach().float().cpu()
               for name, value in vlm.state_dict().items() if not name.startswith("lm_head")}
    generator = torch.Generator().manual_seed(1)
    for name, shape in smolvla_expert_shapes(policy, vlm_config["text_config"]).items():
        tensors[name] = (torch.ones(shape) + 0.1 * torch.randn(shape, generator=generator)
                         if name.endswith("norm.weight") else 0.05 * torch.randn(shape, generator=generator))

    batch, language, chunk, width = args.batch, 12, policy["chunk_size"], policy["max_action_dim"]
    inputs = {"pixel_values": torch.rand(batch, 1, 3, 512, 512, generator=generator) * 2 - 1,
              "input_ids": torch.randint(1, vlm_config["text_config"]["vocab_size"], (batch, language),
                                         generator=generator, dtype=torch.int64).int(),
              "language_valid": torch.ones(batch, language, dtype=torch.int32),
              "state": torch.randn(batch, policy["max_state_dim"], generator=generator),
              "actions": torch.randn(batch, chunk, width, generator=generator),
              "noise": torch.randn(batch, chunk, width, generator=generator),
              "time": torch.rand(batch, generator=generator) * 0.999 + 0.001}
    inputs["language_valid"][-1, -3:] = 0

    weights = Weights(tensors, dtype=torch.float64, device="cuda")
    twin = SmolVLA(policy, vlm_config, weights)
    pixels = inputs["pixel_values"][:, 0].double().cuda()
    with torch.no_grad():
        reference = vlm.model.connector(vlm.model.vision_model(pixel_values=pixels).last_hidden_state)
        image_error = relative_l2(twin.embed_image(pixels), reference)
    print("twin image path vs transformers: rel. L2 %.3g" % image_error)
    ok = image_error < 1e-10

    cuda = {name: value.cuda() for name, value in inputs.items()}
    images = [cuda["pixel_values"][:, 0].double()]
    lang_masks = cuda["language_valid"].bool()
    loss, velocity, _ = twin.forward(images, cuda["input_ids"].long(), lang_masks, cuda["state"].double(),
                                     cuda["actions"].double(), cuda["noise"].double(), cuda["time"].double())
    loss.backward()
    out = {"loss": loss.detach().reshape(1).float(), "velocity": velocity.detach().float()}
    for name, value in weights.tensors.items():
        out["grad." + name] = (value.grad if value.grad is not None else torch.zeros_like(value)).float()
    with torch.no_grad():
        out["action_chunk"] = twin.sample_actions(images, cuda["input_ids"].long(), lang_masks,
                                                  cuda["state"].double(), cuda["noise"].double(),
                                                  policy["num_steps"]).float()
    save(os.path.join(args.out, "twin.safetensors"), out)
    reference_norms = {name: float(value.double().norm()) for name, value in out.items()
                       if name.startswith("grad.") and float(value.double().norm()) >= 1e-7}
    # PyTorch's own f16 autocast on the twin's f32 weights, beside the fast gate (not gated).
    try:
        amp_weights = Weights(tensors, dtype=torch.float32, device="cuda")
        amp_twin = SmolVLA(policy, vlm_config, amp_weights)
        amp_norms = amp_gradient_norms(
            amp_weights.tensors.items(),
            lambda: amp_twin.forward([image.float() for image in images], cuda["input_ids"].long(),
                                     lang_masks, cuda["state"], cuda["actions"], cuda["noise"],
                                     cuda["time"])[0])
        amp_errors = relative_errors({"grad." + name: norm for name, norm in amp_norms.items()},
                                     reference_norms)
        amp_errors = {name[len("grad."):]: error for name, error in amp_errors.items()}
    except RuntimeError as error:  # the twin is written for f32/f64, not for autocast's f16
        print("PyTorch AMP column unavailable: %s" % error)
        amp_errors = {}
    save(os.path.join(args.out, "weights.safetensors"), tensors)
    save(os.path.join(args.out, "inputs.safetensors"), inputs)
    with open(os.path.join(args.out, "config.json"), "w") as file:
        json.dump({"policy": policy, "vlm": vlm_config}, file)

    for precision in (["strict", "fast"] if args.precision == "both" else [args.precision]):
        environment = dict(os.environ, MEGANEURA_SMOLVLA_PARITY_DIR=os.path.abspath(args.out),
                           MEGANEURA_SMOLVLA_PARITY_PRECISION=precision)
        result = subprocess.run([args.binary, "--gtest_filter=SmolVLAParity.FolderFromTransformers"],
                                env=environment, capture_output=True, text=True)
        passed = result.returncode == 0 and "[  PASSED  ] 1 test" in result.stdout
        print("meganeura vs twin, %s: %s" % (precision, "pass" if passed else "FAIL"))
        if not passed:
            print(result.stdout[-6000:] + result.stderr[-2000:])
        if precision == "fast":
            # The test names each parameter past the gate on a line of its own.
            failed = [line.strip() for line in result.stdout.splitlines() if line.strip() in amp_errors]
            print_beside(failed, amp_errors)
        ok = ok and passed
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
