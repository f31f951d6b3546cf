"""What one step of gradient staleness costs the digits CNN in one process (the baseline for
DeFT's delayed updates in bench/time_to_accuracy.py): SGD whose step at iteration t applies
the gradient of iteration t - lag, for a few learning rates, test accuracy after 280
iterations of batch 32.

    "$(bash scripts/python.sh)" bench/stale_gradient.py
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
import models  # noqa: E402

torch.set_num_threads(1)
x, y = models.digits()
order = torch.randperm(len(x), generator=torch.Generator().manual_seed(7))
test, train = order[:297], order[297:]
print("lag  lr    momentum  test accuracy after 280 iterations")
for lag, lr, momentum in [(0, 0.05, 0.9), (1, 0.05, 0.9), (2, 0.05, 0.9), (0, 0.02, 0.9), (1, 0.02, 0.9),
                          (0, 0.1, 0.0), (1, 0.1, 0.0), (2, 0.1, 0.0)]:
    torch.manual_seed(0)
    model = models.DigitsCNN()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    pending = []
    for it in range(280):
        at = (it * 32) % 1500
        idx = train[at:at + 32]
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
        pending.append([p.grad.clone() for p in model.parameters()])
        if len(pending) > lag:
            for p, g in zip(model.parameters(), pending.pop(0)):
                p.grad = g
            opt.step()
    with torch.no_grad():
        accuracy = (model(x[test]).argmax(1) == y[test]).float().mean().item()
    print("{:<4} {:<5} {:<9} {:.3f}".format(lag, lr, momentum, accuracy))
