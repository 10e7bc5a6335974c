"""PyTorch's own mixed precision beside the fast precision's gradient gates of the H200 parity
scripts (whisper_parity_h200.py, unet_parity_h200.py, smolvla_parity_h200.py): the same model,
weights and inputs under torch.autocast(float16) (f16 matrix products, convolutions and
attention, f32 weights), with loss scaling as torch.cuda.amp.GradScaler does it. Its per-parameter
gradient-norm errors against the scripts' reference say whether an f16 implementation can meet
the 5e-2 gate at all on these random weights; they are printed, never gated.
"""
import math

import torch


def amp_gradient_norms(parameters, loss_of, initial_scale=65536.0):
    """{name: gradient norm} of loss_of() under torch.autocast("cuda", float16) over the named
    `parameters` that require gradients: the loss times a scale that starts at GradScaler's 2^16
    and halves while any gradient is not finite, the gradients divided by it."""
    named = [(name, p) for name, p in parameters if p.requires_grad]
    scale = initial_scale
    while scale >= 1.0:
        for _, p in named:
            p.grad = None
        with torch.autocast("cuda", dtype=torch.float16):
            loss = loss_of()
        (loss.float() * scale).backward()
        grads = {name: p.grad for name, p in named if p.grad is not None}
        if all(bool(torch.isfinite(g).all()) for g in grads.values()):
            return {name: float(g.double().norm()) / scale for name, g in grads.items()}
        scale /= 2
    raise RuntimeError("autocast gradients are not finite even without loss scaling")


def relative_errors(norms, reference):
    """{name: |norm - reference| / reference} over the reference's parameters (a missing norm
    counts as 0)."""
    return {name: abs(norms.get(name, 0.0) - expected) / max(expected, 1e-30)
            for name, expected in reference.items()}


def print_beside(ours, amp, count=5):
    """The `count` parameters with the largest error of ours (a {name: error} dict, or a list of
    names when only those are known), each with PyTorch AMP's error, then AMP's own worst."""
    if not amp:
        return
    names = sorted(ours, key=lambda name: -ours[name])[:count] if isinstance(ours, dict) else ours
    print("%-64s %12s %12s" % ("parameter", "meganeura", "pytorch amp"))
    for name in names:
        mine = "%12.3g" % ours[name] if isinstance(ours, dict) else "%12s" % "failed"
        theirs = amp.get(name, math.nan)
        print("%-64s %s %12.3g" % (name, mine, theirs))
    worst = max(amp, key=amp.get)
    print("%-64s %12s %12.3g  (PyTorch AMP's worst parameter)" % (worst, "", amp[worst]))
