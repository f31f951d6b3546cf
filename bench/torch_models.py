"""The models of the PyTorch benchmarks (issue 17, point 8), by name, with their input shape.

resnet18 (3x64x64) and vgg11 (3x32x32) from torchvision, 10 classes; anything else is the
digits CNN of the tests (1x8x8).
"""
import os
import sys


def make_model(name):
    import torchvision
    if name == "resnet18":
        return torchvision.models.resnet18(num_classes=10), (3, 64, 64)
    if name == "vgg11":
        return torchvision.models.vgg11(num_classes=10), (3, 32, 32)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
    import models
    return models.DigitsCNN(), (1, 8, 8)
