"""A PyTorch twin of diffusers' UNet2DConditionModel (Stable Diffusion's denoiser), written from
diffusers' structure so that its module tree gives the same state-dict names
("down_blocks.0.attentions.0.transformer_blocks.0.attn2.to_k.weight", ...) and the same
arithmetic: sinusoidal timestep features with f32 frequencies, ResnetBlock2D (GroupNorm, SiLU,
time projection), Transformer2DModel (GroupNorm eps 1e-6, proj_in, self- and cross-attention,
GEGLU feed-forward, proj_out), Downsample2D / Upsample2D, the skip connections and the mid
block. Plain torch only (Debian's 1.13 on the CPU in CI; any later PyTorch on a GPU), no
diffusers. Also the scaled-linear noise schedule and the DDIM / Euler steps diffusers' schedulers
take, for checking samplers.

Used by tests/parity/unet_twin.py (CI), bench/workloads_pytorch.py and bench/unet_parity_h200.py.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


# Stable Diffusion 1.5's unet/config.json (runwayml/stable-diffusion-v1-5).
SD15_CONFIG = {
    "_class_name": "UNet2DConditionModel", "act_fn": "silu", "attention_head_dim": 8,
    "block_out_channels": [320, 640, 1280, 1280], "center_input_sample": False, "cross_attention_dim": 768,
    "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
    "downsample_padding": 1, "flip_sin_to_cos": True, "freq_shift": 0, "in_channels": 4, "layers_per_block": 2,
    "mid_block_scale_factor": 1, "norm_eps": 1e-05, "norm_num_groups": 32, "out_channels": 4, "sample_size": 64,
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"],
}


def _per_block(value, blocks, default):
    if value is None:
        value = default
    return list(value) if isinstance(value, (list, tuple)) else [value] * blocks


class UNetConfig:
    """The keys of a diffusers unet/config.json this twin builds, with diffusers' defaults."""

    def __init__(self, config):
        self.in_channels = config.get("in_channels", 4)
        self.out_channels = config.get("out_channels", 4)
        self.block_out_channels = list(config["block_out_channels"])
        blocks = len(self.block_out_channels)
        self.down_block_types = list(config["down_block_types"])
        self.up_block_types = list(config["up_block_types"])
        self.mid_block_type = config.get("mid_block_type", "UNetMidBlock2DCrossAttn")
        self.layers_per_block = _per_block(config.get("layers_per_block"), blocks, 2)
        self.transformer_layers = _per_block(config.get("transformer_layers_per_block"), blocks, 1)
        # diffusers' attention_head_dim is, by a historical naming slip, the number of heads.
        self.heads = _per_block(config.get("attention_head_dim"), blocks, 8)
        self.cross_attention_dim = _per_block(config.get("cross_attention_dim"), blocks, 1280)[0]
        self.norm_num_groups = config.get("norm_num_groups", 32)
        self.norm_eps = config.get("norm_eps", 1e-5)
        self.flip_sin_to_cos = config.get("flip_sin_to_cos", True)
        self.freq_shift = config.get("freq_shift", 0)
        self.use_linear_projection = config.get("use_linear_projection", False)
        self.center_input_sample = config.get("center_input_sample", False)
        self.mid_block_scale_factor = config.get("mid_block_scale_factor", 1.0)
        self.downsample_padding = config.get("downsample_padding", 1)
        self.conv_in_kernel = config.get("conv_in_kernel", 3)
        self.conv_out_kernel = config.get("conv_out_kernel", 3)
        self.time_embed_dim = config.get("time_embedding_dim") or self.block_out_channels[0] * 4


def timestep_features(timesteps, dim, flip_sin_to_cos, shift):
    half = dim // 2
    exponent = -math.log(10000) * torch.arange(0, half, dtype=torch.float32, device=timesteps.device) / (half - shift)
    angles = timesteps[:, None].float() * torch.exp(exponent)[None, :]
    angles = angles.to(timesteps.dtype if timesteps.is_floating_point() else torch.float32)
    features = torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)
    if flip_sin_to_cos:
        features = torch.cat([features[:, half:], features[:, :half]], dim=-1)
    if dim % 2 == 1:
        features = F.pad(features, (0, 1, 0, 0))
    return features


