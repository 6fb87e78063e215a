#!/usr/bin/python3
"""Runs every shell and Python example in README.md and docs/*.md as a reader would.

Usage: docs_examples_test.py REPO_ROOT STRATA_BINARY [FILTER...]

A fenced block whose info string is sh, bash, shell, console or python is a command; it runs
from a fresh directory under /var/tmp that holds a symlink to every top-level entry of the
repository (`build` links to the build tree of STRATA_BINARY), so repository-relative paths
work and what the example writes stays in that directory. `docs` is a copy, not a link: some
examples redraw the figures in docs/, and the repository's own must not change. Shell blocks
run under `bash -euo pipefail`, Python blocks under /usr/bin/python3 (STRATA_LIBRARY and
PYTHONPATH set for `import strata`, the strata binary's directory first on PATH); a console
block runs its `$ ` lines. Every other fence (output, JSON, text, C, C++) is listed as not a
command.

HTML comments on the lines right before an opening fence steer the run; several may stand
on consecutive lines:

  <!-- docs-test: skip REASON -->        the block is not run (the reason is required)
  <!-- docs-test: env NAME=VALUE ... -->  environment variables for the block
  <!-- docs-test: replace OLD => NEW -->  replace every OLD in the block by NEW before the
                                          run (repeatable, applied in order; OLD must occur
                                          in the block; NEW may be empty)
  <!-- docs-test: timeout SECONDS -->     the block's time limit (default 300 s)
  <!-- docs-test: continue -->            run in the directory of the file's previous block

Each block prints one line: RUN file:line (N s), SKIP file:line: REASON, TEXT file:line: not a
command, or FAIL file:line: and the last lines of its output. The test exits 1 when a block
failed or a marker is malformed, and 77 (skipped) when STRATA_BINARY does not exist. FILTER
arguments, if given, run only the blocks whose file:line contains one of them.
DOCS_TEST_VERBOSE=1 prints every block's whole output; DOCS_TEST_KEEP=1 keeps the directories.
"""

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

RUNNABLE = {"sh": "sh", "bash": "sh", "shell": "sh", "console": "console", "python": "python"}
DEFAULT_TIMEOUT = 300
TAIL_LINES = 25
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable

