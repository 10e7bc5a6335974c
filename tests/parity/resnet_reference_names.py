"""Writes tests/fixtures/resnet/reference_names.json from the real libraries, for the parity test
ResNetReferenceNames. Needs torchvision and transformers (the H200 machine has them; CI has
neither) and downloads nothing: the models are randomly initialised.

For resnet18 and resnet50 (1000 classes) it records torchvision's state-dict names and shapes,
and transformers' ResNetForImageClassification names and shapes with the config.json it was
built from. It also checks that the twin of tests/parity/resnet_twin.py has torchvision's names
and shapes, and exits non-zero otherwise.

usage: python3 tests/parity/resnet_reference_names.py [output.json]
"""
import json
import os
import sys

import torchvision
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from resnet_twin import ResNet  # noqa: E402

HF_LAYOUTS = {
    18: dict(layer_type="basic", depths=[2, 2, 2, 2], hidden_sizes=[64, 128, 256, 512]),
    50: dict(layer_type="bottleneck", depths=[3, 4, 6, 3], hidden_sizes=[256, 512, 1024, 2048]),
}


def shapes(module):
    return {name: list(tensor.shape) for name, tensor in module.state_dict().items()}


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "tests/fixtures/resnet/reference_names.json")
    result = {"torchvision_version": torchvision.__version__, "transformers_version": transformers.__version__}
    for depth, layout in HF_LAYOUTS.items():
        torchvision_shapes = shapes(getattr(torchvision.models, "resnet%d" % depth)(num_classes=1000))
        twin_shapes = shapes(ResNet(depth, 1000, 64))
        if twin_shapes != torchvision_shapes:
            differing = sorted(name for name in set(twin_shapes) | set(torchvision_shapes)
                               if twin_shapes.get(name) != torchvision_shapes.get(name))
            sys.exit("resnet%d: the twin differs from torchvision at %s" % (depth, differing))
        config = transformers.ResNetConfig(embedding_size=64, num_labels=1000, **layout)
        model = transformers.ResNetForImageClassification(config)
        hf_config = json.loads(config.to_json_string())
        hf_config.pop("label2id", None)  # id2label's mirror; the parser reads id2label's size
        result["resnet%d" % depth] = {
            "torchvision": torchvision_shapes,
            "hf_config": hf_config,
            "hf": shapes(model),
        }
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as file:
        json.dump(result, file, separators=(",", ":"))
    print("wrote", path)


if __name__ == "__main__":
    main()
