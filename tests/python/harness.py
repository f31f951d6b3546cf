"""Starting a test job: N worker processes of a script under torchrun or `quicksilver run
--script`, with the built package on PYTHONPATH and the interpreter running the tests."""
import os
import subprocess
import sys
import time


def env(build_dir):
    e = dict(os.environ)
    e["PYTHONPATH"] = os.path.join(build_dir, "python") + os.pathsep + e.get("PYTHONPATH", "")
    e["OMP_NUM_THREADS"] = "1"
    return e


def launch(build_dir, launcher, workers, script, args, timeout):
    """(the finished process, seconds it took)."""
    if launcher == "torchrun":
        # Debian's torchrun needs --redirects/--tee on Python 3.11 (MACHINE-NOTES.md).
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--redirects", "2", "--tee", "2",
               "--nproc_per_node", str(workers), script] + args
    else:
        cmd = [os.path.join(build_dir, "quicksilver"), "run", "--python", sys.executable, "--workers", str(workers),
               "--script", script] + args
    start = time.monotonic()
    p = subprocess.run(cmd, env=env(build_dir), capture_output=True, text=True, timeout=timeout)
    return p, time.monotonic() - start
