"""The command lines of the user-facing docs, checked so that they cannot rot (issue 31):
every line of every ```sh block of the files in FILES, and every flag of docs/cli.md's
synopses. Each command line gets one of:

  run       run as written (from a scratch directory whose build/, examples/, data/,
            bench/, tests/ and scripts/ are the checkout's), exit 0 within its time;
  reduced   run in the committed reduced form REDUCED gives it (a long run made short:
            fewer policies or iterations; the flags kept), exit 0;
  parse     parse-only: `quicksilver SUB`'s every --flag exists in `quicksilver SUB
            --help` (for run --script, up to --script), the files it names exist, a shell
            script passes `bash -n`: lines that need root and minutes (--netns), the
            network (pip), or a LibTorch build;
  env       a line that sets up the machine (apt-get, venv, pip), checked by setup.sh and
            the pip test, listed here by its first words.

A line this file does not know fails the test, naming the file and the line.

    python3 tests/docs_test.py BUILD_DIR
"""
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILES = ["README.md", "docs/pytorch.md", "docs/cli.md"]

# Long runs, in a form that keeps every flag but takes seconds.
REDUCED = {
    "./build/quicksilver run --model vgg16 --policy all":
        "./build/quicksilver run --model vgg16 --policy mercury,wfbp --iterations 3",
    "./build/quicksilver run --model resnet50 --policy mercury,bytescheduler":
        "./build/quicksilver run --model resnet50 --policy mercury,bytescheduler --iterations 3",
    "./build/quicksilver run --architecture allreduce --model resnet50 --workers 2 --policy wfbp,mgwfbp,deft":
        "./build/quicksilver run --architecture allreduce --model resnet50 --workers 2 --policy wfbp,deft "
        "--iterations 3",
    "./build/quicksilver simulate --architecture allreduce --model resnet101 --policy all --workers 16":
        "./build/quicksilver simulate --architecture allreduce --model resnet101 --policy wfbp,mgwfbp --workers 16",
}
# Run as written: quick, no root, no network (the profile before the simulate that reads it).
RUN = [
    "./build/quicksilver models",
    "./build/quicksilver simulate --model resnet50 --policy mercury,bytescheduler,wfbp --workers 8 --servers 8 "
    "--bandwidth 5Gbps --latency 20us",
    "./build/quicksilver simulate --model vgg16 --policy all --json",
    "./build/quicksilver simulate --model vgg16 --policy mercury --trace t.json",
    "./build/quicksilver simulate --job vgg16:mercury --job resnet50:bytescheduler",
    "./build/quicksilver run --workers 2 --script examples/train_digits_quicksilver.py",
    "./build/quicksilver run --workers 2 --policy auto --script examples/train_digits_quicksilver.py",
    "./build/quicksilver profile --model torchvision:resnet18 --input 3,64,64 --batch 16 --out resnet18.json",
    "./build/quicksilver simulate --model resnet18.json --policy mercury,bytescheduler,wfbp --workers 2 --servers 2",
    "./build/quicksilver simulate --model data/measured/h200-resnet50-b32.json --policy mercury,bytescheduler "
    "--workers 8 --servers 8 --bandwidth 25Gbps",
]
# What needs the PyTorch module (absent from a sanitizer tree): profile, --script, and the
# simulate that reads the profile's output.
NEEDS_TORCH = [" profile ", "--script", "--model resnet18.json"]
ENV = ["apt-get install", "python3 -m venv", "/opt/qs/bin/pip install"]
# A pipeline that reads what the line before it wrote.
FOLLOWS = ['grep -h "binding file" /tmp/ld.*']


def commands(path):
    """(line number, command) of every ```sh block line, continuations joined, comments cut."""
    out, block, cur, start = [], False, "", 0
    for n, line in enumerate(open(os.path.join(ROOT, path)), 1):
        s = line.rstrip("\n")
        if s.startswith("```"):
            block = s.strip() in ("```sh", "```bash")
            continue
        if not block:
            continue
        if not cur:
            start = n
        if s.rstrip().endswith("\\"):
            cur += s.rstrip()[:-1] + " "
            continue
        cur += s
        text = cur.strip()
        cur = ""
        if " # " in text:  # a trailing comment
            text = text[:text.index(" # ")].strip()
        if text and not text.startswith("#"):
            out.append((start, " ".join(text.split())))
    return out


def synopses(path):
    """(line number, subcommand, flags) of every `quicksilver SUB ...` line of the
    untagged ``` blocks (the synopses)."""
    out, block = [], False
    for n, line in enumerate(open(os.path.join(ROOT, path)), 1):
        s = line.strip()
        if s.startswith("```"):
            block = s == "```"
            continue
        if block and s.startswith("quicksilver "):
            sub = s.split()[1]
            out.append((n, sub, re.findall(r"(--[a-z][a-z0-9-]*)", s.split("--script")[0])))
    return out


HELP = {}


