#!/usr/bin/python3
"""Replays every crash state of a recorded checkpoint save (fs_model.py states the model) and
checks each with the built strata:

  * `strata checkpoint verify ROOT` either verifies a checkpoint whose step directory holds
    exactly the bytes some commit of that step put there (a rename of a staging directory
    to step-N, or the tree before the run) or refuses cleanly: a non-zero exit below 126,
    no signal, and a "strata: error:" line. Never a torn checkpoint, never a crash.
  * A commit is never lost: once `latest` naming step N is durable, or the save that
    committed step N has returned (the next save begins, or the run ends), every later
    crash state verifies at step N or a newer one.
  * Every step-N directory with a manifest verifies with committed bytes or is refused.
  * For a sample of states (per outcome, the one with the most leftovers; up to --resumes),
    `strata train --resume latest` into the crashed root loads what verify accepted (or
    refuses as verify did), trains a step, saves it over the leftovers, and the root then
    verifies at that step.

Before all that, the model replayed to the end must equal the directory the run left, byte
for byte (the recording missed nothing). Prints the figures; exit 1 on any failure.
Usage: replay_crash_states.py --strata BIN --log LOG --root ROOT [--initial DIR] --work DIR
       --train "ARGS" [--resumes N]
"""
import argparse
import concurrent.futures
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fs_model  # noqa: E402

CAP = 4096  # data variants of one metadata state
MAX_STATES = 5000  # distinct states checked (about 0.1 s each)
MAX_FAILURES = 8  # reported before the replay stops


def disk_signature(path, prefix=""):
    out = []
    for name in sorted(os.listdir(path)):
        p = os.path.join(path, name)
        if os.path.isdir(p):
            out.append((prefix + name, None))
            out.extend(disk_signature(p, prefix + name + "/"))
        else:
            with open(p, "rb") as f:
                out.append((prefix + name, f.read()))
    return tuple(out)


def materialize(signature, root):
    os.makedirs(root)
    for path, data in signature:
        if data is None:
            os.mkdir(os.path.join(root, path))
        else:
            with open(os.path.join(root, path), "wb") as f:
                f.write(data)


def describe(signature):
    return "\n".join(f"    {p}/" if d is None else f"    {p} ({len(d)} bytes)" for p, d in signature) or "    (empty)"


def subtree(signature, name):
    return tuple((p[len(name) + 1:], d) for p, d in signature if p.startswith(name + "/"))


def run(cmd, timeout=120):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired:
        return "timeout", ""


def clean_refusal(rc, out):
    return isinstance(rc, int) and 0 < rc < 126 and "strata: error:" in out and "bad_alloc" not in out


