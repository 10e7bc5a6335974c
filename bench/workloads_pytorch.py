"""PyTorch side of `meganeura bench workloads`: the same workloads and cells with transformers'
models at the same configurations (random weights), one JSON object per (workload, mode,
framework variant) in the same format:

  pytorch          eager PyTorch
  pytorch-compile  torch.compile(mode="reduce-overhead") (CUDA graphs), its first call's time
                   reported as compile_s

Modes: strict is f32 with TF32 off (torch.backends.cuda.matmul.allow_tf32 and
torch.backends.cudnn.allow_tf32 both False); fast is autocast to f16 on f32 weights.

Each figure is the median wall-clock time of --runs runs after 0.3 s of warm-up (at least 3),
with torch.cuda.synchronize() after each, as `meganeura bench workloads` waits for each run.
Memory: torch.cuda.max_memory_allocated over the training cell.

sd-unet uses bench/unet_twin.py (diffusers' UNet2DConditionModel rewritten in plain torch, the
same structure and arithmetic) at Stable Diffusion 1.5's config, since diffusers is not installed.

Usage: python3 bench/workloads_pytorch.py [--filter NAME] [--runs 20] [--precision both]
       [--no-compile]
"""
import argparse
import json
import time

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

WARMUP_SECONDS = 0.3


def median_ms(run, runs):
    start = time.perf_counter()
    count = 0
    while count < 3 or time.perf_counter() - start < WARMUP_SECONDS:
        run()
        torch.cuda.synchronize()
        count += 1
    times = []
    for _ in range(runs):
        begin = time.perf_counter()
        run()
        torch.cuda.synchronize()
        times.append(1000 * (time.perf_counter() - begin))
    times.sort()
    return times[len(times) // 2]


def first_call_seconds(run):
    torch.cuda.synchronize()
    begin = time.perf_counter()
    run()
    torch.cuda.synchronize()
    return time.perf_counter() - begin


def smollm2_135m():
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                         rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True,
                         bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).cuda().float()


