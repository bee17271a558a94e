#!/usr/bin/env python3
"""Brings the mutation job's copy of the checkout (scripts/mutation.sh) up to date: every
file git knows of (committed or not, ignored ones left out) whose content differs is
written anew, and files gone from the checkout are removed; the copy's target/ stays.

Files are compared by content, not copied with their times: cargo decides what to rebuild
from modification times, and a file put back with an older time than the build that saw
it mutated would leave the mutant in the build."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys


def main(root: str, tree: str) -> int:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root, check=True, capture_output=True,
    ).stdout.decode().split("\0")
    wanted = {p for p in listed if p and os.path.isfile(os.path.join(root, p))}
    written = 0
    for rel in sorted(wanted):
        src, dst = os.path.join(root, rel), os.path.join(tree, rel)
        with open(src, "rb") as f:
            data = f.read()
        try:
            with open(dst, "rb") as f:
                if f.read() == data:
                    continue
        except OSError:
            pass
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        with open(dst, "wb") as f:
            f.write(data)
        shutil.copymode(src, dst)
        written += 1
    removed = 0
    for dirpath, dirnames, filenames in os.walk(tree):
        if dirpath == tree:
            dirnames[:] = [d for d in dirnames if d != "target"]
        for name in filenames:
            rel = os.path.relpath(os.path.join(dirpath, name), tree)
            if rel not in wanted:
                os.remove(os.path.join(dirpath, name))
                removed += 1
    print(f"mutation tree {tree}: {written} file(s) written, {removed} removed")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: mutation_tree.py CHECKOUT TREE")
    sys.exit(main(sys.argv[1], sys.argv[2]))