class Checker:
    def __init__(self, args, model):
        self.a, self.m = args, model
        self.failures, self.outcomes, self.verifies, self.resumes = [], {}, 0, 0
        self.findings = []  # durability lost in posix-order states only (printed, not failed)
        self.step_dirs = {}  # (name, digest of its tree) -> verify's (exit, output)

    def fail(self, what, state, into=None):
        (self.failures if into is None else into).append(
            f"FAIL: {what}\n  crash point {state['point']} ({state['model']} state), after:\n"
            + "\n".join("    " + op for op in state["ops"])
            + f"\n  the state (under the recorded root):\n{describe(state['sig'])}")

    def durability(self, step, state, out):
        """A commit is never lost; where only posix states lose it, that is a finding (POSIX
        promises less than the ext4/xfs journal), reported apart and failed as well."""
        for floor, journal in ((state["jfloor"], True), (state["floor"], False)):
            if floor is not None and (step is None or step < floor):
                what = (f"step {floor} must survive (its `latest` was durable, or its save had returned), but "
                        + (f"verify refuses: {out.strip()}" if step is None else f"verify went back to step {step}"))
                if journal:
                    self.fail(what, state)
                else:
                    point, ops = state["at"]
                    self.fail(what + " [posix order only: ext4/xfs commit their journal in order]",
                              dict(state, model="posix", point=point, ops=ops), self.findings)
                return

    def committed(self, name, sig):
        return sig in self.m.committed.get(name, [])

    def verify(self, path):
        self.verifies += 1
        return run([self.a.strata, "checkpoint", "verify", path])

    def check(self, n, state):
        """Checks one state; returns its outcome. A failed state's tree is kept under --work."""
        root = os.path.join(self.a.work, f"s{n}", "root")
        materialize(state["sig"], root)
        failures = len(self.failures)
        outcome = self._check(root, state)
        if len(self.failures) == failures:
            shutil.rmtree(os.path.dirname(root))
        return outcome

    def _check(self, root, state):
        save, pre = os.path.join(root, self.a.save), self.a.save + "/" if self.a.save else ""
        rc, out = self.verify(save)
        names = {p[len(pre):] for p, d in state["sig"] if d is None and p.startswith(pre) and
                 fs_model.STEP_DIR.match(p[len(pre):])}
        if rc == 0:
            m = re.match(r"(.*): step (\d+),", out)
            name = os.path.basename(m.group(1)) if m else ""
            if name not in names or not self.committed(name, subtree(state["sig"], pre + name)):
                self.fail(f"verify accepted a checkpoint that was never committed ({name}): {out.strip()}", state)
            else:
                self.durability(int(m.group(2)), state, out)
            outcome = f"verifies at step {int(m.group(2))}" if m else "verifies"
        elif not clean_refusal(rc, out):
            self.fail(f"verify did not refuse cleanly (exit {rc}): {out.strip()[-600:]}", state)
            outcome = "unclean"
        else:
            self.durability(None, state, out)
            outcome = "refused: " + re.sub(r"'[^']*'|\d+", "_", out.strip().splitlines()[-1])[:100]
        for name in sorted(names):
            sub = subtree(state["sig"], pre + name)
            if not any(p == "manifest.json" for p, _ in sub) or self.committed(name, sub):
                continue
            key = (name, fs_model.digest(sub))
            if key not in self.step_dirs:
                self.step_dirs[key] = self.verify(os.path.join(save, name))
            rc2, out2 = self.step_dirs[key]
            if rc2 == 0:
                self.fail(f"{name} verifies but holds bytes no commit wrote: {out2.strip()}", state)
            elif not clean_refusal(rc2, out2):
                self.fail(f"verify of {name} did not refuse cleanly (exit {rc2}): {out2.strip()[-600:]}", state)
        return outcome

    def resume(self, outcome, state):
        self.resumes += 1
        root = os.path.join(self.a.work, f"resume{self.resumes}", "root")
        materialize(state["sig"], root)
        m = re.match(r"verifies at step (\d+)", outcome)
        steps = int(m.group(1)) + 1 if m else 1
        cmd = [self.a.strata, "train", *shlex.split(self.a.train), "--steps", str(steps), "--resume", "latest",
               "--save-dir", os.path.join(root, self.a.save), "--save-every", "1", "--keep", "2"]
        rc, out = run(cmd)
        if not m:
            if not clean_refusal(rc, out):
                self.fail(f"verify refused, but train --resume latest did not refuse cleanly (exit {rc}): "
                          f"{out.strip()[-600:]}", state)
            return
        if rc != 0 or f"continuing at step {steps}" not in out:
            self.fail(f"verify accepted step {steps - 1}, but train --resume latest failed (exit {rc}): "
                      f"{out.strip()[-600:]}", state)
            return
        rc, out = self.verify(os.path.join(root, self.a.save))
        if rc != 0 or f": step {steps}," not in out:
            self.fail(f"after resuming and saving step {steps} over the crash state, verify says: {out.strip()}",
                      state)


def crash_states(model, log):
    """Every distinct crash state of the recording, with the figures. A state's floor is the
    step it must verify at or after: the newest whose `latest` was durable, or the one a
    save had committed when it returned (when the next save begins, or the run ended)."""
    states, recent, fig, floor = {}, [], {"points": 0, "ops": 0, "total": 0, "journal": 0, "posix": 0}, None

    def add(point, kind, sig):
        fig["total"] += 1
        key = fs_model.digest(sig)
        if key not in states:
            fig[kind] += 1
            states[key] = {"model": kind, "sig": sig, "floor": None, "jfloor": None, "point": point,
                           "ops": list(recent)}
        st = states[key]
        if kind == "journal" and st["model"] == "posix":
            st.update(model="journal", point=point, ops=list(recent))
        if kind == "journal" and floor is not None and (st["jfloor"] is None or st["jfloor"] < floor):
            st.update(jfloor=floor, point=point, ops=list(recent))
        if floor is not None and (st["floor"] is None or st["floor"] < floor):
            # where a posix-order appearance needs more than any journal one: its point is shown
            st.update(floor=floor, at=(point, list(recent)))

    def at_least(step):
        return floor if step is None or (floor is not None and floor >= step) else step

    for point, op, m in fs_model.crash_points(model, log):
        fig["points"] += 1
        if op:
            fig["ops"] += 1
            recent = (recent + [op])[-4:]
            if re.match(r"\d+: mkdir\tROOT/(.*/)?\.step-\d+\.tmp$", op):
                floor = at_least(m.latest_step(durable=False))
        floor = at_least(m.latest_step(durable=True))
        for kind, sig in m.crash_states(CAP):
            add(point, kind, sig)
    floor = at_least(model.latest_step(durable=False))  # the run has ended: its last save returned
    for kind, sig in model.crash_states(CAP):
        add(fig["points"] - 1, kind, sig)
    return list(states.values()), fig


