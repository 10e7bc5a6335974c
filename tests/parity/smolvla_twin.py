"""A PyTorch twin of LeRobot's SmolVLA (policies/smolvla: modeling_smolvla.py's VLAFlowMatching
and smolvlm_with_expert.py's SmolVLMWithExpertModel) over transformers' SmolVLM backbone (the
SigLIP-style vision tower, Idefics3's pixel shuffle connector, Llama text layers), written for
Debian's PyTorch 1.13 on the CPU in float64, with LeRobot's tensor names. It follows LeRobot's
structure on purpose: training runs prefix and action tokens as one sequence through
forward_attn_layer / forward_cross_attn_layer with the 2-D mask of make_att_2d_masks, and
sampling fills a key/value cache with the prefix and runs the Euler loop over it.

argv: <dir> holding config.json ({"policy": LeRobot config, "vlm": SmolVLM config}),
weights.safetensors and inputs.safetensors (pixel_values [B, cams, 3, S, S], input_ids i32
[B, L], language_valid i32 [B, L], state, actions, noise [B, chunk, A], time [B]).
Writes <dir>/twin.safetensors: "velocity", "loss" [1], "prefix_hidden", "grad.<name>" of every
weight, and "action_chunk" (sampling from "noise" with num_steps Euler steps).
"""
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

from safetensors_lite import load, save

TEXT = "model.vlm_with_expert.vlm.model.text_model."
VISION = "model.vlm_with_expert.vlm.model.vision_model."
CONNECTOR = "model.vlm_with_expert.vlm.model.connector.modality_projection.proj.weight"
EXPERT = "model.vlm_with_expert.lm_expert."


class Weights:
    """Named weights in `dtype` on `device`; those `trainable` names (all when None) require grad."""

    def __init__(self, tensors, dtype=torch.float64, device="cpu", trainable=None):
        self.tensors = {name: value.to(device=device, dtype=dtype).requires_grad_(trainable is None or trainable(name))
                        for name, value in tensors.items()}
        self.dtype, self.device = dtype, device

    def __getitem__(self, name):
        return self.tensors[name]

    def linear(self, x, prefix):
        return F.linear(x, self[prefix + ".weight"], self.tensors.get(prefix + ".bias"))


def rms_norm(x, weight, eps):
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))


