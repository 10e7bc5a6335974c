"""PyTorch side of the training parity test: trains the same classifier from the same initial
weights on the same batches and prints the loss of every step as JSON.

argv: <weights.safetensors> <batches.bin> <architecture> <batch> <steps> <learning rate>
batches.bin holds, per step, batch*784 float32 pixels then batch int32 labels.
"""
import json
import struct
import sys

import torch
import torch.nn as nn


def read_safetensors(path):
    with open(path, "rb") as file:
        data = file.read()
    header_length = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + header_length])
    base = 8 + header_length
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        assert entry["dtype"] == "F32", entry
        start, end = entry["data_offsets"]
        values = torch.frombuffer(bytearray(data[base + start:base + end]), dtype=torch.float32)
        tensors[name] = values.reshape(entry["shape"]).double()
    return tensors


def build(architecture):
    if architecture == "mlp":
        layers = {"fc1": nn.Linear(784, 256), "fc2": nn.Linear(256, 128), "fc3": nn.Linear(128, 10)}
        forward = lambda m, x: m.fc3(torch.relu(m.fc2(torch.relu(m.fc1(x.flatten(1))))))
    else:
        layers = {"conv1": nn.Conv2d(1, 16, 3, padding=1), "conv2": nn.Conv2d(16, 32, 3, padding=1),
                  "fc1": nn.Linear(32 * 7 * 7, 128), "fc2": nn.Linear(128, 10)}

        def forward(m, x):
            x = nn.functional.max_pool2d(torch.relu(m.conv1(x)), 2)
            x = nn.functional.max_pool2d(torch.relu(m.conv2(x)), 2)
            return m.fc2(torch.relu(m.fc1(x.flatten(1))))
    model = nn.Module()
    for name, layer in layers.items():
        setattr(model, name, layer)
    return model.double(), forward


def main():
    weights_path, batches_path, architecture = sys.argv[1:4]
    batch, steps, learning_rate = int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
    weights = read_safetensors(weights_path)
    model, forward = build(architecture)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.copy_(weights["model." + name])
    optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)
    with open(batches_path, "rb") as file:
        data = file.read()
    step_bytes = batch * 784 * 4 + batch * 4
    losses = []
    for step in range(steps):
        chunk = data[step * step_bytes:(step + 1) * step_bytes]
        images = torch.frombuffer(bytearray(chunk[:batch * 784 * 4]), dtype=torch.float32)
        labels = torch.frombuffer(bytearray(chunk[batch * 784 * 4:]), dtype=torch.int32)
        images = images.reshape(batch, 1, 28, 28).double()
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(forward(model, images), labels.long())
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    print(json.dumps(losses))


if __name__ == "__main__":
    main()