FENCE_OPEN = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^\s`]*)")
MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(\w+)\s*(.*?)\s*-->\s*$")
MARKER_ANY = re.compile(r"<!--\s*docs-test:")


class Block:
    """One fenced block of a Markdown file and the markers before it."""

    def __init__(self, path, line, info, text):
        self.path = path          # relative to the repository root
        self.line = line          # 1-based line of the opening fence
        self.info = info          # the info string's first word, lower case
        self.text = text          # the block's lines, fence indentation removed
        self.skip = None          # the skip reason, or None
        self.env = {}
        self.replace = []         # (old, new) pairs, in order
        self.timeout = DEFAULT_TIMEOUT
        self.cont = False
        self.errors = []          # malformed markers

    @property
    def where(self):
        return f"{self.path}:{self.line}"

    @property
    def kind(self):
        return RUNNABLE.get(self.info)


def parse_markers(block, markers):
    """Applies the (line, name, argument) markers, top to bottom, to block."""
    for line, name, arg in markers:
        if name == "skip":
            if not arg:
                block.errors.append(f"line {line}: 'skip' needs a reason")
            block.skip = arg or "no reason given"
        elif name == "env":
            try:
                words = shlex.split(arg)
            except ValueError as e:
                block.errors.append(f"line {line}: env: {e}")
                continue
            if not words:
                block.errors.append(f"line {line}: 'env' needs NAME=VALUE")
            for word in words:
                key, eq, value = word.partition("=")
                if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                    block.errors.append(f"line {line}: env: '{word}' is not NAME=VALUE")
                else:
                    block.env[key] = value
        elif name == "replace":
            old, sep, new = (arg + " ").partition(" => ")
            new = new[:-1]
            if not sep or not old:
                block.errors.append(f"line {line}: 'replace' needs OLD => NEW")
            else:
                block.replace.append((old, new))
        elif name == "timeout":
            try:
                block.timeout = float(arg)
                if block.timeout <= 0:
                    raise ValueError
            except ValueError:
                block.errors.append(f"line {line}: 'timeout' needs a positive number of seconds")
        elif name == "continue":
            if arg:
                block.errors.append(f"line {line}: 'continue' takes no argument")
            block.cont = True
        else:
            block.errors.append(f"line {line}: unknown marker '{name}'")


def parse_file(root, rel):
    """Returns the file's fenced blocks and the errors of markers that precede no fence."""
    with open(os.path.join(root, rel), encoding="utf-8") as f:
        lines = f.read().split("\n")
    blocks, errors, used = [], [], set()
    i = 0
    while i < len(lines):
        m = FENCE_OPEN.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = len(m.group(1)), m.group(2), m.group(3).lower()
        close = re.compile(r"^\s*" + re.escape(fence[0]) + "{" + str(len(fence)) + r",}\s*$")
        j = i + 1
        while j < len(lines) and not close.match(lines[j]):
            j += 1
        body = [l[indent:] if l[:indent].strip() == "" else l.lstrip() for l in lines[i + 1:j]]
        block = Block(rel, i + 1, info, "\n".join(body) + "\n")
        markers, k = [], i - 1
        while k >= 0 and MARKER.match(lines[k]):
            mm = MARKER.match(lines[k])
            markers.insert(0, (k + 1, mm.group(1), mm.group(2)))
            used.add(k)
            k -= 1
        parse_markers(block, markers)
        if markers and block.kind is None:
            block.errors.append("markers before a block that is not a command")
        blocks.append(block)
        i = j + 1
    for n, l in enumerate(lines):
        if MARKER_ANY.search(l) and n not in used:
            errors.append(f"{rel}:{n + 1}: a docs-test marker that is not on the lines right "
                          "before an opening fence (or is malformed)")
    return blocks, errors


def script_of(block):
    """The text to run: the block after its replacements (console: its `$ ` lines)."""
    text = block.text
    for old, new in block.replace:
        if old not in text:
            raise ValueError(f"replace: '{old}' does not occur in the block")
        text = text.replace(old, new)
    if block.kind == "console":
        cmds, cont = [], False
        for l in text.split("\n"):
            if l.startswith("$ ") or cont:
                cmds.append(l[2:] if l.startswith("$ ") and not cont else l)
                cont = l.rstrip().endswith("\\")
        text = "\n".join(cmds) + "\n"
    return text


def make_dir(work, root, build, name):
    """A directory under work holding a symlink to each top-level entry of the repository."""
    d = os.path.join(work, name)
    os.mkdir(d)
    for entry in sorted(os.listdir(root)):
        if entry == ".git":
            continue
        if entry == "docs":
            shutil.copytree(os.path.join(root, entry), os.path.join(d, entry), symlinks=True)
            continue
        target = build if entry == "build" else os.path.join(root, entry)
        os.symlink(target, os.path.join(d, entry))
    if not os.path.lexists(os.path.join(d, "build")):
        os.symlink(build, os.path.join(d, "build"))
    return d


def run(cmd, cwd, env, timeout, log):
    """Runs cmd in a session of its own; returns (exit status or 'timeout', seconds)."""
    start = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            status = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            status = "timeout"
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)   # what the block left running
        except ProcessLookupError:
            pass
        proc.wait()
    return status, time.monotonic() - start


def tail(log, n=TAIL_LINES):
    with open(log, "rb") as f:
        text = f.read().decode("utf-8", "replace").rstrip("\n")
    if not text:
        return "    (no output)"
    return "\n".join("    " + l for l in text.split("\n")[-n:])


class Runner:
    """Runs the blocks of one file after another and counts the outcomes."""

    def __init__(self, root, build, env, work, verbose, keep):
        self.root, self.build, self.env, self.work = root, build, env, work
        self.verbose, self.keep = verbose, keep
        self.counts = {"run": 0, "skipped": 0, "failed": 0, "text": 0}

    def report(self, outcome, line):
        print(line, flush=True)
        self.counts[outcome] += 1

    def run_file(self, rel, filters):
        blocks, errors = parse_file(self.root, rel)
        for e in errors:
            self.report("failed", f"FAIL {e}")
        # The file's previous command: (block, its directory or None, "run"|"skipped"|"failed").
        prev = None
        for block in blocks:
            if block.kind is None and not block.errors:
                what = f"'{block.info}'" if block.info else "no info string"
                self.report("text", f"TEXT {block.where}: not a command ({what})")
                continue
            if filters and not any(f in block.where for f in filters):
                continue
            # A directory is kept only for the block that continues it.
            if prev and prev[1] and not block.cont and not self.keep:
                shutil.rmtree(prev[1], ignore_errors=True)
            prev = self.run_block(block, prev)

    def run_block(self, block, prev):
        """Runs (or skips) block; returns what a later block that continues it needs."""
        where = block.where
        if block.errors:
            self.report("failed", f"FAIL {where}: " + "; ".join(block.errors))
            return (block, None, "failed")
        d = None
        if block.cont:
            if prev is None:
                self.report("failed", f"FAIL {where}: 'continue' with no earlier block in the file")
                return (block, None, "failed")
            d = prev[1]
            if prev[2] != "run" and block.skip is None:
                what = "was skipped" if prev[2] == "skipped" else "failed"
                self.report("skipped", f"SKIP {where}: continues {prev[0].where}, which {what}")
                return (block, d, "skipped")
        if block.skip is not None:
            self.report("skipped", f"SKIP {where}: {block.skip}")
            return (block, d, "skipped")
        try:
            text = script_of(block)
        except ValueError as e:
            self.report("failed", f"FAIL {where}: {e}")
            return (block, d, "failed")
        name = f"{block.path.replace('/', '_')}-{block.line}"
        if d is None:
            d = make_dir(self.work, self.root, self.build, name)
        python = block.kind == "python"
        script = os.path.join(self.work, name + (".py" if python else ".sh"))
        with open(script, "w", encoding="utf-8") as f:
            f.write(text)
        cmd = [PYTHON, script] if python else ["bash", "-euo", "pipefail", script]
        log = os.path.join(self.work, name + ".log")
        status, secs = run(cmd, d, dict(self.env, **block.env), block.timeout, log)
        if self.verbose:
            print(tail(log, 10**9), flush=True)
        if status == 0:
            self.report("run", f"RUN {where} ({secs:.0f} s)")
            return (block, d, "run")
        if status == "timeout":
            why = f"timed out after {block.timeout:.0f} s"
        else:
            why = f"exit status {status} after {secs:.0f} s"
        self.report("failed", f"FAIL {where}: {why}; the last lines of its output:\n{tail(log)}")
        return (block, d, "failed")


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    root = os.path.realpath(sys.argv[1])
    strata = os.path.abspath(sys.argv[2])
    filters = sys.argv[3:]
    if not os.path.isfile(strata):
        print(f"SKIPPED: {strata} does not exist (build it first)")
        return 77
    bindir = os.path.dirname(strata)
    build = os.path.dirname(bindir)
    env = dict(os.environ)
    env["STRATA_LIBRARY"] = os.path.join(build, "lib", "libstrata_c.so")
    env["PYTHONPATH"] = os.path.join(root, "python")
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "/usr/bin:/bin")
    files = ["README.md"] + sorted("docs/" + f for f in os.listdir(os.path.join(root, "docs"))
                                   if f.endswith(".md"))

    keep = os.environ.get("DOCS_TEST_KEEP") == "1"
    work = tempfile.mkdtemp(prefix="strata-docs-", dir="/var/tmp")
    runner = Runner(root, build, env, work, os.environ.get("DOCS_TEST_VERBOSE") == "1", keep)
    start = time.monotonic()
    try:
        for rel in files:
            runner.run_file(rel, filters)
    finally:
        if keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    c = runner.counts
    print(f"{c['text']} blocks are not commands; {time.monotonic() - start:.0f} s in all")
    print(f"{c['run']} run, {c['skipped']} skipped, {c['failed']} failed")
    return 1 if c["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
