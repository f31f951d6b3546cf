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


def bert_base():
    """A transformer of BERT-Base's shape (110 M parameters): a 30522 x 768 token embedding,
    512 learned positions, 12 encoder layers 768 wide with 12 heads and a 3072-wide
    feed-forward, a classifier on the first token. Its input is a float tensor of shape
    (batch, tokens) in [0, 1), what `quicksilver profile --input 128` feeds; token ids are
    drawn from it. For profiles (bench/gpu_check.sh, stage d):

        quicksilver profile --model bench/torch_models.py:bert_base --input 128 --classes 2 \\
            --batch 32 --device cuda --out bert.json
    """
    import torch
    import torch.nn as nn

    class BertBaseShaped(nn.Module):
        def __init__(self, vocab=30522, width=768, layers=12, heads=12, ff=3072, positions=512, classes=2):
            super().__init__()
            self.vocab = vocab
            self.tokens = nn.Embedding(vocab, width)
            self.positions = nn.Embedding(positions, width)
            layer = nn.TransformerEncoderLayer(width, heads, dim_feedforward=ff, dropout=0.0, batch_first=True,
                                               activation="gelu")
            self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.head = nn.Linear(width, classes)

        def forward(self, x):
            ids = (x * self.vocab).long().clamp(0, self.vocab - 1)
            where = torch.arange(ids.shape[1], device=ids.device)
            h = self.encoder(self.tokens(ids) + self.positions(where))
            return self.head(h[:, 0])

    return BertBaseShaped()
