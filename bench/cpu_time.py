#!/usr/bin/env python3
"""CPU time per iteration of a worker and a server for each parameter-server policy
(Mercury's Fig. 16): the job runs as separate processes on loopback (a coordinator, M
`quicksilver server`s, N `quicksilver worker`s, compute emulated: the workers' CPU is
communication and scheduling), each process's user + system time read when it exits
(wait4). Each policy runs twice, with I and 4I iterations: the difference over 3I
iterations is the steady state, without start-up, calibration and connection set-up.

    python3 bench/cpu_time.py build/quicksilver --model resnet50 --bandwidth 2Gbps

Prints, per policy, the CPU ms per iteration of the mean worker and the mean server, and
each against wfbp (the native PS the paper compares with), medians over --repeats.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ap = argparse.ArgumentParser()
ap.add_argument("bin", nargs="?", default="build/quicksilver")
ap.add_argument("--model", default="resnet50")
ap.add_argument("--policies", default="wfbp,p3,tictac,bytescheduler,prophet,mercury-nopreempt,mercury")
ap.add_argument("--workers", type=int, default=2)
ap.add_argument("--servers", type=int, default=2)
ap.add_argument("--bandwidth", default="2Gbps")
ap.add_argument("--iterations", type=int, default=3, help="I (the runs have I and 4I)")
ap.add_argument("--repeats", type=int, default=3)
args = ap.parse_args()


def free_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def run(policy, iterations, secret):
    """CPU seconds (user + system) of every worker and every server of one job."""
    port = free_port()
    common = ["--model", args.model, "--policy", policy, "--workers", str(args.workers), "--servers",
              str(args.servers), "--bandwidth", args.bandwidth, "--iterations", str(iterations),
              "--secret-file", secret]
    coord = subprocess.Popen([args.bin, "coordinator", "--listen", "127.0.0.1:%d" % port, "--workers",
                              str(args.workers), "--servers", str(args.servers), "--secret-file", secret],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(0.2)
    procs = {}
    for s in range(args.servers):
        p = subprocess.Popen([args.bin, "server", "--server-id", str(s), "--coordinator", "127.0.0.1:%d" % port]
                             + common, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        procs[p.pid] = ("server", p)
    for w in range(args.workers):
        p = subprocess.Popen([args.bin, "worker", "--worker-id", str(w), "--coordinator", "127.0.0.1:%d" % port,
                              "--no-verify"] + common, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        procs[p.pid] = ("worker", p)
    cpu = {"worker": [], "server": []}
    deadline = time.monotonic() + 600
    while procs:
        pid, status, usage = os.wait4(-1, 0)
        if pid == coord.pid:
            continue
        role, p = procs.pop(pid)
        if os.waitstatus_to_exitcode(status) != 0:
            for _, q in procs.values():
                q.kill()
            coord.kill()
            sys.exit("{} {} failed: {}".format(policy, role, p.stderr.read().decode()[-2000:]))
        cpu[role].append(usage.ru_utime + usage.ru_stime)
        if time.monotonic() > deadline:
            sys.exit("timed out")
    coord.kill()
    coord.wait()
    return cpu


def main():
    policies = args.policies.split(",")
    with tempfile.NamedTemporaryFile("wb", delete=False) as f:
        f.write(os.urandom(32))
        secret = f.name
    try:
        per = {p: {"worker": [], "server": []} for p in policies}
        for _ in range(args.repeats):
            for policy in policies:  # interleaved: the machine's drift hits every policy alike
                short = run(policy, args.iterations, secret)
                long = run(policy, 4 * args.iterations, secret)
                for role in ("worker", "server"):
                    d = statistics.mean(long[role]) - statistics.mean(short[role])
                    per[policy][role].append(d / (3 * args.iterations) * 1e3)
    finally:
        os.unlink(secret)
    print("CPU time per iteration (ms, user + system, steady state: the {}- and {}-iteration runs' difference; "
          "median of {}): {}, {} workers, {} servers, {}".format(args.iterations, 4 * args.iterations, args.repeats,
                                                                 args.model, args.workers, args.servers,
                                                                 args.bandwidth))
    base = {r: statistics.median(per["wfbp"][r]) if "wfbp" in per else None for r in ("worker", "server")}
    print("{:<18} {:>10} {:>9} {:>10} {:>9}".format("policy", "worker", "vs wfbp", "server", "vs wfbp"))
    for p in policies:
        w, s = statistics.median(per[p]["worker"]), statistics.median(per[p]["server"])
        vw = "{:+.0f}%".format(100 * (w / base["worker"] - 1)) if base["worker"] else ""
        vs = "{:+.0f}%".format(100 * (s / base["server"] - 1)) if base["server"] else ""
        print("{:<18} {:>10.2f} {:>9} {:>10.2f} {:>9}".format(p, w, vw, s, vs))


main()
