#!/usr/bin/env python3
"""Checks the size of the code's types and functions (issue 28's gate).

No class or struct in src/ over 400 lines and no function over 120, counted as Universal
Ctags spans (its `line` to `end`), except those in tools/spans_allowed.txt, each with its
reason. Exits 1 naming every span over its limit that the list does not allow, and every
allowed entry that no longer needs to be there; prints the largest spans.

    python3 tools/spans.py [--root DIR]
"""
import argparse
import json
import os
import subprocess
import sys

LIMITS = {"class": 400, "struct": 400, "function": 120}


def spans(root):
    out = subprocess.run(
        ["ctags", "-R", "--fields=+ne", "--output-format=json", "--kinds-c++=+fcs", "-f", "-",
         "src"],
        cwd=root, check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        tag = json.loads(line)
        if tag.get("_type") != "tag" or "end" not in tag or tag.get("kind") not in LIMITS:
            continue
        scope = tag.get("scope", "")
        # Anonymous namespaces get a ctags-made name that changes with the file: drop it.
        scope = "::".join(p for p in scope.split("::") if not p.startswith("__anon"))
        name = (scope + "::" if scope else "") + tag["name"]
        yield tag["path"], name, tag["kind"], tag["end"] - tag["line"] + 1


def allowed(root):
    table = {}
    with open(os.path.join(root, "tools", "spans_allowed.txt")) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split(None, 2)
            if len(parts) < 3:
                sys.exit(f"tools/spans_allowed.txt:{n}: want 'PATH NAME REASON'")
            table[(parts[0], parts[1])] = parts[2]
    return table


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    root = ap.parse_args().root
    ok = allowed(root)
    over, used = [], set()
    for path, name, kind, n in spans(root):
        if n <= LIMITS[kind]:
            continue
        if (path, name) in ok:
            used.add((path, name))
            print(f"spans: allowed  {n:5d}  {kind:8s} {path} {name}")
        else:
            over.append(f"{path}: {kind} {name} is {n} lines (limit {LIMITS[kind]})")
    stale = [f"{p} {n}" for (p, n) in ok if (p, n) not in used]
    for o in over:
        print(f"spans: OVER {o}: split it, or add it to tools/spans_allowed.txt with the reason")
    for s in stale:
        print(f"spans: STALE tools/spans_allowed.txt lists '{s}', which is within its limit now "
              "(or gone): remove the line")
    print(f"spans: {len(over)} over the limits, {len(used)} allowed, {len(stale)} stale")
    return 1 if over or stale else 0


if __name__ == "__main__":
    sys.exit(main())
