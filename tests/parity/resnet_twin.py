"""PyTorch twin of Meganeura's ResNet (src/models/resnet.cpp) for the parity test.

Builds ResNet exactly as torchvision.models.resnet does (v1.5: a bottleneck strides on its 3x3
convolution; same module and state-dict names), but with a configurable base width so that CI can
run a tiny one. Loads the test's weights, runs in float64 on the CPU:
  - inference (eval mode, running statistics) on batch 0;
  - `steps` SGD steps in training mode, recording the logits, loss and every parameter's gradient
    of the first step, and every step's loss;
and writes the results as a safetensors file (float32 tensors; __metadata__ "state_dict_names" is
the JSON list of the twin's state-dict names, num_batches_tracked included).

argv: <weights.safetensors> <batches.safetensors> <results.safetensors> <depth> <width>
      <classes> <steps> <learning rate> <momentum>
batches.safetensors holds "images" F32 [steps, batch, 3, H, W] and "labels" I32 [steps, batch].
Files go through safetensors_lite (beside this script), since CI has no safetensors package.
"""
import json
import sys

import torch
import torch.nn as nn

import safetensors_lite

def conv3x3(in_planes, out_planes, stride=1):
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


def conv1x1(in_planes, out_planes, stride=1):
    return nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = conv1x1(inplanes, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


LAYOUTS = {18: (BasicBlock, [2, 2, 2, 2]), 34: (BasicBlock, [3, 4, 6, 3]), 50: (Bottleneck, [3, 4, 6, 3]),
           101: (Bottleneck, [3, 4, 23, 3]), 152: (Bottleneck, [3, 8, 36, 3])}


class ResNet(nn.Module):
    def __init__(self, depth, num_classes, width):
        super().__init__()
        block, layers = LAYOUTS[depth]
        self.inplanes = width
        self.conv1 = nn.Conv2d(3, width, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, width, layers[0])
        self.layer2 = self._make_layer(block, width * 2, layers[1], stride=2)
        self.layer3 = self._make_layer(block, width * 4, layers[2], stride=2)
        self.layer4 = self._make_layer(block, width * 8, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(width * 8 * block.expansion, num_classes)

    def _make_layer(self, block, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(conv1x1(self.inplanes, planes * block.expansion, stride),
                                       nn.BatchNorm2d(planes * block.expansion))
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def load_model(weights, depth, num_classes, width):
    model = ResNet(depth, num_classes, width).double()
    state = model.state_dict()
    expected = {name for name in state if not name.endswith("num_batches_tracked")}
    if set(weights) != expected:
        sys.exit("weight names differ from the twin's state dict: only in the file %s, only in the twin %s"
                 % (sorted(set(weights) - expected), sorted(expected - set(weights))))
    with torch.no_grad():
        for name, values in weights.items():
            if tuple(state[name].shape) != tuple(values.shape):
                sys.exit("%s has shape %s, the twin %s" % (name, list(values.shape), list(state[name].shape)))
            state[name].copy_(values.double())
    return model, list(state)


def main():
    weights_path, batches_path, results_path = sys.argv[1:4]
    depth, width, num_classes, steps = (int(value) for value in sys.argv[4:8])
    learning_rate, momentum = float(sys.argv[8]), float(sys.argv[9])
    torch.manual_seed(0)
    weights = safetensors_lite.load(weights_path)
    batches = safetensors_lite.load(batches_path)
    images, labels = batches["images"].double(), batches["labels"].long()
    results = {}

    model, names = load_model(weights, depth, num_classes, width)
    model.eval()
    with torch.no_grad():
        results["eval.logits"] = model(images[0])

    model, _ = load_model(weights, depth, num_classes, width)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate, momentum=momentum)
    losses = []
    for step in range(steps):
        optimizer.zero_grad()
        logits = model(images[step])
        loss = nn.functional.cross_entropy(logits, labels[step])
        loss.backward()
        if step == 0:
            results["train.logits"] = logits.detach()
            for name, parameter in model.named_parameters():
                results["grad." + name] = parameter.grad.detach().clone()
        losses.append(loss.item())
        optimizer.step()
    results["train.losses"] = torch.tensor(losses)
    for name, value in model.state_dict().items():
        if not name.endswith("num_batches_tracked"):
            results["final." + name] = value
    safetensors_lite.save(results_path, {name: value.float() for name, value in results.items()},
                          {"state_dict_names": json.dumps(names)})


if __name__ == "__main__":
    main()
