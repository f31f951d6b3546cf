#!/usr/bin/env python3
"""Writes a per-file compilation database from a build's: every unity batch of a unity build
(CMAKE_UNITY_BUILD, scripts/build.sh) is replaced by one entry per source file it includes,
each with the batch's command. clang-tidy and tools/thread_safety.py read it
(scripts/style.sh): they look each source file up by name, and a unity build's database
names only its batches. A build without batches is copied as it is.

    python3 tools/compile_db.py BUILD_DIR OUT_DIR   (writes OUT_DIR/compile_commands.json)
"""
import json
import os
import re
import shlex
import sys

INCLUDE = re.compile(r'^#include "(.+)"$')


def expand(entry):
    """The entries for `entry`: itself, or one per file its unity batch includes."""
    path = os.path.join(entry["directory"], entry["file"])
    if "/Unity/unity_" not in path:
        return [entry]
    with open(path) as f:
        sources = [m.group(1) for m in map(INCLUDE.match, f.read().splitlines()) if m]
    args = entry.get("arguments") or shlex.split(entry["command"])
    out = []
    for source in sources:
        # The batch's source and object replaced by the file's (the object is never written:
        # the readers only parse).
        file_args = [source if a == entry["file"] or a == path else a for a in args]
        if "-o" in file_args:
            i = file_args.index("-o")
            file_args[i + 1] = os.path.basename(source) + ".o"
        out.append({"directory": entry["directory"], "arguments": file_args, "file": source})
    return out


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    build, out_dir = sys.argv[1:]
    with open(os.path.join(build, "compile_commands.json")) as f:
        entries = json.load(f)
    expanded = [e for entry in entries for e in expand(entry)]
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "compile_commands.json"), "w") as f:
        json.dump(expanded, f, indent=1)
    print(f"compile_db: {len(expanded)} files from {len(entries)} entries of {build}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
