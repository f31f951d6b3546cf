"""train_digits.py with Quicksilver's three lines (marked "# +qs"): data-parallel over N
processes, each training on its own share of every epoch.

From the repository root, after scripts/build.sh:

    ./build/quicksilver run --workers 2 --script examples/train_digits_quicksilver.py
    ./build/quicksilver run --workers 2 --policy bytescheduler --script examples/train_digits_quicksilver.py
    PYTHONPATH=build/python torchrun --redirects 2 --tee 2 --standalone --nproc_per_node 2 \
        examples/train_digits_quicksilver.py

(`quicksilver run` finds the package beside itself; torchrun needs PYTHONPATH. Debian's
torchrun needs --redirects and --tee on Python 3.11; pip's does not.)
"""
import torch
import torch.nn as nn
from sklearn.datasets import load_digits

import quicksilver.torch as qs  # +qs


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = torch.relu(self.conv1(x))
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


def main():
    qs.init()  # +qs
    torch.manual_seed(0)
    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(d.target)
    train_x, train_y, test_x, test_y = x[:1500], y[:1500], x[1500:], y[1500:]
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    optimizer = qs.DistributedOptimizer(optimizer, model)  # +qs (mercury, or run's --policy)
    qs.broadcast_parameters(model.state_dict(), root_rank=0)  # +qs
    loss_fn = nn.CrossEntropyLoss()
    batch = 32
    for epoch in range(5):
        perm = torch.randperm(len(train_x))  # the same on every worker (same seed)
        mine = perm[qs.rank()::qs.size()]      # this worker's share of the epoch
        for i in range(0, len(mine) - batch + 1, batch):
            idx = mine[i:i + batch]
            optimizer.zero_grad()
            loss = loss_fn(model(train_x[idx]), train_y[idx])
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            accuracy = (model(test_x).argmax(1) == test_y).float().mean().item()
        if qs.rank() == 0:
            print("epoch {} loss {:.3f} test accuracy {:.3f}".format(epoch, loss.item(), accuracy))
    report = optimizer.shutdown()
    if qs.rank() == 0:
        print("median iteration {:.2f} ms ({})".format(report["median_iteration_ms"], report["policy"]))


if __name__ == "__main__":
    main()