def flags_of(qs, sub):
    """The flags `quicksilver SUB --help` lists (SUB starting with -: the top level's)."""
    if sub not in HELP:
        cmd = [qs, "--help"] if sub.startswith("-") else [qs, sub, "--help"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        known = set(re.findall(r"(--[a-z][a-z0-9-]*)", p.stdout + p.stderr)) if p.returncode == 0 else None
        if known is not None:
            known.add("--help")
            if sub == "profile":
                known.add("--python")  # the command's own, before it hands over to Python
        HELP[sub] = known
    return HELP[sub]


def parse_only(qs, cmd, torch_build):
    """Errors of a parse-only check of `cmd` (empty: fine). Without the PyTorch module in
    the build (a sanitizer tree), `profile`'s flags cannot be listed: not checked."""
    errors = []
    for part in cmd.split("&&"):
        words = shlex.split(part)
        while words and re.match(r"^[A-Z_]+=", words[0]):  # VAR=value prefixes
            words = words[1:]
        if not words:
            continue
        exe = words[0]
        if exe.endswith("/quicksilver"):
            sub = words[1]
            if sub == "profile" and not torch_build:
                continue
            known = flags_of(qs, sub)
            if known is None:
                errors.append("quicksilver {} --help fails".format(sub))
                continue
            args = words[2:words.index("--script")] if "--script" in words else words[2:]
            errors += ["quicksilver {} has no flag {}".format(sub, a) for a in args
                       if a.startswith("--") and a.split("=")[0] not in known]
            if "--script" in words:
                script = words[words.index("--script") + 1]
                if not os.path.exists(os.path.join(ROOT, script)) and not script.startswith("./build/"):
                    errors.append("no script " + script)
        elif exe == "bash":
            if not os.path.exists(os.path.join(ROOT, words[1])):
                errors.append("no " + words[1])
            elif subprocess.run(["bash", "-n", os.path.join(ROOT, words[1])]).returncode != 0:
                errors.append("bash -n " + words[1] + " fails")
        elif exe == "torchrun":
            script = [w for w in words[1:] if w.endswith(".py")]
            if not script or not os.path.exists(os.path.join(ROOT, script[0])):
                errors.append("torchrun of a missing script")
        elif not any(part.strip().startswith(e) for e in ENV):
            errors.append("a command this test does not know: " + part.strip())
    return errors


def run(cmd, cwd, timeout):
    start = time.monotonic()
    p = subprocess.run(cmd, shell=True, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    return p, time.monotonic() - start


def main():
    build = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build"))
    qs = os.path.join(build, "quicksilver")
    torch_build = os.path.isdir(os.path.join(build, "python", "quicksilver"))
    scratch = tempfile.mkdtemp(prefix="qs-docs-")
    os.symlink(build, os.path.join(scratch, "build"))
    for d in ("examples", "data", "bench", "tests", "scripts"):
        os.symlink(os.path.join(ROOT, d), os.path.join(scratch, d))
    failures, counts = [], {"run": 0, "reduced": 0, "parse": 0, "env": 0, "synopsis": 0}
    lines = []
    for f in FILES:
        lines += [(f, n, c) for n, c in commands(f)]
    order = {c: i for i, c in enumerate(RUN)}
    lines.sort(key=lambda x: order.get(x[2], -1))  # the profile before the simulate that reads it
    seen = set()
    for f, n, cmd in lines:
        where = "{}:{}: {}".format(f, n, cmd)
        if any(cmd.startswith(e) for e in ENV) or any(cmd.startswith(e) for e in FOLLOWS):
            counts["env"] += 1
            print("ok        env     " + where)
            continue
        errors = parse_only(qs, cmd, torch_build)
        if errors:
            failures.append(where + ": " + "; ".join(errors))
            continue
        # A line of several commands (setup && build && run): the ones this test runs.
        parts = [x.strip() for x in cmd.split("&&")]
        runnable = [x for x in parts if x in order or x in REDUCED]
        if not torch_build:  # no PyTorch module in this build: what needs it is parse-only
            runnable = [x for x in runnable if not any(n in x for n in NEEDS_TORCH)]
        seen.update(parts)
        for part in runnable:
            form = REDUCED.get(part, part)
            p, took = run(form, scratch, 600)
            if p.returncode != 0:
                failures.append("{}: exit {} ({}): {}".format(where, p.returncode, form, (p.stderr or p.stdout)[-600:]))
            else:
                print("ok {:>5.1f}s {} {}".format(took, "run    " if part in order else "reduced", where))
            counts["run" if part in order else "reduced"] += 1
        if not runnable:
            counts["parse"] += 1
            print("ok        parse   " + where)
    for f in FILES:
        for n, sub, flags in synopses(f):
            if sub == "profile" and not torch_build:
                continue
            known = flags_of(qs, sub)
            bad = [x for x in flags if known is None or x not in known]
            if bad:
                failures.append("{}:{}: synopsis of quicksilver {}: no flag {}".format(f, n, sub, ", ".join(bad)))
            counts["synopsis"] += 1
    missing = [c for c in list(RUN) + list(REDUCED) if c not in seen]  # a doc changed: update the lists
    failures += ["a command this test runs is in no doc any more (update RUN/REDUCED): " + c for c in missing]
    shutil.rmtree(scratch, ignore_errors=True)
    for x in failures:
        print("FAIL " + x)
    print("docs: {} command lines of {} checked ({run} run as written, {reduced} in reduced form, {parse} "
          "parse-only, {env} machine set-up), {synopsis} synopses; {f} failed".format(
              len(lines), ", ".join(FILES), f=len(failures), **counts))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
