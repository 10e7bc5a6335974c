"""PyTorch twin of Meganeura's ResNet (src/models/resnet.cpp) for the parity test.

Builds ResNet exactly as torchvision.models.resnet does (v1.5: a bottleneck strides on its 3x3
convolution; same module and state-dict names), but with a configurable base width so that CI can
run a tiny one. Loads the test's weights and runs on the CPU, in float64 and again in float32
(see `reference` for what each records):
  - inference (eval mode, running statistics) on batch 0;
  - `steps` chained SGD steps in training mode, recording the logits, loss and every parameter's
    gradient of the first step, every step's loss, and the state after every step;
  - in float32 also each step alone from the float64 chain's state before it, as the test's
    per-step comparison runs Meganeura;
and writes the results as a safetensors file (float32 tensors; float32's under "float32." +
name; __metadata__ "state_dict_names" is the JSON list of the twin's state-dict names,
num_batches_tracked included). bench/resnet_parity_h200.py imports `reference_and_float32` to
compute the same for torchvision's ResNet-50.

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


def state_of(model, optimizer):
    """Everything a training step reads and writes, under the graph's names: parameters, running
    statistics and each parameter's SGD momentum buffer ("optimizer.<name>.momentum", zero before
    the first step, as Meganeura starts it; PyTorch's first step sets it to the gradient, which is
    the same)."""
    state = {name: value.detach().clone() for name, value in model.state_dict().items()
             if not name.endswith("num_batches_tracked")}
    for name, parameter in model.named_parameters() if optimizer.defaults["momentum"] else ():
        buffer = optimizer.state.get(parameter, {}).get("momentum_buffer")
        state["optimizer.%s.momentum" % name] = (torch.zeros_like(parameter) if buffer is None
                                                 else buffer.detach().clone())
    return state


def load_state(model, optimizer, state):
    with torch.no_grad():
        for name, value in model.state_dict().items():
            if name in state:
                value.copy_(state[name])
        for name, parameter in model.named_parameters() if optimizer.defaults["momentum"] else ():
            optimizer.state[parameter]["momentum_buffer"] = state["optimizer.%s.momentum" % name].to(
                parameter.dtype).clone()


def sgd_step(model, optimizer, images, labels):
    optimizer.zero_grad()
    logits = model(images)
    loss = nn.functional.cross_entropy(logits, labels)
    loss.backward()
    optimizer.step()
    return logits, loss


def reference(make_model, images, labels, learning_rate, momentum, dtype, device, step_of=sgd_step):
    """The parity test's reference results in `dtype` (float64, and float32 as the yardstick of
    how far plain float32 arithmetic alone moves them):
      eval.logits               inference (running statistics) on batch 0
      train.logits, grad.<p>    the first training step's logits and gradients
      train.losses              every step's loss of len(images) chained SGD steps
      final.<name>              parameters and running statistics after them
      state<k>.<name>           the state after step k (parameters, running statistics, momentum),
                                k = 1..steps; in float64 the chained run's
      step.losses               in float32: each step's loss from the float64 chain's state
    In float32 state<k> is one step from float64's state<k-1> (rounded to float32), which is what
    the test's per-step comparison does on Meganeura's side; in float64 that is the chain itself.
    `make_model` returns the model in float64 with the initial weights; `step_of` takes one
    training step (sgd_step, or PyTorch AMP's in bench/resnet_parity_h200.py). Returns float32
    tensors on the CPU."""
    steps = len(images)
    images, labels = images.to(device, dtype), labels.long().to(device)
    model = make_model().to(device, dtype)
    initial = {name: value.clone() for name, value in model.state_dict().items()}
    results = {}
    model.eval()
    with torch.no_grad():
        results["eval.logits"] = model(images[0])
    model.load_state_dict(initial)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate, momentum=momentum)
    chain_states = [state_of(model, optimizer)]
    losses = []
    for step in range(steps):
        logits, loss = step_of(model, optimizer, images[step], labels[step])
        if step == 0:
            results["train.logits"] = logits.detach()
            for name, parameter in model.named_parameters():
                results["grad." + name] = parameter.grad.detach().clone()
        losses.append(loss.item())
        chain_states.append(state_of(model, optimizer))
    results["train.losses"] = torch.tensor(losses)
    for name, value in chain_states[-1].items():
        if not name.startswith("optimizer."):
            results["final." + name] = value
    if dtype == torch.float64:
        for step in range(1, steps + 1):
            for name, value in chain_states[step].items():
                results["state%d.%s" % (step, name)] = value
    return {name: value.float().cpu().contiguous() for name, value in results.items()}, chain_states


def one_step_results(make_model, images, labels, learning_rate, momentum, states, device,
                     step_of=sgd_step):
    """float32 steps, each from the float64 chain's state before it (see reference)."""
    images, labels = images.to(device, torch.float32), labels.long().to(device)
    model = make_model().to(device, torch.float32)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate, momentum=momentum)
    results, losses = {}, []
    for step in range(len(images)):
        load_state(model, optimizer, {name: value.float() for name, value in states[step].items()})
        _, loss = step_of(model, optimizer, images[step], labels[step])
        losses.append(loss.item())
        for name, value in state_of(model, optimizer).items():
            results["state%d.%s" % (step + 1, name)] = value
    results["step.losses"] = torch.tensor(losses)
    return {name: value.float().cpu().contiguous() for name, value in results.items()}


def reference_and_float32(make_model, images, labels, learning_rate, momentum, device, states_too=False):
    """float64 results under their names, float32's under "float32." + the same names (and, with
    `states_too`, the float64 chain's states, which the steps alone start from)."""
    results, states = reference(make_model, images, labels, learning_rate, momentum, torch.float64, device)
    float32, _ = reference(make_model, images, labels, learning_rate, momentum, torch.float32, device)
    float32.update(one_step_results(make_model, images, labels, learning_rate, momentum, states, device))
    results.update({"float32." + name: value for name, value in float32.items()})
    return (results, states) if states_too else results


def main():
    weights_path, batches_path, results_path = sys.argv[1:4]
    depth, width, num_classes, steps = (int(value) for value in sys.argv[4:8])
    learning_rate, momentum = float(sys.argv[8]), float(sys.argv[9])
    torch.manual_seed(0)
    weights = safetensors_lite.load(weights_path)
    batches = safetensors_lite.load(batches_path)
    names = load_model(weights, depth, num_classes, width)[1]
    results = reference_and_float32(lambda: load_model(weights, depth, num_classes, width)[0],
                                    batches["images"][:steps], batches["labels"][:steps], learning_rate,
                                    momentum, "cpu")
    safetensors_lite.save(results_path, results, {"state_dict_names": json.dumps(names)})


if __name__ == "__main__":
    main()
