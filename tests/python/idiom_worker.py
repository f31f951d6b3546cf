"""One worker of an idiom job (torchrun or `quicksilver run --script`): runs each training
loop of idioms.py with quicksilver.torch under each policy and saves what it returns, or
(--raise) runs a loop that must fail and saves the error's text."""
import argparse
import json
import os
import sys
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import idioms  # noqa: E402
import quicksilver.torch as qs  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--idioms", default="")
ap.add_argument("--raise", dest="raiser", default=None)
ap.add_argument("--policies", default="mercury")
ap.add_argument("--knobs", default="{}")
ap.add_argument("--out", required=True)
args = ap.parse_args()

torch.set_num_threads(1)
qs.init()
knobs = json.loads(args.knobs)
if args.raiser:
    policy = args.policies
    world = idioms.World(qs.size(), qs.rank(), qs, policy, knobs)
    try:
        idioms.RAISERS[args.raiser](world)
        text = "no error"
    except Exception as e:  # the point: what the user is told
        text = "{}: {}".format(type(e).__name__, e)
        traceback.print_exc()
    with open(os.path.join(args.out, "raise-{}-{}-{}.txt".format(args.raiser, policy, qs.rank())), "w") as f:
        f.write(text)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # the job is broken on purpose: no shutdown, no wait for peers
for policy in args.policies.split(","):
    for name in args.idioms.split(","):
        world = idioms.World(qs.size(), qs.rank(), qs, policy, knobs)
        result = idioms.IDIOMS[name](world)
        tag = "{}-{}-{}".format(name, policy, qs.rank())
        torch.save(result, os.path.join(args.out, tag + ".pt"))
        with open(os.path.join(args.out, tag + ".json"), "w") as f:
            json.dump(world.logs, f)
print("worker {} done".format(qs.rank()), flush=True)
# Gloo's threads let go of every tensor the integration handed to torch.distributed
# (quicksilver.torch._held): what keeps this process's exit from aborting under torch 2.x.
qs._settle(limit_s=30)
if qs._held:
    sys.exit("worker {}: gloo still holds tensors of {} collectives".format(qs.rank(), len(qs._held)))
