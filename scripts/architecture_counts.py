#!/usr/bin/python3
"""The counts the architecture work is measured by, from the sources as they are (read with
regular expressions and brace matching: a heuristic a reader can check by eye, not a parser):

  parts      each engine part (a class in engine/*.h with a Context struct, or taking the one
             of a part it owns: `using Context = Other::Context;`): the lines of its header
             and of the .cc files defining its methods, its private data members, and the
             other parts its Context names (peers)
  impl       Engine::Impl: its data members and the .cc files that define its methods
  shards     where the engine records which tier a layer's shards live on: the per-layer
             records of the parts (a `std::vector<S> name_;` member whose struct S holds a Tier
             or a `persistent` flag) and the callbacks in Contexts that hand over such a
             struct, outside engine/shard_map.h (the one record)
  nvme       call sites of NvmeHomes' raw accessors (io(), params(), swapper()) outside
             nvme_homes.*, and the files they are in
  closures   engine code an offload thread would run: requests submitted to an I/O worker
             (submit(...)) and callbacks handed to the swapper's step (StepOrder's ready,
             done, ascending_rest), with their files
  functions  functions longer than --limit lines (default 120) in engine/, tools/cli/,
             train/, python/ and models/, longest first
  tests      test suites and test helpers (tests/*/CMakeLists.txt: strata_add_test_suite's
             LIBS, target_link_libraries) that link a library of a folder above, or beside,
             the one their folder tests (tests/X tests X; tests/runtime the runtime folders,
             tests/capi the engine), by the order scripts/layers.txt gives
  sizes      lines of tools/cli/, docs/design.md, and the largest library file
  layers     the folders scripts/layers.txt names (scripts/check_layers.py checks them)

Usage: architecture_counts.py [--limit N] [--json] [ROOT]"""
import argparse
import json
import os
import re
import sys

LIB = ("runtime", "io", "optim", "offload", "pipeline", "checkpoint", "tokenizer", "engine", "models", "train", "tools")


def read(root, path):
    with open(os.path.join(root, path), errors="replace") as f:
        return f.read()


def files_under(root, top, exts=(".h", ".cc", ".cu")):
    out = []
    for dirpath, _, names in os.walk(os.path.join(root, top)):
        out += [os.path.relpath(os.path.join(dirpath, n), root) for n in names if n.endswith(exts)]
    return sorted(out)


def lines(root, path):
    return read(root, path).count("\n")


