"""The crash model: replays a record_fs.c log over an initial directory tree and lists, for
every crash point, the directory trees a power loss or kernel crash at that point may leave
under ext4 or xfs in their default (ordered / journalled-metadata) modes.

The model, conservative where the file systems document no guarantee:
  * A crash point k lies after the first k recorded operations (k = 0 .. all).
  * File data. The bytes of a file persist up to its last fsync/fdatasync; of the data
    operations (writes, truncations, O_TRUNC) made since, a crash keeps any prefix (none,
    some, all, in order), or the "null file" that xfs is known for: the size the file has
    now with every byte written since the fsync read back as zeros. Each file varies on
    its own (the product is enumerated).
  * Directory operations (create, mkdir, rename incl. RENAME_EXCHANGE, link, unlink, rmdir)
    are metadata, applied to directory inodes as entry changes (name -> inode or none). One
    is durable once every directory it changes has been fsynced after it. The others may
    be lost:
      - "journal" states: the metadata journal replays in order, so what persists is a
        prefix of all directory operations that contains every durable one (ext4/jbd2 and
        the xfs log commit in order);
      - "posix" states (beyond journal order; tried only where at most SUBSET_MAX operations
        are not durable): the durable ones plus any subset of the rest, in their order, as
        POSIX promises nothing across directories that were not fsynced.
    A directory or file made unreachable (its parent's entry lost) is not in the state.
  * A file's fsync does not make its own directory entry durable (ext4 does; POSIX and the
    model do not), and nothing persists that the recording did not write.
  * A file hard-linked in from outside the root (an NVMe swap file) holds the bytes it had
    when linked, unsynced until an fsync through a name under the root; linked again, it is
    the same inode and must hold the same bytes while a name under the root still has it.
A state is the tree reachable from the root: directories, and files with their bytes.
"""
import hashlib
import itertools
import os
import re

SUBSET_MAX = 10  # at most 2**SUBSET_MAX posix states per crash point
STEP_DIR = re.compile(r"step-\d+$")


class ModelError(Exception):
    """The recording cannot be replayed (an operation the model lacks, or a missed one)."""


