"""One worker of a test job (run by torchrun or `quicksilver run --script`): trains a fresh
model for each policy in turn with quicksilver.torch and saves its parameters and report."""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402
import quicksilver.torch as qs  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--model", default="digits")
ap.add_argument("--policies", default="mercury")
ap.add_argument("--optimizers", default="sgd")
ap.add_argument("--iterations", type=int, default=4)
ap.add_argument("--batch", type=int, default=8)
ap.add_argument("--out", required=True)
ap.add_argument("--knobs", default="{}")
ap.add_argument("--architecture", default=None, help="ps or allreduce (default: the policy's)")
ap.add_argument("--die-at", type=int, default=-1, help="rank 1 exits abruptly at this iteration")
ap.add_argument("--stop-at", type=int, default=-1, help="rank --stop-rank ends its loop (cleanly) at this iteration")
ap.add_argument("--stop-rank", type=int, default=1)
ap.add_argument("--check-consistency", type=int, default=1)
args = ap.parse_args()

torch.set_num_threads(1)
qs.init()
x, y = models.data(args.model)
for opt_name in args.optimizers.split(","):
    for policy in args.policies.split(","):
        torch.manual_seed(100 + qs.rank())  # different on every rank: broadcast_parameters equalises
        model = models.make(args.model)
        optimizer = models.optimizer(opt_name, model.parameters())
        optimizer = qs.DistributedOptimizer(optimizer, model, policy=policy, architecture=args.architecture,
                                            check_consistency=args.check_consistency, **json.loads(args.knobs))
        torch.manual_seed(0)
        reference_init = models.make(args.model).state_dict()
        if qs.rank() == 0:
            model.load_state_dict(reference_init)
        qs.broadcast_parameters(model.state_dict(), root_rank=0)
        loss_fn = torch.nn.CrossEntropyLoss()
        for it in range(args.iterations):
            if it == args.die_at and qs.rank() == 1:
                os._exit(3)
            if it == args.stop_at and qs.rank() == args.stop_rank:
                break
            xb, yb = models.batch(x, y, it, qs.rank(), qs.size(), args.batch)
            optimizer.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            optimizer.step()
        # Read as a user reads it: right after the loop (DeFT: after shutdown(), which
        # applies the updates it still holds back).
        final = None if policy == "deft" else {k: v.clone() for k, v in model.state_dict().items()}
        report = optimizer.shutdown()
        tag = "{}-{}-{}".format(policy, opt_name, qs.rank())
        torch.save(final if final is not None else model.state_dict(), os.path.join(args.out, tag + ".pt"))
        with open(os.path.join(args.out, tag + ".json"), "w") as f:
            json.dump({"report": report, "profile": optimizer.quicksilver_profile(),
                       "updates": optimizer.quicksilver_updates()}, f)
print("worker {} done".format(qs.rank()), flush=True)
