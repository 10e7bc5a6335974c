"""A PyTorch twin of transformers' WhisperForConditionalGeneration (modeling_whisper.py's
semantics: conv1 (kernel 3, padding 1) and conv2 (kernel 3, stride 2, padding 1), each followed
by exact GELU; the stored encoder positions added; pre-LayerNorm layers (eps 1e-5) whose
attention has biases on q, v and out but not k, scaled by head_dim^-0.5; a causal decoder with
token embeddings (padding_idx = pad_token_id: that row gets no gradient from the lookup) plus
learned positions, cross-attention over the encoder's output, and proj_out tied to the token
embeddings; the loss is the mean cross-entropy of the labels as given, -100 ignored), written for
Debian's PyTorch 1.13 on the CPU, in float64. The encoder's positions are not trained, as in
transformers; with train_encoder 0 no encoder tensor is.

argv: <config.json> <weights.safetensors> <inputs.safetensors> <out.safetensors> <steps> <lr>
      <train_encoder>
inputs.safetensors: "input_features" [steps+1, B, mels, frames] f32, "decoder_input_ids" and
"labels" [steps+1, B, T] i32 (one batch when steps is 0).
Writes to out.safetensors: "encoder_hidden_states", "logits" and "loss" ([1]) of the first batch,
"grad.<name>" of every trained tensor for it, and "losses" ([steps]): the loss of each of `steps`
AdamW steps (betas 0.9/0.999, eps 1e-8, weight decay 0.1, global-norm clipping at 1.0).
"""
import json
import sys

import torch

import safetensors_lite

F = torch.nn.functional


class Whisper(torch.nn.Module):
    def __init__(self, config, tensors, train_encoder):
        super().__init__()
        self.config = config
        self.params = torch.nn.ParameterDict()
        for name, value in tensors.items():
            trained = name != "model.encoder.embed_positions.weight" and (
                train_encoder or not name.startswith("model.encoder."))
            self.params[name.replace(".", "/")] = torch.nn.Parameter(
                value.double(), requires_grad=trained)

    def w(self, name):
        return self.params[name.replace(".", "/")]

    def linear(self, x, prefix, bias=True):
        return F.linear(x, self.w(prefix + ".weight"), self.w(prefix + ".bias") if bias else None)

    def norm(self, x, prefix):
        return F.layer_norm(x, x.shape[-1:], self.w(prefix + ".weight"), self.w(prefix + ".bias"), 1e-5)

    def attention(self, x, source, prefix, heads, causal):
        batch, length, dim = x.shape
        head_dim = dim // heads

        def split(t):
            return t.view(batch, t.shape[1], heads, head_dim).transpose(1, 2)

        q = split(self.linear(x, prefix + ".q_proj")) * head_dim ** -0.5
        k = split(self.linear(source, prefix + ".k_proj", bias=False))
        v = split(self.linear(source, prefix + ".v_proj"))
        scores = q @ k.transpose(-1, -2)
        if causal:
            scores = scores + torch.full((length, length), float("-inf"), dtype=scores.dtype).triu(1)
        out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, length, dim)
        return self.linear(out, prefix + ".out_proj")

    def mlp(self, x, prefix):
        return self.linear(F.gelu(self.linear(x, prefix + "fc1")), prefix + "fc2")

    def encode(self, features):
        c = self.config
        x = F.gelu(F.conv1d(features, self.w("model.encoder.conv1.weight"),
                            self.w("model.encoder.conv1.bias"), padding=1))
        x = F.gelu(F.conv1d(x, self.w("model.encoder.conv2.weight"),
                            self.w("model.encoder.conv2.bias"), stride=2, padding=1))
        h = x.permute(0, 2, 1) + self.w("model.encoder.embed_positions.weight")
        for i in range(c["encoder_layers"]):
            p = f"model.encoder.layers.{i}."
            y = self.norm(h, p + "self_attn_layer_norm")
            h = h + self.attention(y, y, p + "self_attn", c["encoder_attention_heads"], False)
            h = h + self.mlp(self.norm(h, p + "final_layer_norm"), p)
        return self.norm(h, "model.encoder.layer_norm")

    def decode(self, ids, encoded):
        c = self.config
        length = ids.shape[1]
        h = F.embedding(ids, self.w("model.decoder.embed_tokens.weight"), padding_idx=c["pad_token_id"])
        h = h + self.w("model.decoder.embed_positions.weight")[:length]
        heads = c["decoder_attention_heads"]
        for i in range(c["decoder_layers"]):
            p = f"model.decoder.layers.{i}."
            y = self.norm(h, p + "self_attn_layer_norm")
            h = h + self.attention(y, y, p + "self_attn", heads, True)
            y = self.norm(h, p + "encoder_attn_layer_norm")
            h = h + self.attention(y, encoded, p + "encoder_attn", heads, False)
            h = h + self.mlp(self.norm(h, p + "final_layer_norm"), p)
        h = self.norm(h, "model.decoder.layer_norm")
        head = "proj_out.weight" if "proj_out/weight" in self.params else "model.decoder.embed_tokens.weight"
        return h @ self.w(head).t()

    def forward(self, features, ids):
        encoded = self.encode(features)
        return encoded, self.decode(ids, encoded)


def loss_of(logits, labels):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)


def main():
    config_path, weights_path, inputs_path, out_path, steps, lr, train_encoder = sys.argv[1:8]
    steps, lr, train_encoder = int(steps), float(lr), train_encoder == "1"
    with open(config_path) as file:
        config = json.load(file)
    model = Whisper(config, safetensors_lite.load(weights_path), train_encoder)
    inputs = safetensors_lite.load(inputs_path)
    features = inputs["input_features"].double()
    ids, labels = inputs["decoder_input_ids"].long(), inputs["labels"].long()
    encoded, logits = model(features[0], ids[0])
    loss = loss_of(logits, labels[0])
    loss.backward()
    out = {"encoder_hidden_states": encoded, "logits": logits, "loss": loss.reshape(1)}
    for key, parameter in model.params.items():
        if parameter.requires_grad:
            out["grad." + key.replace("/", ".")] = parameter.grad
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)
    losses = []
    for step in range(steps):
        optimizer.zero_grad()
        step_loss = loss_of(model(features[step + 1], ids[step + 1])[1], labels[step + 1])
        step_loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        optimizer.step()
        losses.append(float(step_loss))
    out["losses"] = torch.tensor(losses if losses else [0.0], dtype=torch.float64)
    safetensors_lite.save(out_path, {k: v.detach().float() for k, v in out.items()})


if __name__ == "__main__":
    main()