class Model:
    def __init__(self, root, initial, save=""):
        self.root = root.rstrip("/")
        self.save = [p for p in save.split("/") if p]  # the save directory, under root
        self.kind = {0: "d"}  # inode -> "d" or "f"
        self.init_entries = {0: {}}  # directory inode -> {name: inode} before the run
        self.entries = {0: {}}  # the same, now
        self.base = {}  # file inode -> bytes before the run (durable)
        self.events = {}  # file inode -> [("w", offset, bytes) | ("t", length)]
        self.synced = {}  # file inode -> how many of its events are durable
        self.meta = []  # [log index, [(dir inode, name, inode or None)], dirs not yet fsynced]
        self.fds = {}  # fd -> inode
        self.committed = {}  # step directory name -> [tree signature as committed]
        self.next_ino = 1
        self.data = b""  # the recording's .data file
        self.posix_skipped = 0  # crash points with too many loose operations for posix states
        self.described = {}  # log index -> the operation, for reports
        self.external = {}  # "dev:ino" of a file linked in from outside the root -> inode
        self._variants = {}
        if initial:
            self._scan(initial, 0)
        for name, ino in self.entries.get(self._save_dir(self.entries), {}).items():
            if STEP_DIR.match(name) and self.kind[ino] == "d":
                self._commit(name, ino)

    def _save_dir(self, entries):
        """The save directory's inode in a tree, or None where it is absent."""
        ino = 0
        for p in self.save:
            ino = entries[ino].get(p) if self.kind[ino] == "d" else None
            if ino is None:
                return None
        return ino if self.kind[ino] == "d" else None

    # The initial tree, taken as durable as a whole (as after a sync).
    def _scan(self, path, dino):
        for name in sorted(os.listdir(path)):
            p = os.path.join(path, name)
            ino = self._new("d" if os.path.isdir(p) else "f")
            self.init_entries[dino][name] = self.entries[dino][name] = ino
            if self.kind[ino] == "d":
                self._scan(p, ino)
            else:
                with open(p, "rb") as f:
                    self.base[ino] = f.read()

    def _new(self, kind):
        ino = self.next_ino
        self.next_ino += 1
        self.kind[ino] = kind
        if kind == "d":
            self.init_entries[ino], self.entries[ino] = {}, {}
        else:
            self.base[ino], self.events[ino], self.synced[ino] = b"", [], 0
        return ino

    def _lookup(self, path, parent=False):
        """(directory inode, name) of path when parent, else its inode."""
        assert path == self.root or path.startswith(self.root + "/"), path
        parts = [p for p in path[len(self.root):].split("/") if p]
        dino = 0
        for p in parts[:-1]:
            dino = self.entries[dino][p]
        if parent:
            return dino, parts[-1]
        return self.entries[dino][parts[-1]] if parts else 0

    def _meta(self, index, effects):
        for d, name, ino in effects:
            if ino is None:
                self.entries[d].pop(name, None)
            else:
                self.entries[d][name] = ino
        self.meta.append([index, effects, {d for d, _, _ in effects}])

    def _commit(self, name, ino):
        self.committed.setdefault(name, []).append(self.signature(self.entries, ino, None))

    def apply(self, index, line):
        """Applies one log line; returns a short description for reports."""
        try:
            self._apply(index, line)
            self.described[index] = f"{index}: {line.strip()}".replace(self.root, "ROOT")
            return self.described[index]
        except (KeyError, IndexError) as e:
            raise ModelError(f"log line {index + 1} ({line.strip()}): {e} is not in the replayed tree "
                             "(the recording missed an operation)") from e

    def _apply(self, index, line):
        op, *a = line.rstrip("\n").split("\t")
        if op == "open":
            fd, path, created, truncated = int(a[0]), a[1], a[2] == "1", a[3] == "1"
            if created:
                d, name = self._lookup(path, True)
                ino = self._new("f")
                self._meta(index, [(d, name, ino)])
            else:
                ino = self._lookup(path)
            if truncated:
                self.events[ino].append(("t", 0))
            self.fds[fd] = ino
        elif op == "write":
            fd, off, length, at = (int(x) for x in a)
            self.events[self.fds[fd]].append(("w", off, self.data[at:at + length]))
        elif op == "trunc":
            self.events[self.fds[int(a[0])]].append(("t", int(a[1])))
        elif op == "truncpath":
            self.events[self._lookup(a[0])].append(("t", int(a[1])))
        elif op in ("fsync", "fdatasync"):
            ino = self.fds[int(a[0])]
            if self.kind[ino] == "f":
                self.synced[ino] = len(self.events[ino])
            for m in self.meta:
                m[2].discard(ino)
        elif op == "close":
            self.fds.pop(int(a[0]), None)
        elif op == "dup":
            self.fds[int(a[1])] = self.fds[int(a[0])]
        elif op == "mkdir":
            d, name = self._lookup(a[0], True)
            self._meta(index, [(d, name, self._new("d"))])
        elif op in ("unlink", "rmdir"):
            d, name = self._lookup(a[0], True)
            self._meta(index, [(d, name, None)])
        elif op == "rename":
            (d1, n1), (d2, n2) = self._lookup(a[0], True), self._lookup(a[1], True)
            i1, i2 = self.entries[d1][n1], self.entries[d2].get(n2)
            if int(a[2]) & 2:  # RENAME_EXCHANGE
                self._meta(index, [(d1, n1, i2), (d2, n2, i1)])
            elif (d1, n1) != (d2, n2):
                self._meta(index, [(d1, n1, None), (d2, n2, i1)])
            if d2 == self._save_dir(self.entries) and STEP_DIR.match(n2):
                self._commit(n2, i1)
        elif op == "link":
            d, name = self._lookup(a[1], True)
            ino = self._lookup(a[0]) if int(a[2]) < 0 else self._external(index, a[4], a[1],
                                                                         self.data[int(a[2]):int(a[2]) + int(a[3])])
            self._meta(index, [(d, name, ino)])
        else:
            raise ModelError(f"log line {index + 1}: cannot model '{line.strip()}'")

    def _external(self, index, key, path, data):
        """The inode of a file linked in from outside the root, holding `data` (unsynced). An
        inode linked before is the same one, and must not have changed while a name under
        the root still holds it (a checkpoint's bytes rewritten in place)."""
        ino = self.external.get(key)
        if ino is not None and self._linked(ino):
            if self.content(ino, len(self.events[ino])) != data:
                raise ModelError(f"log line {index + 1}: {path.replace(self.root, 'ROOT')} links inode {key} again, "
                                 "whose bytes changed since it was first linked under the root (a committed "
                                 "checkpoint's file was rewritten in place)")
            return ino
        ino = self.external[key] = self._new("f")
        self.events[ino].append(("w", 0, data))
        return ino

    def _linked(self, ino):
        return any(ino in e.values() for e in self.entries.values())

    def content(self, ino, kept, zero=False):
        """A file's bytes with its first `kept` events (and the rest as zeros if zero)."""
        b = bytearray(self.base[ino])
        for n, e in enumerate(self.events[ino]):
            if n >= kept and not zero:
                break
            if e[0] == "t":
                del b[e[1]:]
                b.extend(bytes(max(0, e[1] - len(b))))
            else:
                data = e[2] if n < kept else bytes(len(e[2]))
                b.extend(bytes(max(0, e[1] + len(data) - len(b))))
                b[e[1]:e[1] + len(data)] = data
        return bytes(b)

    def variants(self, ino):
        """The contents a crash may leave in a file (distinct), durable first."""
        ev, s = self.events[ino], self.synced[ino]
        key = (ino, s, len(ev))
        if key not in self._variants:
            out = [self.content(ino, p) for p in range(s, len(ev) + 1)]
            if s < len(ev):
                out.append(self.content(ino, s, zero=True))
            self._variants[key] = list(dict.fromkeys(out))
        return self._variants[key]

    def signature(self, entries, dino, contents, prefix=""):
        """The tree under dino as ((relative path, bytes or None for a directory), ...)."""
        out = []
        for name in sorted(entries[dino]):
            ino, path = entries[dino][name], prefix + name
            if self.kind[ino] == "d":
                out.append((path, None))
                out.extend(self.signature(entries, ino, contents, path + "/"))
            else:
                out.append((path, contents[ino] if contents else self.content(ino, len(self.events[ino]))))
        return tuple(out)

    def _tree(self, persisted):
        entries = {d: dict(e) for d, e in self.init_entries.items()}
        for m in persisted:
            for d, name, ino in self.meta[m][1]:
                if ino is None:
                    entries[d].pop(name, None)
                else:
                    entries[d][name] = ino
        return entries

    def _reachable_files(self, entries, dino=0, seen=None):
        seen = set() if seen is None else seen
        for ino in entries[dino].values():
            if ino in seen:
                continue
            seen.add(ino)
            if self.kind[ino] == "d":
                self._reachable_files(entries, ino, seen)
        return sorted(i for i in seen if self.kind[i] == "f")

    def crash_states(self, cap):
        """Yields (model, tree signature) for every state of a crash now (duplicates included)."""
        durable = [i for i, m in enumerate(self.meta) if not m[2]]
        loose = [i for i, m in enumerate(self.meta) if m[2]]
        first = durable[-1] + 1 if durable else 0
        sets = [("journal", list(range(j))) for j in range(first, len(self.meta) + 1)]
        if len(loose) > SUBSET_MAX:
            self.posix_skipped += 1
        else:
            for r in range(len(loose) + 1):
                for sub in itertools.combinations(loose, r):
                    persisted = sorted(durable + list(sub))
                    if persisted != list(range(len(persisted))) or len(persisted) < first:
                        sets.append(("posix", persisted))
        for kind, persisted in sets:
            entries = self._tree(persisted)
            files = self._reachable_files(entries)
            choices = [self.variants(i) for i in files]
            total = 1
            for c in choices:
                total *= len(c)
            if total > cap:
                raise RuntimeError(f"{total} data variants in one crash state (cap {cap}): record a smaller save")
            for pick in itertools.product(*choices):
                yield kind, self.signature(entries, 0, dict(zip(files, pick)))

    def loose(self):
        """The directory operations no fsync has made durable (so far)."""
        return [self.described[m[0]] for m in self.meta if m[2]]

    def latest_step(self, durable):
        """The step `latest` names now (durable: in the state where only what is durable
        persists), or None."""
        entries = self._tree([i for i, m in enumerate(self.meta) if not m[2]]) if durable else self.entries
        ino = entries.get(self._save_dir(entries), {}).get("latest")
        if ino is None or self.kind[ino] != "f":
            return None
        m = re.match(rb"step-(\d+)\n?$", self.content(ino, self.synced[ino] if durable else len(self.events[ino])))
        return int(m.group(1)) if m else None


def crash_points(model, log_path):
    """Applies the log; yields (crash point, last operation or None, model) before and after each."""
    with open(log_path + ".data", "rb") as f:
        model.data = f.read()
    yield 0, None, model
    with open(log_path) as f:
        for index, line in enumerate(f):
            yield index + 1, model.apply(index, line), model


def digest(signature):
    h = hashlib.sha256()
    for path, data in signature:
        h.update(path.encode() + b"\0" + (b"D" if data is None else b"F" + hashlib.sha256(data).digest()))
    return h.hexdigest()