def bench_llama(name, build, mode, compiled, runs):
    model = build()
    seq, decode_tokens = 128, 64
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, model.config.vocab_size, (1, seq + 1), generator=gen).cuda()
    ids, labels = tokens[:, :seq], tokens[:, 1:]
    autocast = torch.autocast("cuda", dtype=torch.float16, enabled=(mode == "fast"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def forward(input_ids):
        with autocast:
            return model(input_ids=input_ids).logits

    def loss_of(input_ids, targets):
        with autocast:
            logits = model(input_ids=input_ids).logits
        return torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                                 targets.reshape(-1))

    forward_fn, loss_fn = forward, loss_of
    compile_s = None
    if compiled:
        forward_fn = torch.compile(forward, mode="reduce-overhead")
        loss_fn = torch.compile(loss_of, mode="reduce-overhead")

    def training_step():
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(ids, labels)
        loss.backward()
        optimizer.step()
        return loss

    model.eval()
    with torch.no_grad():
        if compiled:
            compile_s = first_call_seconds(lambda: forward_fn(ids))
        inference_ms = median_ms(lambda: forward_fn(ids), runs)
    model.train()
    torch.cuda.reset_peak_memory_stats()
    if compiled:
        compile_s += first_call_seconds(training_step)
    training_ms = median_ms(training_step, runs)
    peak = torch.cuda.max_memory_allocated()
    loss = float(loss_fn(ids, labels))

    model.eval()
    cache = {"cache_implementation": "static"} if compiled else {}

    def generate(new_tokens):
        output = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                do_sample=False, **cache)
        torch.cuda.synchronize()
        return output

    rates = []
    with torch.no_grad(), autocast:
        for _ in range(2):
            generate(decode_tokens)  # warm-up (and, compiled, the compilation)
        # Decode alone: a one-token generation times the prefill, which is taken off.
        for _ in range(3):
            prefill = first_call_seconds(lambda: generate(1))
            total = first_call_seconds(lambda: generate(decode_tokens))
            rates.append((decode_tokens - 1) / max(total - prefill, 1e-9))
    rates.sort()
    return {"framework": "pytorch-compile" if compiled else "pytorch", "model": name, "mode": mode,
            "device": torch.cuda.get_device_name(),
            "config": {"batch": 1, "seq": seq, "decode_tokens": decode_tokens},
            "timings": {"compile_s": compile_s, "inference_ms": inference_ms, "training_ms": training_ms,
                        "decode_tokens_per_second": rates[len(rates) // 2]},
            "memory": {"training_device_bytes": peak},
            "outputs": {"loss": loss}}


def bench_sd_unet(mode, compiled, runs):
    """Stable Diffusion 1.5's U-Net (bench/unet_twin.py, diffusers' structure): one evaluation at
    64x64 latents, batch 2, 77 tokens of 768; a training step at batch 1 and 4; 50 DDIM steps with
    classifier-free guidance on one latent (median of 3)."""
    import unet_twin
    torch.manual_seed(0)
    model = unet_twin.UNet2DConditionModel(unet_twin.SD15_CONFIG).cuda().float()
    side, tokens, width = 64, 77, 768
    gen = torch.Generator().manual_seed(1)

    def inputs(batch):
        sample = torch.randn(batch, 4, side, side, generator=gen).cuda()
        timestep = torch.tensor([999.0 - 37 * i for i in range(batch)]).cuda()
        context = torch.randn(batch, tokens, width, generator=gen).cuda()
        noise = torch.randn(batch, 4, side, side, generator=gen).cuda()
        return sample, timestep, context, noise

    autocast = torch.autocast("cuda", dtype=torch.float16, enabled=(mode == "fast"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def forward(sample, timestep, context):
        with autocast:
            return model(sample, timestep, context)

    def loss_of(sample, timestep, context, noise):
        with autocast:
            prediction = model(sample, timestep, context)
        return torch.nn.functional.mse_loss(prediction.float(), noise)

    forward_fn, loss_fn = forward, loss_of
    compile_s = None
    if compiled:
        forward_fn = torch.compile(forward, mode="reduce-overhead")
        loss_fn = torch.compile(loss_of, mode="reduce-overhead")
    sample, timestep, context, _ = inputs(2)
    model.eval()
    with torch.no_grad():
        if compiled:
            compile_s = first_call_seconds(lambda: forward_fn(sample, timestep, context))
        inference_ms = median_ms(lambda: forward_fn(sample, timestep, context), runs)
    model.train()
    timings = {"compile_s": compile_s, "inference_ms": inference_ms}
    memory = {}
    loss = None
    for batch in (1, 4):
        batch_inputs = inputs(batch)

        def training_step():
            optimizer.zero_grad(set_to_none=True)
            step_loss = loss_fn(*batch_inputs)
            step_loss.backward()
            optimizer.step()
            return step_loss

        suffix = "" if batch == 1 else "_b%d" % batch
        torch.cuda.reset_peak_memory_stats()
        if compiled and batch == 1:
            timings["compile_s"] += first_call_seconds(training_step)
        timings["training%s_ms" % suffix] = median_ms(training_step, runs)
        memory["training%s_device_bytes" % suffix] = torch.cuda.max_memory_allocated()
        if batch == 1:
            loss = float(loss_fn(*batch_inputs))
    model.eval()
    alphas = unet_twin.alphas_cumprod().cuda()
    latents = torch.randn(1, 4, side, side, generator=gen).cuda()
    guided_context = torch.randn(2, tokens, width, generator=gen).cuda()

    def model_fn(x, t):
        doubled = torch.cat([x, x])
        uncond, cond = forward_fn(doubled, torch.full((2,), t, device=x.device), guided_context).float().chunk(2)
        return uncond + 7.5 * (cond - uncond)

    with torch.no_grad():
        timings["ddim50_ms"] = median_ms(lambda: unet_twin.ddim_sample(model_fn, latents, 50, alphas.float()), min(runs, 3))
    return {"framework": "pytorch-compile" if compiled else "pytorch", "model": "sd-unet", "mode": mode,
            "device": torch.cuda.get_device_name(),
            "config": {"inference_batch": 2, "latent": [4, side, side], "tokens": tokens,
                       "cross_attention_dim": width, "training_batches": [1, 4], "ddim_steps": 50,
                       "guidance": 7.5},
            "timings": timings, "memory": memory, "outputs": {"loss": loss}}


WORKLOADS = {"smollm2-135m": lambda mode, compiled, runs: bench_llama("smollm2-135m", smollm2_135m, mode, compiled, runs),
             "sd-unet": bench_sd_unet}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--filter", default="")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--precision", default="both", choices=["strict", "fast", "both"])
    parser.add_argument("--no-compile", action="store_true")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    modes = ["strict", "fast"] if args.precision == "both" else [args.precision]
    for name, run in WORKLOADS.items():
        if args.filter not in name:
            continue
        # Eager first: compilation takes minutes, and a time limit then cuts the compiled rows.
        for compiled in ([False] if args.no_compile else [False, True]):
            for mode in modes:
                try:
                    record = run(mode, compiled, args.runs)
                except Exception as error:  # one failing variant leaves the others' rows
                    record = {"framework": "pytorch-compile" if compiled else "pytorch", "model": name,
                              "mode": mode, "error": repr(error)[:300]}
                print(json.dumps(record), flush=True)
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
