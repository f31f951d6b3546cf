#!/usr/bin/env python3
"""Compiles every source file that uses core/mutex.h's annotations with clang's
thread-safety analysis on, as errors (scripts/style.sh). Takes each file's include
directories, definitions and standard from the build's compile_commands.json.

    python3 tools/thread_safety.py BUILD_DIR
"""
import json
import os
import shlex
import subprocess
import sys


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(build, "compile_commands.json")) as f:
        commands = json.load(f)
    files = subprocess.run(["git", "grep", "-l", "-E", "QS_GUARDED_BY|MutexLock", "--", "src"],
                           cwd=root, capture_output=True, text=True).stdout.split()
    failed = 0
    checked = 0
    for rel in files:
        if not rel.endswith(".cc"):
            continue
        path = os.path.join(root, rel)
        entry = next((c for c in commands if os.path.realpath(c["file"]) == path), None)
        if entry is None:
            print(f"thread-safety: {rel} is not in {build}/compile_commands.json")
            failed += 1
            continue
        args = entry.get("arguments") or shlex.split(entry["command"])
        keep = [a for a in args if a.startswith(("-I", "-D", "-std=", "-isystem"))]
        for i, a in enumerate(args):  # "-isystem DIR" as two arguments
            if a == "-isystem" and i + 1 < len(args):
                keep += ["-isystem", args[i + 1]]
        cmd = ["clang++", "-fsyntax-only", "-Wthread-safety", "-Werror=thread-safety",
               "-Wno-unknown-warning-option"] + keep + [path]
        r = subprocess.run(cmd, cwd=entry["directory"], capture_output=True, text=True)
        checked += 1
        if r.returncode != 0:
            failed += 1
            print(r.stderr[-4000:])
    print(f"thread-safety: {checked} files checked, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