def body(text, open_at):
    """The text from the brace at open_at to its match."""
    depth = 0
    for i in range(open_at, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[open_at:i + 1]
    return text[open_at:]


MEMBER = re.compile(r"^\s+(?!return|using|static|friend|struct|class|enum|public|private|protected|//)"
                    r"[\w:<>,\s\*&\[\]]+?[\s\*&]+(\w+)(\s*=[^;]*|\{[^;]*\})?;\s*(//.*)?$")


def members(block):
    """Data members declared at the top level of a class body."""
    depth, out = 0, []
    for line in block.split("\n")[1:]:
        code = line.split("//")[0]
        if depth == 0 and "(" not in code and MEMBER.match(line):
            out.append(MEMBER.match(line).group(1))
        depth += code.count("{") - code.count("}")
        # A nested struct declared with a member (`struct Flags { ... } flags;`) is one member.
        closing = re.match(r"^\s*\}\s*(\w+)\s*;", code)
        if depth == 0 and closing:
            out.append(closing.group(1))
    return out


def parts(root):
    heads = [p for p in files_under(root, "engine", (".h",)) if "/detail/" not in p]
    blocks = {}  # part -> (header, class body): the classes with a Context struct
    shared = {}  # part -> the part whose Context it takes (`using Context = Other::Context;`)
    for h in heads:
        text = read(root, h)
        for m in re.finditer(r"^class (\w+) \{", text, re.M):
            block = body(text, text.index("{", m.start()))
            alias = re.search(r"using Context = (\w+)::Context;", block)
            if re.search(r"struct Context \{", block) or alias:
                blocks[m.group(1)] = (h, block)
            if alias:
                shared[m.group(1)] = alias.group(1)
    sources = {p: read(root, p) for p in files_under(root, "engine", (".cc",))}
    out = {}
    for cls, (h, block) in sorted(blocks.items()):
        context_block = blocks[shared[cls]][1] if cls in shared else block
        ctx = re.search(r"struct Context \{", context_block)
        context = body(context_block, ctx.end() - 1)
        private = block[block.find("private:"):] if "private:" in block else ""
        defines = re.compile(r"^(?!//)\S[^\n;(]*\b" + cls + r"::~?\w+\(", re.M)  # at column 0: a definition, not a call
        own = [h] + [p for p, text in sources.items() if defines.search(text)]
        out[cls] = {"files": own, "lines": sum(lines(root, p) for p in own),
                    "private_members": len(members("{\n" + private)),
                    "peers": sorted(n for n in blocks
                                    if n not in (cls, shared.get(cls)) and re.search(r"\b" + n + r"\b", context))}
    return out


def impl(root):
    text = read(root, "engine/detail/engine_impl.h")
    m = re.search(r"struct Engine::Impl \{", text)
    fields = members(body(text, text.index("{", m.start())))
    defining = [p for p in files_under(root, "engine", (".cc",)) if "Engine::Impl::" in read(root, p)]
    return {"members": len(fields), "method_files": defining}


def shard_records(root):
    records, callbacks = [], []
    for h in files_under(root, "engine", (".h",)):
        if os.path.basename(h) == "shard_map.h":
            continue
        text = read(root, h)
        structs = {}
        for m in re.finditer(r"\bstruct (\w+) \{", text):
            block = body(text, text.index("{", m.start()))
            fields = [line for line in block.split("\n")[1:] if MEMBER.match(line)]
            if any(re.match(r"\s+Tier\s", f) or re.search(r"\bbool persistent\b", f) for f in fields):
                structs[m.group(1)] = True
        for m in re.finditer(r"std::vector<(\w+)> (\w+_);", text):
            if m.group(1) in structs:
                records.append(f"{h}: {m.group(2)}")
        for m in re.finditer(r"std::function<(\w+)\(int li\)> (\w+);", text):
            if m.group(1) in structs or m.group(1) == "Tier":
                callbacks.append(f"{h}: {m.group(2)}")
    return {"records": records, "callbacks": callbacks}


def layer_ranks(root):
    """folder -> line of scripts/layers.txt (0 at the top)."""
    ranks = {}
    lines_ = [line.split("#")[0].strip() for line in open(os.path.join(root, "scripts", "layers.txt"))]
    for i, line in enumerate(x for x in lines_ if x and not x.startswith("outside:")):
        for folder in line.split():
            ranks[folder] = i
    return ranks


def test_links(root):
    ranks = layer_ranks(root)
    libs = {}  # library target -> its folder
    for folder in ranks:
        path = os.path.join(root, folder, "CMakeLists.txt")
        if os.path.exists(path):
            for m in re.finditer(r"add_library\((\w+)", read(root, os.path.join(folder, "CMakeLists.txt"))):
                libs[m.group(1)] = folder
    tested = {"runtime": ("runtime/core", "runtime/device", "runtime/comm"), "capi": ("engine",)}
    out = []
    for d in sorted(os.listdir(os.path.join(root, "tests"))):
        rel = os.path.join("tests", d, "CMakeLists.txt")
        if not os.path.exists(os.path.join(root, rel)):
            continue
        own = tested.get(d, (d,))
        if not all(f in ranks for f in own):
            continue  # tests of the tools and the Python package: above every layer
        text = read(root, rel)
        links = []
        for m in re.finditer(r"\b(strata_add_test_suite|target_link_libraries)\((\w+)", text):
            depth, end = 0, m.end()
            for end in range(m.end() - len(m.group(2)) - 1, len(text)):  # to the call's closing parenthesis
                depth += {"(": 1, ")": -1}.get(text[end], 0)
                if depth == 0:
                    break
            call = text[m.end():end]
            if m.group(1) == "strata_add_test_suite":
                call = call.split("LIBS", 1)[1].split("HW")[0] if "LIBS" in call else ""
            links.append((m.group(2), call))
        top = min(ranks[f] for f in own)
        for name, listed in links:
            for lib in re.findall(r"\bstrata_\w+", listed):
                folder = libs.get(lib)
                if folder and folder not in own and ranks[folder] <= top:
                    out.append(f"{name} (tests/{d}) links {lib} ({folder}/)")
    return out


def nvme_accessors(root):
    sites, files = 0, set()
    for p in files_under(root, "engine"):
        if os.path.basename(p).startswith("nvme_homes"):
            continue
        n = len(re.findall(r"(?:nvme|nvme_)\s*(?:->|\.)\s*(?:io|params|swapper)\(\)", read(root, p)))
        if n:
            sites += n
            files.add(p)
    return {"call_sites": sites, "files": sorted(files)}


def offload_closures(root):
    sites, files = 0, set()
    pattern = re.compile(r"(?:->|\.)\s*submit\(|\border\.(?:ready|done|ascending_rest)\s*=")
    for p in files_under(root, "engine"):
        n = len(pattern.findall(read(root, p)))
        if n:
            sites += n
            files.add(p)
    return {"sites": sites, "files": sorted(files)}


FUNC = re.compile(r"^(?:[\w:<>,\*&~\s]+?)\b([\w:~]+)\([^;{}]*\)\s*(?:const)?\s*(?:noexcept)?\s*(?:override)?\s*\{",
                  re.M)
PYFUNC = re.compile(r"^(\s*)def (\w+)\(", re.M)


def long_functions(root, limit):
    out = []
    for top in ("engine", "tools", "train", "models"):
        for p in files_under(root, top, (".cc", ".cu")):
            text = read(root, p)
            for m in FUNC.finditer(text):
                if m.group(1) in ("if", "for", "while", "switch", "catch"):
                    continue
                n = body(text, m.end() - 1).count("\n") + 1
                if n > limit:
                    out.append((n, f"{p}:{text.count(chr(10), 0, m.start()) + 1} {m.group(1)}"))
    for p in files_under(root, "python", (".py",)):
        text = read(root, p).split("\n")
        for i, line in enumerate(text):
            m = PYFUNC.match(line)
            if not m:
                continue
            end = i + 1
            while end < len(text) and (not text[end].strip() or len(text[end]) - len(text[end].lstrip()) > len(
                    m.group(1))):
                end += 1
            if end - i > limit:
                out.append((end - i, f"{p}:{i + 1} {m.group(2)}"))
    return [f"{n} lines: {where}" for n, where in sorted(out, reverse=True)]


def sizes(root):
    lib = [p for top in LIB for p in files_under(root, top)]
    largest = max(lib, key=lambda p: lines(root, p))
    return {"tools/cli lines": sum(lines(root, p) for p in files_under(root, "tools/cli")),
            "docs/design.md lines": lines(root, "docs/design.md"),
            "largest library file": f"{largest} ({lines(root, largest)} lines)",
            "library files": len(lib)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root", nargs="?", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--limit", type=int, default=120)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    root = os.path.abspath(a.root)
    layers = [line.split("#")[0].strip() for line in open(os.path.join(root, "scripts", "layers.txt"))]
    layers = [line for line in layers if line and not line.startswith("outside:")]
    report = {"parts": parts(root), "impl": impl(root), "shards": shard_records(root), "nvme": nvme_accessors(root),
              "closures": offload_closures(root), "tests": test_links(root),
              "functions": long_functions(root, a.limit), "sizes": sizes(root),
              "layers": layers}
    if a.json:
        print(json.dumps(report, indent=1))
        return 0
    print("engine parts (lines of their files, private data members, peers their Context names):")
    for cls, p in report["parts"].items():
        print(f"  {cls:<16} {p['lines']:5d} lines in {len(p['files'])} files, {p['private_members']:3d} private "
              f"members, {len(p['peers'])} peers {p['peers']}")
    i = report["impl"]
    print(f"Engine::Impl: {i['members']} data members; methods defined in {len(i['method_files'])} .cc files "
          f"{i['method_files']}")
    r = report["shards"]
    print(f"per-layer tier records besides the shard map: {len(r['records'])} {r['records']}; callbacks handing "
          f"tiers over: {len(r['callbacks'])} {r['callbacks']}")
    n = report["nvme"]
    print(f"NvmeHomes' raw accessors (io(), params(), swapper()): {n['call_sites']} call sites in "
          f"{len(n['files'])} files {n['files']}")
    c = report["closures"]
    print(f"engine closures run by offload (I/O worker requests, swapper callbacks): {c['sites']} in "
          f"{len(c['files'])} files {c['files']}")
    print(f"test suites and helpers linking a layer above or beside the one they test: {len(report['tests'])}")
    for t in report["tests"]:
        print(f"  {t}")
    print(f"functions over {a.limit} lines: {len(report['functions'])}")
    for f in report["functions"]:
        print(f"  {f}")
    for k, v in report["sizes"].items():
        print(f"{k}: {v}")
    print("layers (top down): " + " | ".join(report["layers"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