class TimestepEmbedding(nn.Module):
    def __init__(self, in_channels, dim):
        super().__init__()
        self.linear_1 = nn.Linear(in_channels, dim)
        self.act = nn.SiLU()
        self.linear_2 = nn.Linear(dim, dim)

    def forward(self, x):
        return self.linear_2(self.act(self.linear_1(x)))


class ResnetBlock2D(nn.Module):
    def __init__(self, in_channels, out_channels, temb_channels, groups, eps, output_scale_factor=1.0):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, in_channels, eps=eps, affine=True)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.time_emb_proj = nn.Linear(temb_channels, out_channels)
        self.norm2 = nn.GroupNorm(groups, out_channels, eps=eps, affine=True)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)
        self.conv_shortcut = nn.Conv2d(in_channels, out_channels, 1) if in_channels != out_channels else None
        self.output_scale_factor = output_scale_factor

    def forward(self, x, temb):
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.time_emb_proj(F.silu(temb))[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        if self.conv_shortcut is not None:
            x = self.conv_shortcut(x)
        return (x + h) / self.output_scale_factor


class Attention(nn.Module):
    def __init__(self, query_dim, heads, kv_dim=None):
        super().__init__()
        self.heads = heads
        self.to_q = nn.Linear(query_dim, query_dim, bias=False)
        self.to_k = nn.Linear(kv_dim or query_dim, query_dim, bias=False)
        self.to_v = nn.Linear(kv_dim or query_dim, query_dim, bias=False)
        self.to_out = nn.ModuleList([nn.Linear(query_dim, query_dim), nn.Dropout(0.0)])

    def forward(self, x, context=None):
        context = x if context is None else context
        batch, length, dim = x.shape
        head_dim = dim // self.heads

        def split(t):
            return t.view(batch, -1, self.heads, head_dim).transpose(1, 2)

        q, k, v = split(self.to_q(x)), split(self.to_k(context)), split(self.to_v(context))
        scores = (q @ k.transpose(-1, -2)) * head_dim ** -0.5
        attended = (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, length, dim)
        return self.to_out[1](self.to_out[0](attended))


class GEGLU(nn.Module):
    def __init__(self, dim, inner):
        super().__init__()
        self.proj = nn.Linear(dim, inner * 2)

    def forward(self, x):
        hidden, gate = self.proj(x).chunk(2, dim=-1)
        return hidden * F.gelu(gate)


class FeedForward(nn.Module):
    def __init__(self, dim, mult=4):
        super().__init__()
        self.net = nn.ModuleList([GEGLU(dim, dim * mult), nn.Dropout(0.0), nn.Linear(dim * mult, dim)])

    def forward(self, x):
        for module in self.net:
            x = module(x)
        return x


class BasicTransformerBlock(nn.Module):
    def __init__(self, dim, heads, cross_attention_dim):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn1 = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.attn2 = Attention(dim, heads, cross_attention_dim)
        self.norm3 = nn.LayerNorm(dim)
        self.ff = FeedForward(dim)

    def forward(self, x, context):
        x = self.attn1(self.norm1(x)) + x
        x = self.attn2(self.norm2(x), context) + x
        return self.ff(self.norm3(x)) + x


class Transformer2DModel(nn.Module):
    def __init__(self, channels, heads, layers, cross_attention_dim, groups, linear_projection):
        super().__init__()
        self.linear_projection = linear_projection
        self.norm = nn.GroupNorm(groups, channels, eps=1e-6, affine=True)
        make = (lambda: nn.Linear(channels, channels)) if linear_projection else (lambda: nn.Conv2d(channels, channels, 1))
        self.proj_in = make()
        self.transformer_blocks = nn.ModuleList(
            [BasicTransformerBlock(channels, heads, cross_attention_dim) for _ in range(layers)])
        self.proj_out = make()

    def forward(self, x, context):
        batch, channels, height, width = x.shape
        h = self.norm(x)
        if not self.linear_projection:
            h = self.proj_in(h)
        h = h.permute(0, 2, 3, 1).reshape(batch, height * width, channels)
        if self.linear_projection:
            h = self.proj_in(h)
        for block in self.transformer_blocks:
            h = block(h, context)
        if self.linear_projection:
            h = self.proj_out(h)
        h = h.reshape(batch, height, width, channels).permute(0, 3, 1, 2)
        if not self.linear_projection:
            h = self.proj_out(h)
        return h + x


class Downsample2D(nn.Module):
    def __init__(self, channels, padding):
        super().__init__()
        self.padding = padding
        self.conv = nn.Conv2d(channels, channels, 3, stride=2, padding=padding)

    def forward(self, x):
        if self.padding == 0:
            x = F.pad(x, (0, 1, 0, 1))
        return self.conv(x)


class Upsample2D(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class DownBlock(nn.Module):
    """CrossAttnDownBlock2D (with attention) or DownBlock2D."""

    def __init__(self, c, index, in_channels, out_channels, attention, final):
        super().__init__()
        self.resnets = nn.ModuleList([
            ResnetBlock2D(in_channels if i == 0 else out_channels, out_channels, c.time_embed_dim,
                          c.norm_num_groups, c.norm_eps) for i in range(c.layers_per_block[index])])
        if attention:
            self.attentions = nn.ModuleList([
                Transformer2DModel(out_channels, c.heads[index], c.transformer_layers[index],
                                   c.cross_attention_dim, c.norm_num_groups, c.use_linear_projection)
                for _ in range(c.layers_per_block[index])])
        else:
            self.attentions = None
        self.downsamplers = None if final else nn.ModuleList([Downsample2D(out_channels, c.downsample_padding)])

    def forward(self, x, temb, context):
        outputs = []
        for i, resnet in enumerate(self.resnets):
            x = resnet(x, temb)
            if self.attentions is not None:
                x = self.attentions[i](x, context)
            outputs.append(x)
        if self.downsamplers is not None:
            x = self.downsamplers[0](x)
            outputs.append(x)
        return x, outputs


class UpBlock(nn.Module):
    """CrossAttnUpBlock2D (with attention) or UpBlock2D."""

    def __init__(self, c, mirror, in_channels, prev_output_channels, out_channels, attention, final):
        super().__init__()
        layers = c.layers_per_block[mirror] + 1
        resnets = []
        for i in range(layers):
            skip = in_channels if i == layers - 1 else out_channels
            resnet_in = prev_output_channels if i == 0 else out_channels
            resnets.append(ResnetBlock2D(resnet_in + skip, out_channels, c.time_embed_dim,
                                         c.norm_num_groups, c.norm_eps))
        self.resnets = nn.ModuleList(resnets)
        if attention:
            self.attentions = nn.ModuleList([
                Transformer2DModel(out_channels, c.heads[mirror], c.transformer_layers[mirror],
                                   c.cross_attention_dim, c.norm_num_groups, c.use_linear_projection)
                for _ in range(layers)])
        else:
            self.attentions = None
        self.upsamplers = None if final else nn.ModuleList([Upsample2D(out_channels)])

    def forward(self, x, skips, temb, context):
        for i, resnet in enumerate(self.resnets):
            x = resnet(torch.cat([x, skips.pop()], dim=1), temb)
            if self.attentions is not None:
                x = self.attentions[i](x, context)
        if self.upsamplers is not None:
            x = self.upsamplers[0](x)
        return x


class UNetMidBlock2DCrossAttn(nn.Module):
    def __init__(self, c):
        super().__init__()
        channels = c.block_out_channels[-1]
        scale = c.mid_block_scale_factor
        self.attentions = nn.ModuleList([
            Transformer2DModel(channels, c.heads[-1], c.transformer_layers[-1], c.cross_attention_dim,
                               c.norm_num_groups, c.use_linear_projection)])
        self.resnets = nn.ModuleList([
            ResnetBlock2D(channels, channels, c.time_embed_dim, c.norm_num_groups, c.norm_eps, scale)
            for _ in range(2)])

    def forward(self, x, temb, context):
        x = self.resnets[0](x, temb)
        return self.resnets[1](self.attentions[0](x, context), temb)


class UNet2DConditionModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        c = self.c = UNetConfig(config)
        channels = c.block_out_channels
        blocks = len(channels)
        self.conv_in = nn.Conv2d(c.in_channels, channels[0], c.conv_in_kernel, padding=c.conv_in_kernel // 2)
        self.time_embedding = TimestepEmbedding(channels[0], c.time_embed_dim)
        self.down_blocks = nn.ModuleList()
        out_channels = channels[0]
        for i, kind in enumerate(c.down_block_types):
            in_channels, out_channels = out_channels, channels[i]
            self.down_blocks.append(DownBlock(c, i, in_channels, out_channels, kind == "CrossAttnDownBlock2D",
                                              i == blocks - 1))
        self.mid_block = UNetMidBlock2DCrossAttn(c) if c.mid_block_type == "UNetMidBlock2DCrossAttn" else None
        self.up_blocks = nn.ModuleList()
        reversed_channels = list(reversed(channels))
        out_channels = reversed_channels[0]
        for i, kind in enumerate(c.up_block_types):
            prev_output, out_channels = out_channels, reversed_channels[i]
            in_channels = reversed_channels[min(i + 1, blocks - 1)]
            self.up_blocks.append(UpBlock(c, blocks - 1 - i, in_channels, prev_output, out_channels,
                                          kind == "CrossAttnUpBlock2D", i == blocks - 1))
        self.conv_norm_out = nn.GroupNorm(c.norm_num_groups, channels[0], eps=c.norm_eps)
        self.conv_act = nn.SiLU()
        self.conv_out = nn.Conv2d(channels[0], c.out_channels, c.conv_out_kernel, padding=(c.conv_out_kernel - 1) // 2)

    def forward(self, sample, timestep, encoder_hidden_states):
        c = self.c
        timestep = timestep.expand(sample.shape[0]) if timestep.dim() else timestep.repeat(sample.shape[0])
        features = timestep_features(timestep, c.block_out_channels[0], c.flip_sin_to_cos, c.freq_shift)
        temb = self.time_embedding(features.to(sample.dtype))
        if c.center_input_sample:
            sample = 2 * sample - 1.0
        x = self.conv_in(sample)
        skips = [x]
        for block in self.down_blocks:
            x, outputs = block(x, temb, encoder_hidden_states)
            skips.extend(outputs)
        if self.mid_block is not None:
            x = self.mid_block(x, temb, encoder_hidden_states)
        for block in self.up_blocks:
            x = block(x, skips, temb, encoder_hidden_states)
        return self.conv_out(self.conv_act(self.conv_norm_out(x)))


def alphas_cumprod(timesteps=1000, beta_start=0.00085, beta_end=0.012):
    """DDPMScheduler's "scaled_linear" schedule (Stable Diffusion's), in float64."""
    betas = torch.linspace(beta_start ** 0.5, beta_end ** 0.5, timesteps, dtype=torch.float64) ** 2
    return torch.cumprod(1.0 - betas, dim=0)


def ddim_sample(model_fn, latents, steps, alphas):
    """DDIMScheduler with eta 0, steps_offset 1, set_alpha_to_one False, "leading" spacing."""
    ratio = len(alphas) // steps
    for t in [i * ratio + 1 for i in reversed(range(steps))]:
        noise = model_fn(latents, float(t))
        previous = t - ratio
        alpha, alpha_prev = alphas[t], alphas[previous] if previous >= 0 else alphas[0]
        original = (latents - (1 - alpha) ** 0.5 * noise) / alpha ** 0.5
        latents = alpha_prev ** 0.5 * original + (1 - alpha_prev) ** 0.5 * noise
    return latents


def euler_sigmas(steps, alphas):
    timesteps = torch.linspace(0, len(alphas) - 1, steps, dtype=torch.float64).flip(0)
    sigmas_full = ((1 - alphas) / alphas) ** 0.5
    low = timesteps.floor().long()
    high = (low + 1).clamp(max=len(alphas) - 1)
    fraction = timesteps - low.double()
    sigmas = sigmas_full[low] + (sigmas_full[high] - sigmas_full[low]) * fraction
    return timesteps, torch.cat([sigmas, torch.zeros(1, dtype=torch.float64)])


def euler_sample(model_fn, noise, steps, alphas):
    """EulerDiscreteScheduler, "linspace" spacing, no churn; `noise` is standard normal."""
    timesteps, sigmas = euler_sigmas(steps, alphas)
    latents = noise * sigmas[0]
    for i, t in enumerate(timesteps.tolist()):
        predicted = model_fn(latents / (sigmas[i] ** 2 + 1) ** 0.5, t)
        latents = latents + (sigmas[i + 1] - sigmas[i]) * predicted
    return latents


def guided(model, context, guidance):
    """Classifier-free guidance: context holds the unconditional rows, then the conditional."""
    def model_fn(latents, t):
        doubled = torch.cat([latents, latents])
        timestep = torch.full((doubled.shape[0],), t, dtype=latents.dtype)
        uncond, cond = model(doubled, timestep, context).chunk(2)
        return uncond + guidance * (cond - uncond)
    return model_fn