def apply_rope(x, positions, max_wavelength=10_000):
    """LeRobot's apply_rope: x [B, L, H, D] at positions [B, L], angles in float32."""
    d_half = x.shape[-1] // 2
    freq_exponents = (2.0 / x.shape[-1]) * torch.arange(d_half, dtype=torch.float32, device=x.device)
    timescale = max_wavelength ** freq_exponents
    radians = positions[..., None].to(torch.float32) / timescale[None, None, :]
    radians = radians[..., None, :].to(x.dtype)
    sin, cos = torch.sin(radians), torch.cos(radians)
    x1, x2 = x.split(d_half, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def create_sinusoidal_pos_embedding(time, dimension, min_period, max_period):
    fraction = torch.linspace(0.0, 1.0, dimension // 2, dtype=torch.float64, device=time.device)
    period = min_period * (max_period / min_period) ** fraction
    scaling_factor = 1.0 / period * 2 * math.pi
    sin_input = scaling_factor[None, :] * time[:, None].double()
    return torch.cat([torch.sin(sin_input), torch.cos(sin_input)], dim=1)


def make_att_2d_masks(pad_masks, att_masks):
    cumsum = torch.cumsum(att_masks, dim=1)
    att_2d_masks = cumsum[:, None, :] <= cumsum[:, :, None]
    pad_2d_masks = pad_masks[:, None, :] * pad_masks[:, :, None]
    return att_2d_masks & pad_2d_masks


class SmolVLA:
    def __init__(self, policy, vlm, weights):
        self.w = weights
        self.policy = policy
        self.vision = vlm["vision_config"]
        self.text = vlm["text_config"]
        self.scale_factor = vlm.get("scale_factor", 2)
        self.heads = self.text["num_attention_heads"]
        self.kv_heads = self.text.get("num_key_value_heads", self.heads)
        self.head_dim = self.text.get("head_dim") or self.text["hidden_size"] // self.heads
        self.eps = self.text.get("rms_norm_eps", 1e-6)
        self.num_vlm_layers = policy.get("num_vlm_layers", 16)
        num_expert_layers = policy.get("num_expert_layers", -1)
        self.num_expert_layers = num_expert_layers if num_expert_layers > 0 else self.num_vlm_layers
        self.attention_mode = policy.get("attention_mode", "cross_attn")
        self.self_attn_every_n_layers = policy.get("self_attn_every_n_layers", 2)
        self.chunk_size = policy.get("chunk_size", 50)
        self.expert_hidden_size = int(self.text["hidden_size"] * policy.get("expert_width_multiplier", 0.75))

    # ---- transformers' SmolVLM vision tower and connector ----
    def vision_model(self, pixel_values):
        w, v = self.w, self.vision
        eps = v.get("layer_norm_eps", 1e-6)
        patch = v["patch_size"]
        x = F.conv2d(pixel_values, w[VISION + "embeddings.patch_embedding.weight"],
                     w[VISION + "embeddings.patch_embedding.bias"], stride=patch)
        x = x.flatten(2).transpose(1, 2)
        x = x + w[VISION + "embeddings.position_embedding.weight"][None]
        heads = v["num_attention_heads"]
        head_dim = v["hidden_size"] // heads
        approximate = "tanh" if v.get("hidden_act", "gelu_pytorch_tanh") == "gelu_pytorch_tanh" else "none"
        for i in range(v["num_hidden_layers"]):
            p = VISION + "encoder.layers.%d." % i
            residual = x
            h = F.layer_norm(x, (x.shape[-1],), w[p + "layer_norm1.weight"], w[p + "layer_norm1.bias"], eps)
            b, n, _ = h.shape
            q = w.linear(h, p + "self_attn.q_proj").view(b, n, heads, head_dim).transpose(1, 2)
            k = w.linear(h, p + "self_attn.k_proj").view(b, n, heads, head_dim).transpose(1, 2)
            val = w.linear(h, p + "self_attn.v_proj").view(b, n, heads, head_dim).transpose(1, 2)
            scores = torch.matmul(q, k.transpose(2, 3)) * head_dim ** -0.5
            attended = torch.matmul(torch.softmax(scores, dim=-1), val).transpose(1, 2).reshape(b, n, -1)
            x = residual + w.linear(attended, p + "self_attn.out_proj")
            residual = x
            h = F.layer_norm(x, (x.shape[-1],), w[p + "layer_norm2.weight"], w[p + "layer_norm2.bias"], eps)
            h = F.gelu(w.linear(h, p + "mlp.fc1"), approximate=approximate)
            x = residual + w.linear(h, p + "mlp.fc2")
        return F.layer_norm(x, (x.shape[-1],), w[VISION + "post_layernorm.weight"],
                            w[VISION + "post_layernorm.bias"], eps)

    def pixel_shuffle(self, x, scale_factor):
        bsz, seq, embed_dim = x.size()
        height = width = int(seq ** 0.5)
        x = x.view(bsz, height, width, embed_dim)
        x = x.view(bsz, height, int(width / scale_factor), embed_dim * scale_factor)
        x = x.permute(0, 2, 1, 3)
        x = x.reshape(bsz, int(width / scale_factor), int(height / scale_factor), embed_dim * (scale_factor ** 2))
        x = x.permute(0, 2, 1, 3)
        return x.reshape(bsz, int(seq / (scale_factor ** 2)), embed_dim * (scale_factor ** 2))

    def embed_image(self, image):
        hidden = self.vision_model(image)
        return F.linear(self.pixel_shuffle(hidden, self.scale_factor), self.w[CONNECTOR])

    # ---- VLAFlowMatching ----
    def embed_prefix(self, images, lang_tokens, lang_masks, state):
        embs, pad_masks, att_masks = [], [], []
        for img in images:
            img_emb = self.embed_image(img)
            img_emb = img_emb * math.sqrt(img_emb.shape[-1])
            bsize, num_img_embs = img_emb.shape[:2]
            embs.append(img_emb)
            pad_masks.append(torch.ones(bsize, num_img_embs, dtype=torch.bool, device=img_emb.device))
            att_masks += [0] * num_img_embs
        lang_emb = F.embedding(lang_tokens, self.w[TEXT + "embed_tokens.weight"])
        lang_emb = lang_emb * math.sqrt(lang_emb.shape[-1])
        embs.append(lang_emb)
        pad_masks.append(lang_masks)
        att_masks += [0] * lang_emb.shape[1]
        state_emb = self.w.linear(state, "model.state_proj")[:, None, :]
        embs.append(state_emb)
        pad_masks.append(torch.ones(state_emb.shape[0], 1, dtype=torch.bool, device=state_emb.device))
        att_masks += [1]
        embs = torch.cat(embs, dim=1)
        pad_masks = torch.cat(pad_masks, dim=1)
        att_masks = torch.tensor(att_masks, dtype=torch.bool, device=embs.device)[None, :].expand(embs.shape[0], -1)
        return embs, pad_masks, att_masks

    def embed_suffix(self, noisy_actions, timestep):
        action_emb = self.w.linear(noisy_actions, "model.action_in_proj")
        time_emb = create_sinusoidal_pos_embedding(timestep, self.expert_hidden_size,
                                                   self.policy.get("min_period", 4e-3),
                                                   self.policy.get("max_period", 4.0))
        time_emb = time_emb.float().to(action_emb.dtype)[:, None, :].expand_as(action_emb)
        action_time_emb = torch.cat([action_emb, time_emb], dim=2)
        action_time_emb = F.silu(self.w.linear(action_time_emb, "model.action_time_mlp_in"))
        action_time_emb = self.w.linear(action_time_emb, "model.action_time_mlp_out")
        bsize = action_time_emb.shape[0]
        pad_masks = torch.ones(bsize, self.chunk_size, dtype=torch.bool, device=action_emb.device)
        att_masks = torch.ones(bsize, self.chunk_size, dtype=torch.bool, device=action_emb.device)
        return action_time_emb, pad_masks, att_masks

    # ---- SmolVLMWithExpertModel ----
    def model_layers(self):
        vlm_layers, expert_layers = [], []
        multiple_of = self.num_vlm_layers // self.num_expert_layers
        for i in range(self.num_vlm_layers):
            vlm_layers.append(TEXT + "layers.%d." % i)
            if multiple_of > 0 and i > 0 and i % multiple_of != 0:
                expert_layers.append(None)
            else:
                expert_layers.append(EXPERT + "layers.%d." % (i // multiple_of if multiple_of > 0 else i))
        return [vlm_layers, expert_layers]

    def project(self, layer, hidden_states, name):
        shape = (*hidden_states.shape[:-1], -1, self.head_dim)
        return self.w.linear(hidden_states, layer + "self_attn." + name).view(shape)

    def attention(self, attention_mask, batch_size, query_states, key_states, value_states):
        groups = self.heads // self.kv_heads
        seq = key_states.shape[1]
        key_states = key_states[:, :, :, None, :].expand(batch_size, seq, self.kv_heads, groups, self.head_dim)
        key_states = key_states.reshape(batch_size, seq, self.heads, self.head_dim)
        value_states = value_states[:, :, :, None, :].expand(batch_size, seq, self.kv_heads, groups, self.head_dim)
        value_states = value_states.reshape(batch_size, seq, self.heads, self.head_dim)
        weights = torch.matmul(query_states.transpose(1, 2), key_states.transpose(1, 2).transpose(2, 3))
        weights = weights * self.head_dim ** -0.5
        big_neg = torch.finfo(weights.dtype).min
        weights = torch.where(attention_mask[:, None, :, :], weights,
                              torch.tensor(big_neg, dtype=weights.dtype, device=weights.device))
        probs = F.softmax(weights, dim=-1)
        out = torch.matmul(probs, value_states.permute(0, 2, 1, 3)).permute(0, 2, 1, 3)
        return out.reshape(batch_size, -1, self.heads * self.head_dim)

    def forward_attn_layer(self, model_layers, inputs_embeds, layer_idx, position_ids, attention_mask,
                           batch_size, cache):
        queries, keys, values = [], [], []
        for i, hidden_states in enumerate(inputs_embeds):
            layer = model_layers[i][layer_idx]
            if hidden_states is None or layer is None:
                continue
            hidden_states = rms_norm(hidden_states, self.w[layer + "input_layernorm.weight"], self.eps)
            queries.append(self.project(layer, hidden_states, "q_proj"))
            keys.append(self.project(layer, hidden_states, "k_proj"))
            values.append(self.project(layer, hidden_states, "v_proj"))
        if not queries:
            # Denoising through a layer without an expert layer: LeRobot's torch.cat fails here;
            # the expert's hidden states pass through unchanged, as in training.
            return [None]
        seq_len = sum(query.shape[1] for query in queries)
        if seq_len < position_ids.shape[1]:
            position_ids = position_ids[:, :seq_len]
            attention_mask = attention_mask[:, :seq_len, :seq_len]
        query_states = apply_rope(torch.cat(queries, dim=1), position_ids)
        key_states = apply_rope(torch.cat(keys, dim=1), position_ids)
        value_states = torch.cat(values, dim=1)
        if cache is not None:
            if layer_idx in cache:
                key_states = torch.cat([cache[layer_idx][0], key_states], dim=1)
                value_states = torch.cat([cache[layer_idx][1], value_states], dim=1)
            else:
                cache[layer_idx] = (key_states, value_states)
        return [self.attention(attention_mask, batch_size, query_states, key_states, value_states)]

    def forward_cross_attn_layer(self, model_layers, inputs_embeds, layer_idx, position_ids, attention_mask,
                                 batch_size, cache):
        att_outputs = []
        if inputs_embeds[0] is not None:
            seq_len = inputs_embeds[0].shape[1]
            position_id, expert_position_id = position_ids[:, :seq_len], position_ids[:, seq_len:]
            layer = model_layers[0][layer_idx]
            hidden_states = rms_norm(inputs_embeds[0], self.w[layer + "input_layernorm.weight"], self.eps)
            query_states = apply_rope(self.project(layer, hidden_states, "q_proj"), position_id)
            key_states = apply_rope(self.project(layer, hidden_states, "k_proj"), position_id)
            value_states = self.project(layer, hidden_states, "v_proj")
            att_outputs.append(self.attention(attention_mask[:, :seq_len, :seq_len], batch_size,
                                              query_states, key_states, value_states))
        else:
            expert_position_id = position_ids
            key_states, value_states = cache[layer_idx]
        expert_layer = model_layers[1][layer_idx]
        if expert_layer is not None:
            expert_hidden_states = rms_norm(inputs_embeds[1], self.w[expert_layer + "input_layernorm.weight"],
                                            self.eps)
            expert_query_state = self.project(expert_layer, expert_hidden_states, "q_proj")
            flat_keys = key_states.reshape(*key_states.shape[:2], -1)
            expert_key_states = self.w.linear(flat_keys, expert_layer + "self_attn.k_proj").view(
                *flat_keys.shape[:-1], -1, self.head_dim)
            flat_values = value_states.reshape(*value_states.shape[:2], -1)
            expert_value_states = self.w.linear(flat_values, expert_layer + "self_attn.v_proj").view(
                *flat_values.shape[:-1], -1, self.head_dim)
            expert_position_id = expert_position_id - torch.min(expert_position_id, dim=1, keepdim=True).values
            expert_attention_mask = attention_mask[:, -inputs_embeds[1].shape[1]:, :expert_key_states.shape[1]]
            expert_query_states = apply_rope(expert_query_state, expert_position_id)
            att_outputs.append(self.attention(expert_attention_mask, batch_size, expert_query_states,
                                              expert_key_states, expert_value_states))
        else:
            att_outputs.append(None)
        return att_outputs

    def vlm_with_expert(self, attention_mask, position_ids, inputs_embeds, cache):
        model_layers = self.model_layers()
        batch_size = next(h for h in inputs_embeds if h is not None).shape[0]
        filling = cache is not None and inputs_embeds[1] is None
        for layer_idx in range(self.num_vlm_layers):
            cross = "cross" in self.attention_mode and not (
                self.self_attn_every_n_layers > 0 and layer_idx % self.self_attn_every_n_layers == 0)
            if filling or not cross:
                att_outputs = self.forward_attn_layer(model_layers, inputs_embeds, layer_idx, position_ids,
                                                      attention_mask, batch_size, cache)
            else:
                att_outputs = self.forward_cross_attn_layer(model_layers, inputs_embeds, layer_idx, position_ids,
                                                            attention_mask, batch_size, cache)
            outputs_embeds = []
            start = 0
            for i, hidden_states in enumerate(inputs_embeds):
                layer = model_layers[i][layer_idx]
                att_output = att_outputs[i] if i < len(att_outputs) else att_outputs[0]
                if hidden_states is None:
                    outputs_embeds.append(None)
                    continue
                if layer is None:
                    outputs_embeds.append(hidden_states)
                    continue
                end = start + hidden_states.shape[1]
                out_emb = self.w.linear(att_output[:, start:end], layer + "self_attn.o_proj") + hidden_states
                after_first_residual = out_emb
                out_emb = rms_norm(out_emb, self.w[layer + "post_attention_layernorm.weight"], self.eps)
                gated = F.silu(self.w.linear(out_emb, layer + "mlp.gate_proj")) * self.w.linear(out_emb, layer + "mlp.up_proj")
                outputs_embeds.append(self.w.linear(gated, layer + "mlp.down_proj") + after_first_residual)
                start = end if len(att_outputs) == 1 else 0
            inputs_embeds = outputs_embeds
        norms = [TEXT + "norm.weight", EXPERT + "norm.weight"]
        return [None if h is None else rms_norm(h, self.w[norms[i]], self.eps) for i, h in enumerate(inputs_embeds)]

    def forward(self, images, lang_tokens, lang_masks, state, actions, noise, time):
        time_expanded = time[:, None, None]
        x_t = time_expanded * noise + (1 - time_expanded) * actions
        u_t = noise - actions
        prefix_embs, prefix_pad_masks, prefix_att_masks = self.embed_prefix(images, lang_tokens, lang_masks, state)
        suffix_embs, suffix_pad_masks, suffix_att_masks = self.embed_suffix(x_t, time)
        pad_masks = torch.cat([prefix_pad_masks, suffix_pad_masks], dim=1)
        att_masks = torch.cat([prefix_att_masks, suffix_att_masks], dim=1)
        att_2d_masks = make_att_2d_masks(pad_masks, att_masks)
        position_ids = torch.cumsum(pad_masks, dim=1) - 1
        prefix_out, suffix_out = self.vlm_with_expert(att_2d_masks, position_ids, [prefix_embs, suffix_embs], None)
        v_t = self.w.linear(suffix_out[:, -self.chunk_size:], "model.action_out_proj")
        return F.mse_loss(u_t, v_t), v_t, prefix_out

    def sample_actions(self, images, lang_tokens, lang_masks, state, noise, num_steps):
        prefix_embs, prefix_pad_masks, prefix_att_masks = self.embed_prefix(images, lang_tokens, lang_masks, state)
        prefix_att_2d_masks = make_att_2d_masks(prefix_pad_masks, prefix_att_masks)
        prefix_position_ids = torch.cumsum(prefix_pad_masks, dim=1) - 1
        cache = {}
        self.vlm_with_expert(prefix_att_2d_masks, prefix_position_ids, [prefix_embs, None], cache)
        dt = torch.tensor(-1.0 / num_steps, dtype=torch.float32, device=noise.device)
        x_t = noise
        time = torch.tensor(1.0, dtype=torch.float32, device=noise.device)
        while time >= -dt / 2:
            suffix_embs, suffix_pad_masks, suffix_att_masks = self.embed_suffix(x_t, time.expand(noise.shape[0]))
            bsize, suffix_len = suffix_pad_masks.shape
            prefix_len = prefix_pad_masks.shape[1]
            prefix_pad_2d_masks = prefix_pad_masks[:, None, :].expand(bsize, suffix_len, prefix_len)
            suffix_att_2d_masks = make_att_2d_masks(suffix_pad_masks, suffix_att_masks)
            full_att_2d_masks = torch.cat([prefix_pad_2d_masks, suffix_att_2d_masks], dim=2)
            prefix_offsets = torch.sum(prefix_pad_masks, dim=-1)[:, None]
            position_ids = prefix_offsets + torch.cumsum(suffix_pad_masks, dim=1) - 1
            _, suffix_out = self.vlm_with_expert(full_att_2d_masks, position_ids, [None, suffix_embs], cache)
            v_t = self.w.linear(suffix_out[:, -self.chunk_size:], "model.action_out_proj")
            x_t = x_t + dt.to(v_t.dtype) * v_t
            time = time + dt
        return x_t


def main():
    directory = sys.argv[1]
    with open(os.path.join(directory, "config.json")) as file:
        config = json.load(file)
    weights = Weights(load(os.path.join(directory, "weights.safetensors")))
    inputs = {name: value for name, value in load(os.path.join(directory, "inputs.safetensors")).items()}
    model = SmolVLA(config["policy"], config["vlm"], weights)
    pixels = inputs["pixel_values"].double()
    images = [pixels[:, c] for c in range(pixels.shape[1])]
    lang_tokens = inputs["input_ids"].long()
    lang_masks = inputs["language_valid"].bool()
    state = inputs["state"].double()
    actions, noise, time = inputs["actions"].double(), inputs["noise"].double(), inputs["time"]
    loss, velocity, prefix_hidden = model.forward(images, lang_tokens, lang_masks, state, actions, noise, time.double())
    loss.backward()
    out = {"loss": loss.detach().reshape(1).float(), "velocity": velocity.detach().float(),
           "prefix_hidden": prefix_hidden.detach().float()}
    for name, value in weights.tensors.items():
        grad = value.grad if value.grad is not None else torch.zeros_like(value)
        out["grad." + name] = grad.float()
    with torch.no_grad():
        out["action_chunk"] = model.sample_actions(images, lang_tokens, lang_masks, state, noise,
                                                   config["policy"].get("num_steps", 10)).float()
    save(os.path.join(directory, "twin.safetensors"), out)


if __name__ == "__main__":
    main()
