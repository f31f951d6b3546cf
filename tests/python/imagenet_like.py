"""A training script in the shape of pytorch/examples' imagenet/main.py (written here, not
copied): argparse; model, criterion, SGD, and a StepLR scheduler created BEFORE the three
Quicksilver lines (the example's own order); a resume from a checkpoint (epoch, model,
optimizer and scheduler state); per epoch a DistributedSampler's epoch, a training pass,
a validation pass (eval, no_grad, metrics averaged over the workers), the scheduler's
step, and a checkpoint plus a copy of the best one. The data is fake (torchvision's
FakeData: the same images for the same index, on every run).

    quicksilver run --workers 2 --script tests/python/imagenet_like.py --out DIR --epochs 2
    python3 tests/python/imagenet_like.py --out DIR --batch-size 8     # one process
"""
import argparse
import os
import shutil

import torch
import torch.nn as nn
import torchvision
import torchvision.transforms as transforms

import quicksilver.torch as qs

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("-b", "--batch-size", type=int, default=4, help="per worker")
parser.add_argument("--lr", type=float, default=0.1)
parser.add_argument("--momentum", type=float, default=0.9)
parser.add_argument("--wd", "--weight-decay", type=float, default=1e-4, dest="weight_decay")
parser.add_argument("--resume", default="", help="a checkpoint to resume from")
parser.add_argument("--out", required=True, help="where checkpoints go")
parser.add_argument("--policy", default="mercury")
parser.add_argument("--train-size", type=int, default=32)
args = parser.parse_args()


class Net(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.GroupNorm(4, 8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.GroupNorm(4, 16), nn.ReLU(), nn.AdaptiveAvgPool2d(2))
        self.classifier = nn.Linear(64, classes)

    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))


def accuracy(output, target):
    return (output.argmax(1) == target).float().sum()


def train(loader, model, criterion, optimizer):
    model.train()
    for images, target in loader:
        output = model(images)
        loss = criterion(output, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def validate(loader, model, criterion):
    model.eval()
    correct, seen, total_loss = torch.zeros(()), torch.zeros(()), torch.zeros(())
    with torch.no_grad():
        for images, target in loader:
            output = model(images)
            total_loss += criterion(output, target) * len(target)
            correct += accuracy(output, target)
            seen += len(target)
    # Sums over every worker (Horovod's allreduce, op=Sum).
    correct, seen, total_loss = (qs.allreduce(t, op=qs.Sum) for t in (correct, seen, total_loss))
    return float(100 * correct / seen), float(total_loss / seen)


def save_checkpoint(state, is_best):
    path = os.path.join(args.out, "checkpoint.pth.tar")
    torch.save(state, path)
    if is_best:
        shutil.copyfile(path, os.path.join(args.out, "model_best.pth.tar"))


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = Net()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=args.momentum, weight_decay=args.weight_decay)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    # The three lines, after the scheduler, as a user adds them to this script.
    qs.init()
    optimizer = qs.DistributedOptimizer(optimizer, model, policy=args.policy, check_consistency=1)
    qs.broadcast_parameters(model.state_dict(), root_rank=0)

    start_epoch, best_acc1 = 0, 0.0
    if args.resume:
        checkpoint = torch.load(args.resume)
        start_epoch, best_acc1 = checkpoint["epoch"], checkpoint["best_acc1"]
        model.load_state_dict(checkpoint["state_dict"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        scheduler.load_state_dict(checkpoint["scheduler"])

    to_tensor = transforms.ToTensor()
    train_set = torchvision.datasets.FakeData(args.train_size, (3, 16, 16), 10, to_tensor)
    val_set = torchvision.datasets.FakeData(16, (3, 16, 16), 10, to_tensor, random_offset=10_000)
    sampler = torch.utils.data.distributed.DistributedSampler(train_set, num_replicas=qs.size(), rank=qs.rank(),
                                                              seed=0)
    val_sampler = torch.utils.data.distributed.DistributedSampler(val_set, num_replicas=qs.size(), rank=qs.rank(),
                                                                  shuffle=False)
    train_loader = torch.utils.data.DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    val_loader = torch.utils.data.DataLoader(val_set, batch_size=args.batch_size, sampler=val_sampler)

    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)
        train(train_loader, model, criterion, optimizer)
        acc1, val_loss = validate(val_loader, model, criterion)
        scheduler.step()
        is_best = acc1 > best_acc1
        best_acc1 = max(acc1, best_acc1)
        if qs.rank() == 0:
            save_checkpoint({"epoch": epoch + 1, "state_dict": model.state_dict(), "best_acc1": best_acc1,
                             "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, is_best)
        print("epoch {}: acc@1 {:.1f} val loss {:.4f} lr {:.4f}".format(epoch, acc1, val_loss,
                                                                      optimizer.param_groups[0]["lr"]), flush=True)
    torch.save(model.state_dict(), os.path.join(args.out, "final-{}.pt".format(qs.rank())))


if __name__ == "__main__":
    main()
