"""PyTorch side of `meganeura bench workloads`: the same workloads and cells with transformers'
and torchvision's models at the same configurations (random weights), one JSON object per (workload, mode,
framework variant) in the same format:

  pytorch          eager PyTorch
  pytorch-compile  torch.compile(mode="reduce-overhead") (CUDA graphs), its first call's time
                   reported as compile_s

Modes: strict is f32 with TF32 off (torch.backends.cuda.matmul.allow_tf32 and
torch.backends.cudnn.allow_tf32 both False); fast is autocast to f16 on f32 weights (for
resnet-50 with a GradScaler: AMP).

Each figure is the median wall-clock time of --runs runs after 1 s of warm-up (at least 3),
with torch.cuda.synchronize() after each, as `meganeura bench workloads` waits for each run.
Memory: torch.cuda.max_memory_allocated over the training cell.

sd-unet uses bench/unet_twin.py (diffusers' UNet2DConditionModel rewritten in plain torch, the
same structure and arithmetic) at Stable Diffusion 1.5's config, since diffusers is not installed.

Usage: python3 bench/workloads_pytorch.py [--filter NAME] [--runs 20] [--precision both]
       [--no-compile]
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "parity"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

WARMUP_SECONDS = 1.0  # as kWarmupSeconds in src/cli/bench_timing.hpp, which says why


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


def bench_resnet50(mode, compiled, runs):
    """torchvision's resnet50 (random weights), 224x224: inference and an SGD training step at batch 4,
    training throughput at batch 64 and 256. fast is AMP: autocast to f16 with a GradScaler."""
    import torchvision
    torch.manual_seed(0)
    model = torchvision.models.resnet50().cuda().float()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    fast = mode == "fast"
    scaler = torch.cuda.amp.GradScaler(enabled=fast)
    gen = torch.Generator().manual_seed(1)

    def batch_of(size):
        images = torch.randn(size, 3, 224, 224, generator=gen).cuda()
        labels = torch.randint(0, 1000, (size,), generator=gen).cuda()
        return images, labels

    def forward(images):
        with torch.autocast("cuda", dtype=torch.float16, enabled=fast):
            return model(images)

    def loss_of(images, labels):
        with torch.autocast("cuda", dtype=torch.float16, enabled=fast):
            logits = model(images)
        return torch.nn.functional.cross_entropy(logits.float(), labels)

    forward_fn, loss_fn = forward, loss_of
    if compiled:
        forward_fn = torch.compile(forward, mode="reduce-overhead")
        loss_fn = torch.compile(loss_of, mode="reduce-overhead")

    def training_step(images, labels):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(images, labels)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        return loss

    images, labels = batch_of(4)
    compile_s = None
    model.eval()
    with torch.no_grad():
        if compiled:
            compile_s = first_call_seconds(lambda: forward_fn(images))
        inference_ms = median_ms(lambda: forward_fn(images), runs)
    model.train()
    torch.cuda.reset_peak_memory_stats()
    if compiled:
        compile_s += first_call_seconds(lambda: training_step(images, labels))
    training_ms = median_ms(lambda: training_step(images, labels), runs)
    peak = torch.cuda.max_memory_allocated()
    loss = float(loss_fn(images, labels))
    timings = {"compile_s": compile_s, "inference_ms": inference_ms, "training_ms": training_ms}
    memory = {"training_device_bytes": peak}
    for large in (64, 256):
        large_images, large_labels = batch_of(large)
        torch.cuda.reset_peak_memory_stats()
        ms = median_ms(lambda: training_step(large_images, large_labels), max(3, runs // 4))
        timings[f"training_b{large}_images_per_second"] = 1000.0 * large / ms
        memory[f"training_b{large}_device_bytes"] = torch.cuda.max_memory_allocated()
        del large_images, large_labels
    return {"framework": "pytorch-compile" if compiled else "pytorch", "model": "resnet-50", "mode": mode,
            "device": torch.cuda.get_device_name(),
            "config": {"batch": 4, "image_size": 224, "throughput_batches": [64, 256]},
            "timings": timings, "memory": memory, "outputs": {"loss": loss}}


def bench_whisper_tiny(mode, compiled, runs):
    """Whisper-tiny at its config with random weights: the encoder on 30 s (encoder_ms), the encoder
    and 4 decoder tokens to logits (inference_ms), a training step on them with AdamW
    (training_ms), one decode step (the time of generate's 64 new tokens less its first, a token),
    and the real-time factor of transcribing 30 s (features by WhisperFeatureExtractor, then
    generate with up to 64 new tokens)."""
    import math
    import numpy as np
    from transformers import (GenerationConfig, WhisperConfig, WhisperFeatureExtractor,
                              WhisperForConditionalGeneration)
    config = WhisperConfig(vocab_size=51865, num_mel_bins=80, d_model=384, encoder_layers=4,
                           decoder_layers=4, encoder_attention_heads=6, decoder_attention_heads=6,
                           encoder_ffn_dim=1536, decoder_ffn_dim=1536, max_source_positions=1500,
                           max_target_positions=448, decoder_start_token_id=50258,
                           eos_token_id=50257, pad_token_id=50257, bos_token_id=50257)
    torch.manual_seed(0)
    model = WhisperForConditionalGeneration(config).cuda().float()
    # Whisper's special tokens for generate (a default GenerationConfig has none).
    model.generation_config = GenerationConfig(
        decoder_start_token_id=50258, bos_token_id=50257, eos_token_id=50257, pad_token_id=50257,
        is_multilingual=True, lang_to_id={"<|en|>": 50259},
        task_to_id={"transcribe": 50359, "translate": 50358}, no_timestamps_token_id=50363,
        prev_sot_token_id=50361, max_initial_timestamp_index=50, max_length=448)
    t = np.arange(480000) / 16000.0
    audio = (0.3 * np.sin(2 * math.pi * (200 + 40 * t) * t)).astype(np.float32)
    extractor = WhisperFeatureExtractor(feature_size=80)
    features = extractor(audio, sampling_rate=16000, return_tensors="pt").input_features.cuda()
    ids = torch.tensor([[50258, 50259, 50359, 50363]]).cuda()
    labels = torch.tensor([[50259, 50359, 50363, 50257]]).cuda()
    autocast = torch.autocast("cuda", dtype=torch.float16, enabled=(mode == "fast"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def encode(x):
        with autocast:
            return model.model.encoder(x).last_hidden_state

    def forward(x, decoder_ids):
        with autocast:
            return model(input_features=x, decoder_input_ids=decoder_ids).logits

    def loss_of(x, decoder_ids, targets):
        with autocast:
            logits = model(input_features=x, decoder_input_ids=decoder_ids).logits
        return torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                                 targets.reshape(-1))

    encode_fn, forward_fn, loss_fn = encode, forward, loss_of
    compile_s = None
    if compiled:
        encode_fn = torch.compile(encode, mode="reduce-overhead")
        forward_fn = torch.compile(forward, mode="reduce-overhead")
        loss_fn = torch.compile(loss_of, mode="reduce-overhead")

    def training_step():
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(features, ids, labels)
        loss.backward()
        optimizer.step()
        return loss

    model.eval()
    with torch.no_grad():
        if compiled:
            compile_s = first_call_seconds(lambda: forward_fn(features, ids))
        encoder_ms = median_ms(lambda: encode_fn(features), runs)
        inference_ms = median_ms(lambda: forward_fn(features, ids), runs)
    model.train()
    torch.cuda.reset_peak_memory_stats()
    if compiled:
        compile_s += first_call_seconds(training_step)
    training_ms = median_ms(training_step, runs)
    peak = torch.cuda.max_memory_allocated()
    loss = float(loss_fn(features, ids, labels))

    model.eval()

    # Greedy decoding after the prompt <|startoftranscript|><|en|><|transcribe|><|notimestamps|>
    # (what `meganeura transcribe` does), through the generic GenerationMixin.generate: Whisper's
    # own generate refuses language= and task= on a generation config made here ("outdated").
    from transformers import GenerationMixin

    def greedy(x, **limits):
        return GenerationMixin.generate(model, input_features=x, decoder_input_ids=ids,
                                        do_sample=False, **limits)

    def generate(x, new_tokens):
        output = greedy(x, max_new_tokens=new_tokens, min_new_tokens=new_tokens)
        torch.cuda.synchronize()
        return output

    def transcribe():
        x = extractor(audio, sampling_rate=16000, return_tensors="pt").input_features.cuda()
        output = greedy(x, max_new_tokens=64)
        torch.cuda.synchronize()
        return output

    steps, factors = [], []
    with torch.no_grad(), autocast:
        for _ in range(2):
            generate(features, 64)
            transcribe()
        for _ in range(3):
            first = first_call_seconds(lambda: generate(features, 1))
            total = first_call_seconds(lambda: generate(features, 64))
            steps.append(1000 * (total - first) / 63)
            factors.append(first_call_seconds(transcribe) / 30.0)
    steps.sort()
    factors.sort()
    return {"framework": "pytorch-compile" if compiled else "pytorch", "model": "whisper-tiny",
            "mode": mode, "device": torch.cuda.get_device_name(),
            "config": {"batch": 1, "mel_frames": 3000, "decoder_tokens": 4},
            "timings": {"compile_s": compile_s, "encoder_ms": encoder_ms, "inference_ms": inference_ms,
                        "training_ms": training_ms, "decode_step_ms": steps[1],
                        "real_time_factor": factors[1]},
            "memory": {"training_device_bytes": peak},
            "outputs": {"loss": loss}}


# SmolVLA at LeRobot's defaults over SmolVLM2-500M cut to 16 layers, as src/cli/bench_smolvla_workload.cpp.
SMOLVLM2_500M = {
    "scale_factor": 4,
    "vision_config": {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                      "num_attention_heads": 12, "patch_size": 16, "image_size": 512, "layer_norm_eps": 1e-6,
                      "hidden_act": "gelu_pytorch_tanh"},
    "text_config": {"model_type": "llama", "vocab_size": 49280, "hidden_size": 960, "intermediate_size": 2560,
                    "num_hidden_layers": 32, "num_attention_heads": 15, "num_key_value_heads": 5, "head_dim": 64,
                    "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
                    "hidden_act": "silu"},
}
SMOLVLA_POLICY = {"type": "smolvla", "chunk_size": 50, "num_steps": 10, "num_vlm_layers": 16,
                  "attention_mode": "cross_attn", "self_attn_every_n_layers": 2, "expert_width_multiplier": 0.75,
                  "max_state_dim": 32, "max_action_dim": 32}


def smolvla_expert_shapes(policy, text):
    """The shapes of LeRobot's expert and projection weights (the parameters transformers lacks)."""
    hidden, heads, kv_heads, head_dim = (text["hidden_size"], text["num_attention_heads"],
                                         text["num_key_value_heads"], text["head_dim"])
    width = int(hidden * policy["expert_width_multiplier"])
    intermediate = 256 * ((int(2 * width / 3) * 4 + 255) // 256)
    shapes = {}
    for i in range(policy["num_vlm_layers"]):
        p = "model.vlm_with_expert.lm_expert.layers.%d." % i
        cross = "cross" in policy["attention_mode"] and i % policy["self_attn_every_n_layers"] != 0
        kv_in = kv_heads * head_dim if cross else width
        shapes.update({p + "self_attn.q_proj.weight": (heads * head_dim, width),
                       p + "self_attn.k_proj.weight": (kv_heads * head_dim, kv_in),
                       p + "self_attn.v_proj.weight": (kv_heads * head_dim, kv_in),
                       p + "self_attn.o_proj.weight": (width, heads * head_dim),
                       p + "mlp.gate_proj.weight": (intermediate, width), p + "mlp.up_proj.weight": (intermediate, width),
                       p + "mlp.down_proj.weight": (width, intermediate),
                       p + "input_layernorm.weight": (width,), p + "post_attention_layernorm.weight": (width,)})
    shapes["model.vlm_with_expert.lm_expert.norm.weight"] = (width,)
    for name, out, inp in (("state_proj", hidden, policy["max_state_dim"]), ("action_in_proj", width, policy["max_action_dim"]),
                           ("action_out_proj", policy["max_action_dim"], width), ("action_time_mlp_in", width, 2 * width),
                           ("action_time_mlp_out", width, width)):
        shapes["model.%s.weight" % name] = (out, inp)
        shapes["model.%s.bias" % name] = (out,)
    return shapes


def smolvla_model(policy, vlm_config, dtype=torch.float32, device="cuda", seed=0, train_backbone=False):
    """transformers' SmolVLMForConditionalGeneration (random weights, text cut to num_vlm_layers) and the
    twin of LeRobot's SmolVLA over its weights plus random expert weights; the twin embeds images with
    transformers' vision tower and connector."""
    from transformers import SmolVLMConfig, SmolVLMForConditionalGeneration
    from smolvla_twin import SmolVLA, Weights
    torch.manual_seed(seed)
    vlm = SmolVLMForConditionalGeneration(SmolVLMConfig(**vlm_config)).to(device=device, dtype=dtype)
    vlm.model.text_model.layers = vlm.model.text_model.layers[:policy["num_vlm_layers"]]
    tensors = {"model.vlm_with_expert.vlm." + name: value.detach() for name, value in vlm.state_dict().items()
               if not name.startswith("lm_head")}
    for name, shape in smolvla_expert_shapes(policy, vlm_config["text_config"]).items():
        tensors[name] = torch.ones(shape) if name.endswith("norm.weight") else torch.randn(shape) * 0.02
    backbone = "model.vlm_with_expert.vlm."
    weights = Weights(tensors, dtype=dtype, device=device,
                      trainable=lambda name: train_backbone or not name.startswith(backbone))
    twin = SmolVLA(policy, vlm_config, weights)
    twin.embed_image = lambda image: vlm.model.connector(vlm.model.vision_model(pixel_values=image).last_hidden_state)
    for parameter in vlm.parameters():
        parameter.requires_grad_(train_backbone)
    return vlm, twin, weights


def bench_smolvla(mode, compiled, runs):
    policy, vlm_config = SMOLVLA_POLICY, SMOLVLM2_500M
    vlm, twin, weights = smolvla_model(policy, vlm_config)
    batch, language, chunk, width = 1, 48, policy["chunk_size"], policy["max_action_dim"]
    gen = torch.Generator().manual_seed(1)
    pixels = (torch.randn(batch, 3, 512, 512, generator=gen) * 0.5).cuda()
    ids = torch.randint(0, vlm_config["text_config"]["vocab_size"], (batch, language), generator=gen).cuda()
    valid = torch.ones(batch, language, dtype=torch.bool, device="cuda")
    state = torch.randn(batch, policy["max_state_dim"], generator=gen).cuda()
    noise = torch.randn(batch, chunk, width, generator=gen).cuda()
    actions = torch.randn(batch, chunk, width, generator=gen).cuda()
    time_t = torch.full((batch,), 0.6, device="cuda")
    autocast = torch.autocast("cuda", dtype=torch.float16, enabled=(mode == "fast"))
    trainable = [value for value in weights.tensors.values() if value.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-4, betas=(0.9, 0.95))

    def sample():
        with autocast:
            return twin.sample_actions([pixels], ids, valid, state, noise, policy["num_steps"])

    def loss_of():
        with autocast:
            return twin.forward([pixels], ids, valid, state, actions, noise, time_t)[0].float()

    sample_fn, loss_fn = sample, loss_of
    compile_s = None
    if compiled:
        sample_fn = torch.compile(sample, mode="reduce-overhead")
        loss_fn = torch.compile(loss_of, mode="reduce-overhead")

    def training_step():
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 10.0)
        optimizer.step()
        return loss

    with torch.no_grad():
        if compiled:
            compile_s = first_call_seconds(sample_fn)
        latency_ms = median_ms(sample_fn, runs)
    torch.cuda.reset_peak_memory_stats()
    if compiled:
        compile_s += first_call_seconds(training_step)
    training_ms = median_ms(training_step, runs)
    peak = torch.cuda.max_memory_allocated()
    return {"framework": "pytorch-compile" if compiled else "pytorch", "model": "smolvla", "mode": mode,
            "device": torch.cuda.get_device_name(),
            "config": {"batch": batch, "language_tokens": language, "chunk_size": chunk,
                       "flow_steps": policy["num_steps"], "vlm_layers": policy["num_vlm_layers"], "backbone": "frozen"},
            "timings": {"compile_s": compile_s, "latency_ms": latency_ms, "training_ms": training_ms},
            "memory": {"training_device_bytes": peak},
            "outputs": {"loss": float(loss_fn())}}


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
             "resnet-50": bench_resnet50,
             "whisper-tiny": bench_whisper_tiny,
             "smolvla": bench_smolvla,
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
