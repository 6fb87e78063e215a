#!/usr/bin/python3
"""Fails on any #include that points up the layer order in scripts/layers.txt, sideways to
a folder on the same line, or into another folder's detail/, and on any source file (or
include) in a folder that no line of layers.txt names: every top-level folder is either on a
line or on its `outside:` line (tests, scripts, docs...: outside the layers; build outputs and
hidden folders are skipped), so a new folder cannot join the library unchecked. Checks every
.h/.cc/.cu file. Prints each broken include as FILE:LINE and the rule it breaks.
Usage: check_layers.py [ROOT] (default: the repository holding this script)"""
import os
import re
import sys

INCLUDE = re.compile(r'\s*#\s*include\s+"([^"]+)"')


def read_layers(path):
    """({folder: level}, {folders outside the layers}); the bottom line is level 0."""
    levels, outside = [], set()
    for line in open(path):
        line = line.split("#", 1)[0].split()
        if line and line[0] == "outside:":
            outside.update(line[1:])
        elif line:
            levels.append(line)
    return {folder: len(levels) - 1 - i for i, row in enumerate(levels) for folder in row}, outside


def skipped(top):
    return top.startswith((".", "build"))


def folder_of(path, levels):
    best = None
    for f in levels:
        if path == f or path.startswith(f + "/"):
            if best is None or len(f) > len(best):
                best = f
    return best


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    layers_file = os.path.join(root, "scripts", "layers.txt")
    if not os.path.exists(layers_file):
        print(f"check_layers: {layers_file} is missing", file=sys.stderr)
        return 2
    levels, outside = read_layers(layers_file)
    errors, files = [], 0
    tops = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)) and not skipped(d))
    for top in tops:
        if top in outside:
            continue
        for dirpath, _, names in os.walk(os.path.join(root, top)):
            for name in sorted(names):
                if not name.endswith((".h", ".cc", ".cu")):
                    continue
                path = os.path.relpath(os.path.join(dirpath, name), root)
                src = folder_of(path, levels)
                if src is None:
                    errors.append(f"{path}: its folder is on no line of scripts/layers.txt: add it to the line of "
                                  f"its layer (or to the outside: line if it is no part of the library)")
                    continue
                files += 1
                with open(os.path.join(root, path), errors="replace") as f:
                    for n, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        inc = m.group(1)
                        dst = folder_of(inc, levels)
                        top_of_inc = inc.split("/")[0]
                        if dst is None and top_of_inc in tops and top_of_inc not in outside:
                            errors.append(f"{path}:{n}: includes {inc}: a folder on no line of scripts/layers.txt")
                            continue
                        if dst is None or dst == src:
                            continue
                        if "/detail/" in "/" + inc[len(dst):]:
                            errors.append(f"{path}:{n}: includes {inc}: another folder's detail/ ({dst}/detail)")
                        elif levels[dst] > levels[src]:
                            errors.append(f"{path}:{n}: includes {inc}: {dst} is above {src} in scripts/layers.txt")
                        elif levels[dst] == levels[src]:
                            errors.append(f"{path}:{n}: includes {inc}: {dst} and {src} are on one line of "
                                          "scripts/layers.txt (siblings may not include each other)")
    for e in errors:
        print(e, file=sys.stderr)
    if errors:
        print(f"check_layers: {len(errors)} include(s) break the layer order", file=sys.stderr)
        return 1
    print(f"check_layers: {files} files, every include points down the layer order")
    return 0


if __name__ == "__main__":
    sys.exit(main())
