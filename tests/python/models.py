"""The models and data the PyTorch tests train (shared by the worker script and the
single-process reference)."""
import torch
import torch.nn as nn


def digits():
    """sklearn's digits (1797 8x8 images, 10 classes), as float32 tensors."""
    from sklearn.datasets import load_digits
    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(d.target, dtype=torch.long)
    return x, y


class DigitsCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc1 = nn.Linear(16 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = torch.relu(self.conv1(x))
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


def resnet18():
    """torchvision's ResNet-18 with GroupNorm: batch statistics of a worker's batch would
    differ from the concatenated batch's (DDP has the same property without SyncBatchNorm)."""
    import torchvision
    return torchvision.models.resnet18(num_classes=10, norm_layer=lambda c: nn.GroupNorm(8, c))


def random_images(n, size, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 3, size, size, generator=g), torch.randint(0, 10, (n,), generator=g)


def make(name):
    return {"digits": DigitsCNN, "resnet18": resnet18}[name]()


def data(name):
    return digits() if name == "digits" else random_images(64, 32)


def optimizer(name, params):
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-3)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)
    raise ValueError(name)


def batch(x, y, iteration, rank, workers, per_worker):
    """Worker `rank`'s slice of iteration's global batch (the concatenation over ranks)."""
    start = (iteration * workers + rank) * per_worker
    idx = torch.arange(start, start + per_worker) % len(x)
    return x[idx], y[idx]