def main():
    ap = argparse.ArgumentParser()
    for flag in ("--strata", "--log", "--root", "--work", "--train"):
        ap.add_argument(flag, required=True)
    ap.add_argument("--initial", default="")
    ap.add_argument("--save", default="", help="the save directory, relative to --root (default: --root)")
    ap.add_argument("--resumes", type=int, default=6)
    ap.add_argument("--name", default="save")
    a = ap.parse_args()
    t0 = time.monotonic()
    model = fs_model.Model(a.root, a.initial, a.save)
    try:
        states, fig = crash_states(model, a.log)
    except fs_model.ModelError as e:
        print(f"FAIL: {a.name}: {e}")
        return 1
    final = model.signature(model.entries, 0, None)
    if final != disk_signature(a.root):
        print(f"FAIL: the recording replayed to its end is not the tree the run left in {a.root}:\n"
              f"  replayed:\n{describe(final)}\n  on disk:\n{describe(disk_signature(a.root))}")
        return 1
    print(f"{a.name}: {fig['ops']} recorded operations, {fig['points']} crash points, {fig['total']} crash states, "
          f"{len(states)} distinct ({fig['journal']} in journal order, {fig['posix']} more in posix order; "
          f"posix order skipped at {model.posix_skipped} crash points with over {fs_model.SUBSET_MAX} loose "
          "directory operations); "
          f"committed: {', '.join(f'{k} x{len(v)}' for k, v in sorted(model.committed.items()))}")
    if len(states) > MAX_STATES:
        print(f"FAIL: {len(states)} distinct crash states (at most {MAX_STATES} are checked): a save that fsyncs "
              "less leaves more; look for a missing fsync in the recording")
        return 1
    shutil.rmtree(a.work, ignore_errors=True)
    checker = Checker(a, model)
    sample, batch = {}, 2 * max(2, os.cpu_count() or 2)
    with concurrent.futures.ThreadPoolExecutor(batch // 2) as pool:
        for first in range(0, len(states), batch):
            if len(checker.failures) >= MAX_FAILURES:
                print(f"stopped after {len(checker.failures)} failures: {len(states) - first} states not checked")
                break
            chunk = states[first:first + batch]
            for outcome, state in zip(pool.map(lambda ns: checker.check(*ns), enumerate(chunk, first)), chunk):
                checker.outcomes[outcome] = checker.outcomes.get(outcome, 0) + 1
                # Per outcome, the state with the most entries: the resumed save clears the most.
                if outcome != "unclean" and (outcome in sample or len(sample) < a.resumes):
                    if outcome not in sample or len(state["sig"]) > len(sample[outcome]["sig"]):
                        sample[outcome] = state
    for outcome, state in sample.items():
        if len(checker.failures) < MAX_FAILURES:
            checker.resume(outcome, state)
    for outcome, count in sorted(checker.outcomes.items()):
        print(f"  {count:5d} states: {outcome}")
    for f in checker.findings[:MAX_FAILURES]:
        print(f.replace("FAIL: ", "FINDING: ", 1))
    if checker.findings:
        print("  directory operations no fsync made durable by the end of the run:\n    "
              + "\n    ".join(model.loose()))
    for f in checker.failures:
        print(f)
    print(f"{a.name}: replayed {len(states)} crash states at {fig['points']} crash points ({checker.verifies} verify "
          f"runs, {checker.resumes} resumed trainings) in {time.monotonic() - t0:.1f} s: "
          f"{len(checker.failures)} failures, {len(checker.findings)} states losing a commit in posix order only")
    if not checker.failures:
        shutil.rmtree(a.work, ignore_errors=True)
    # The save path fsyncs every directory it changes, its root's parent included, so a
    # commit lost even in posix order is a failure too.
    return 1 if checker.failures or checker.findings else 0


if __name__ == "__main__":
    sys.exit(main())
