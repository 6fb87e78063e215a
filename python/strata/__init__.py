"""Strata from Python: the engine's C API (engine/strata.h, libstrata_c.so) through ctypes.

ctypes rather than pybind11: the C API already is Strata's stable boundary for other
languages, ctypes ships with Python, and nothing needs compiling against a particular
Python or torch; the library is found in STRATA_LIBRARY, else in the build tree beside this
package (build/lib/libstrata_c.so). Every call that fails raises StrataError with Strata's
message. `strata.torch.initialize` puts a torch model under the engine. Views are copies that
the release of their layer invalidates (View says why); abandon_step() drops a failed step.
`strata.train(...)` runs Strata's own trainer (the GPT, the Llama family, the MLP) as
`strata train` does; `strata.plan(...)` and `strata.calibrate(...)` are `strata plan` and
`strata bench calibrate`.
"""
import ctypes
import json
import os

import numpy as np

__all__ = ["Engine", "StrataError", "calibrate", "library_path", "plan", "train"]


class StrataError(RuntimeError):
    """A Strata call failed; the message names what was wrong and what to do."""


def library_path():
    env = os.environ.get("STRATA_LIBRARY")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.normpath(os.path.join(here, "..", "..", "build", "lib", "libstrata_c.so"))


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("numel", ctypes.c_size_t),
                ("name", ctypes.c_char_p)]


class _StepResult(ctypes.Structure):
    _fields_ = [("step", ctypes.c_int64), ("skipped", ctypes.c_int), ("grad_norm", ctypes.c_double),
                ("loss_scale", ctypes.c_double), ("lr", ctypes.c_float)]


class _Tier(ctypes.Structure):
    _fields_ = [(k, ctypes.c_uint64) for k in ("used_bytes", "peak_bytes", "budget_bytes", "params_bytes",
                                               "grads_bytes", "optimizer_bytes", "buffers_bytes")]


class _Memory(ctypes.Structure):
    _fields_ = [("device", _Tier), ("host", _Tier), ("nvme", _Tier)]


class _Io(ctypes.Structure):
    _fields_ = [("h2d_bytes", ctypes.c_uint64), ("d2h_bytes", ctypes.c_uint64), ("nvme_read_bytes", ctypes.c_uint64),
                ("nvme_write_bytes", ctypes.c_uint64), ("io_wait_seconds", ctypes.c_double),
                ("step_seconds", ctypes.c_double)]


_READER = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint64, ctypes.c_uint64,
                           ctypes.POINTER(ctypes.c_float))
_lib = None


def _load():
    global _lib
    if _lib is not None:
        return _lib
    path = library_path()
    if not os.path.exists(path):
        raise StrataError(f"the Strata library '{path}' does not exist: build it (scripts/test.sh or "
                          f"cmake --build build --target strata_c) or point STRATA_LIBRARY at libstrata_c.so")
    lib = ctypes.CDLL(path)
    P, I, U64, S = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_size_t
    sigs = {
        "strata_engine_create_for_model": [ctypes.c_char_p, ctypes.c_char_p, U64, U64, U64, ctypes.c_int64,
                                           ctypes.POINTER(P)],
        "strata_register_param": [P, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int64), I, I, I, ctypes.c_float],
        "strata_freeze_layer": [P, I],
        "strata_offload_states": [P, ctypes.POINTER(U64)], "strata_reload_states": [P, ctypes.POINTER(U64)],
        "strata_setup": [P], "strata_begin_step": [P], "strata_synchronize": [P],
        "strata_begin_eval": [P], "strata_end_eval": [P],
        "strata_gather": [P, I, ctypes.POINTER(_Tensor), S, ctypes.POINTER(S)],
        "strata_grad_buffers": [P, I, ctypes.POINTER(_Tensor), S, ctypes.POINTER(S)],
        "strata_release": [P, I], "strata_reduce_grads": [P, I],
        "strata_step": [P, ctypes.POINTER(_StepResult)], "strata_abandon_step": [P],
        "strata_memory": [P, ctypes.POINTER(_Memory)], "strata_io_stats": [P, ctypes.POINTER(_Io)],
        "strata_full_parameters": [P, ctypes.POINTER(ctypes.c_float), S, ctypes.POINTER(S)],
        "strata_layer_parameters": [P, I, ctypes.POINTER(ctypes.c_float), S, ctypes.POINTER(S)],
        "strata_save": [P, ctypes.c_char_p, ctypes.c_char_p, I],
        "strata_load": [P, ctypes.c_char_p, ctypes.c_char_p, S],
        "strata_loaded_trainer_state": [P, ctypes.c_char_p, S, ctypes.POINTER(S)],
        "strata_init_weights": [P, _READER, P], "strata_write_weights": [P, _READER, P, I],
        "strata_train": [ctypes.c_char_p], "strata_calibrate": [ctypes.c_char_p],
        "strata_plan": [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)],
        "strata_write_hf_dir": [ctypes.c_char_p, ctypes.c_char_p, S, ctypes.POINTER(ctypes.c_char_p),
                                ctypes.POINTER(ctypes.POINTER(ctypes.c_int64)), ctypes.POINTER(I), ctypes.c_char_p,
                                U64, _READER, P],
    }
    for name, args in sigs.items():
        f = getattr(lib, name)
        f.argtypes, f.restype = args, I
    lib.strata_last_error.restype = ctypes.c_char_p
    lib.strata_engine_destroy.argtypes, lib.strata_engine_destroy.restype = [P], None
    lib.strata_free_text.argtypes, lib.strata_free_text.restype = [P], None
    for name in ("strata_rank", "strata_world_size", "strata_states_offloaded"):
        getattr(lib, name).argtypes, getattr(lib, name).restype = [P], I
    lib.strata_loss_scale.argtypes, lib.strata_loss_scale.restype = [P], ctypes.c_float
    lib.strata_accumulation_steps.argtypes, lib.strata_accumulation_steps.restype = [P], ctypes.c_int64
    lib.strata_compute_dtype.argtypes, lib.strata_compute_dtype.restype = [P], I
    _lib = lib
    return lib


def _check(status):
    if status != 0:
        raise StrataError(_load().strata_last_error().decode())


_NP_DTYPES = {0: np.float32, 1: np.int16, 2: np.float16}  # bf16 travels as its 16 bits
DTYPE_NAMES = {0: "fp32", 1: "bf16", 2: "fp16"}
_INITS = {"normal": 0, "uniform": 1, "zeros": 2, "ones": 3, "constant": 4}


def _with_reader(read, call):
    """call(callback) with read(name, elem, count) -> float32 values as the C API's weight reader;
    a failed call raises StrataError with the library's message and the reader's own error."""
    failure = []

    def reader(_user, name, elem, count, out):
        try:
            values = np.ascontiguousarray(read(name.decode(), elem, count), dtype=np.float32)
            if values.size != count:
                raise ValueError(f"{values.size} values for {count}")
            ctypes.memmove(out, values.ctypes.data, count * 4)
            return 0
        except Exception as e:  # reported through Strata's error, naming the tensor
            failure.append(e)
            return 1

    status = call(_READER(reader))
    if status != 0:
        message = _load().strata_last_error().decode()
        raise StrataError(message + (f": {failure[0]!r}" if failure else ""))


def train(**options):
    """Runs Strata's trainer as `strata train` does (train/c_train.h): each keyword is one of
    its long flags with '_' for '-', e.g. train(model="gpt", config="ds.json", data="corpus.txt",
    steps=100, save_dir="ckpt", quiet=True). Progress goes to stdout; the run's outputs are the
    files its options name (log_json, save_params, save_dir, trace). Returns when it has ended;
    raises StrataError naming the option, file or rank at fault."""
    _check(_load().strata_train(json.dumps(options).encode()))


def plan(**options):
    """`strata plan` as a call (train/c_train.h): each keyword is one of its long flags with '_'
    for '-', e.g. plan(model="gpt", preset="124M", seq_len=1024, budget="device=8GiB,host=64GiB",
    calibration="strata-calibration.json"). The pass is profiled in this process. Returns a dict:
    "fitting", "candidates", "batch", "world" and "best", every fitting candidate fastest first
    (its "config" runnable with train()); raises StrataError naming the option, or the smallest
    budget per tier that would fit."""
    lib = _load()
    out = ctypes.c_void_p()
    _check(lib.strata_plan(json.dumps(options).encode(), ctypes.byref(out)))
    try:
        return json.loads(ctypes.string_at(out.value).decode())
    finally:
        lib.strata_free_text(out)


def calibrate(**options):
    """`strata bench calibrate` as a call (train/c_train.h): nvme= (a directory on the NVMe
    device), out= (the file plan() reads; default strata-calibration.json), quick=, and strata=
    (the `strata` executable whose benches measure; default bin/strata beside the library)."""
    _check(_load().strata_calibrate(json.dumps(options).encode()))


def write_hf_dir(out_dir, config_json, tensors, read, dtype="bf16", max_shard_bytes=5 * 10 ** 9):
    """A Hugging Face model directory at out_dir (config.json from the JSON text config_json;
    model.safetensors or shards of at most max_shard_bytes with their index), complete or not
    there at all: `tensors` [(name, shape)] in order, their values from read(name, elem, count)
    -> float32 numpy array, written as dtype ("fp32", "bf16", "fp16"). Returns out_dir."""
    lib = _load()
    names = (ctypes.c_char_p * len(tensors))(*[n.encode() for n, _ in tensors])
    dims = [(ctypes.c_int64 * max(1, len(shape)))(*shape) for _, shape in tensors]
    shapes = (ctypes.POINTER(ctypes.c_int64) * len(tensors))(*[ctypes.cast(d, ctypes.POINTER(ctypes.c_int64))
                                                               for d in dims])
    ndims = (ctypes.c_int * len(tensors))(*[len(shape) for _, shape in tensors])
    _with_reader(read, lambda callback: lib.strata_write_hf_dir(
        str(out_dir).encode(), config_json.encode(), len(tensors), names, shapes, ndims, dtype.encode(),
        int(max_shard_bytes), callback, None))
    return str(out_dir)


class View:
    """A parameter or gradient buffer of one layer: `array` is a numpy array that the View owns,
    filled from the engine's buffer at gather() / grad_buffers(); a gradient view's array is
    written back into the engine's buffer at reduce_grads().

    A copy, not a zero-copy view of the engine's memory, because nothing else is sound: the
    engine hands a released buffer's address to its next allocation at once (the next layer's
    gather, a gradient buffer) and unmaps all of its memory when it closes, and a numpy array
    or torch tensor over that memory cannot be revoked once handed out (a slice, np.asarray or
    torch.from_numpy keeps the raw pointer), so no check could stop a stale write from
    corrupting another layer or killing the interpreter. Checks guard the View itself: once
    its layer is released (release, reduce_grads, abandon_step, close) `array` raises
    StrataError naming what released it, and the array is made read-only, so a write through
    it raises ValueError; an alias taken before (a slice) only ever reaches Python's own
    memory, which the engine no longer reads. The cost: one host copy of the layer per gather
    and per gradient buffer (small beside the forward and backward it serves), and that
    memory beside the engine's budget while Python holds it."""

    def __init__(self, t):
        self.name = t.name.decode()
        self.dtype = DTYPE_NAMES[t.dtype]
        self._array = np.empty(t.numel, dtype=_NP_DTYPES[t.dtype])
        if t.numel:
            ctypes.memmove(self._array.ctypes.data, t.data, self._array.nbytes)
        self._address = t.data  # the engine's buffer, valid until the layer is released
        self._released = None

    @property
    def array(self):
        if self._released is not None:
            raise StrataError(f"the view of '{self.name}' is no longer valid: {self._released}; gather the "
                              f"layer again for a current one")
        return self._array

    def _write_back(self):
        if self._array.size:
            ctypes.memmove(self._address, self._array.ctypes.data, self._array.nbytes)

    def _invalidate(self, why):
        self._released = why
        self._address = None
        self._array.flags.writeable = False


class Engine:
    """One rank's ZeRO engine (the host-trainer contract of docs/design.md). `config` is a
    DeepSpeed-style JSON file path or a dict. Under `strata launch` it joins the other ranks.
    hidden_size and total_steps (0: not known) fill the config's "auto" values that depend on
    them, as the Hugging Face trainer does (zero_optimization's bucket sizes, the scheduler's
    total_num_steps)."""

    def __init__(self, config, device="host", device_budget=0, seed=0, hidden_size=0, total_steps=0):
        lib = _load()
        self._tmp = None
        if isinstance(config, dict):
            import tempfile
            fd, self._tmp = tempfile.mkstemp(prefix="strata-config-", suffix=".json")
            with os.fdopen(fd, "w") as f:
                json.dump(config, f)
            config = self._tmp
        self._h = ctypes.c_void_p()
        try:
            _check(lib.strata_engine_create_for_model(str(config).encode(), device.encode(), int(device_budget),
                                                      int(seed), int(hidden_size), int(total_steps),
                                                      ctypes.byref(self._h)))
        finally:
            if self._tmp:
                os.unlink(self._tmp)
                self._tmp = None
        self._lib = lib
        self._device = device
        self._counts = {}  # layer -> parameters registered (the views a gather returns)
        self._gathered = {}  # layer -> [gathers not released, their views]
        self._grad_views = {}  # layer -> the gradient views handed out and not reduced

    @property
    def _handle(self):
        h = getattr(self, "_h", None)
        if h is None or not h.value:
            raise StrataError("the engine was closed (close()): make a new Engine")
        return h

    def _invalidate_all(self, why):
        """Every view handed out (parameters and gradients of every layer) becomes invalid."""
        for _, views in self._gathered.values():
            for v in views:
                v._invalidate(why)
        for views in self._grad_views.values():
            for v in views:
                v._invalidate(why)
        self._gathered, self._grad_views = {}, {}

    @property
    def closed(self):
        """Whether close() has run (every other call then raises StrataError)."""
        h = getattr(self, "_h", None)
        return h is None or not h.value

    def close(self):
        """Frees the engine now (its memory, swap files and lock on nvme_path); every view it
        handed out becomes invalid. Later calls raise StrataError."""
        if getattr(self, "_h", None) and self._h.value:
            self._invalidate_all("the engine was closed (close())")
            self._lib.strata_engine_destroy(self._h)
            self._h = ctypes.c_void_p()

    def __del__(self):
        self.close()

    def register(self, name, shape, layer, init="zeros", scale=0.0):
        dims = (ctypes.c_int64 * len(shape))(*shape)
        _check(self._lib.strata_register_param(self._handle, name.encode(), dims, len(shape), int(layer), _INITS[init],
                                               float(scale)))
        self._counts[int(layer)] = self._counts.get(int(layer), 0) + 1

    def freeze(self, layer):
        """Before setup(): the layer takes no gradient and holds no optimizer state (a frozen base
        under LoRA adapters); it is gathered and released as any other."""
        _check(self._lib.strata_freeze_layer(self._handle, int(layer)))

    def setup(self):
        _check(self._lib.strata_setup(self._handle))

    @property
    def states_offloaded(self):
        """Whether offload_states() moved the states off the device and reload_states() has not run."""
        return bool(self._lib.strata_states_offloaded(self._handle))

    def offload_states(self):
        """Between steps: every byte the engine holds on the device to host RAM (the device's memory
        free for other work); returns the bytes moved. Views handed out become invalid."""
        self._invalidate_all("offload_states() moved the engine's states off the device")
        n = ctypes.c_uint64()
        _check(self._lib.strata_offload_states(self._handle, ctypes.byref(n)))
        return n.value

    def reload_states(self):
        """The states offload_states() moved, back on the device bit for bit; returns the bytes moved."""
        n = ctypes.c_uint64()
        _check(self._lib.strata_reload_states(self._handle, ctypes.byref(n)))
        return n.value

    def begin_step(self):
        _check(self._lib.strata_begin_step(self._handle))

    def _views(self, fn, layer):
        if self._device != "host":
            raise StrataError(f"views are read by the CPU: gather() and grad_buffers() need device='host' (this "
                              f"engine is on '{self._device}', whose views are device memory: use the C API)")
        capacity = self._counts.get(int(layer), 1)
        out = (_Tensor * capacity)()
        n = ctypes.c_size_t()
        _check(fn(self._handle, int(layer), out, capacity, ctypes.byref(n)))
        return [View(out[i]) for i in range(n.value)]

    def begin_eval(self):
        _check(self._lib.strata_begin_eval(self._handle))

    def end_eval(self):
        _check(self._lib.strata_end_eval(self._handle))

    def gather(self, layer):
        """The layer's parameters as Views (copies: see View), valid until the layer's last
        gather is released."""
        views = self._views(self._lib.strata_gather, layer)
        entry = self._gathered.setdefault(int(layer), [0, []])
        entry[0] += 1
        entry[1].extend(views)
        return views

    def grad_buffers(self, layer):
        """The layer's gradient buffers as Views, zeroed; what is written into their arrays goes to
        the engine at reduce_grads(layer). Asked again before that, the same Views."""
        if int(layer) in self._grad_views:
            return list(self._grad_views[int(layer)])
        views = self._views(self._lib.strata_grad_buffers, layer)
        self._grad_views[int(layer)] = views
        return list(views)

    def release(self, layer):
        _check(self._lib.strata_release(self._handle, int(layer)))
        entry = self._gathered.get(int(layer))
        if entry is not None:
            entry[0] -= 1
            if entry[0] <= 0:
                self._gathered.pop(int(layer))
                for v in entry[1]:
                    v._invalidate(f"layer {int(layer)} was released (release({int(layer)}))")

    def reduce_grads(self, layer):
        for v in self._grad_views.get(int(layer), ()):
            v._write_back()
        _check(self._lib.strata_reduce_grads(self._handle, int(layer)))
        for v in self._grad_views.pop(int(layer), ()):
            v._invalidate(f"layer {int(layer)}'s gradients were reduced (reduce_grads({int(layer)}))")

    def abandon_step(self):
        """Drops the step (or evaluation) in progress, for a trainer whose forward or backward
        failed: every gather is released, gradient buffers are dropped, the step's gradients
        are discarded, nothing is updated; the next begin_step() starts afresh. Every view of
        the step becomes invalid. Outside a step or evaluation it does nothing."""
        try:
            _check(self._lib.strata_abandon_step(self._handle))
        finally:
            self._invalidate_all("the step was abandoned (abandon_step())")

    def step(self):
        r = _StepResult()
        _check(self._lib.strata_step(self._handle, ctypes.byref(r)))
        return {"step": r.step, "skipped": bool(r.skipped), "grad_norm": r.grad_norm, "loss_scale": r.loss_scale,
                "lr": r.lr}

    def loss_scale(self):
        return float(self._lib.strata_loss_scale(self._handle))

    @property
    def accumulation_steps(self):
        """Micro-batches per optimizer step, as the config resolved it."""
        return int(self._lib.strata_accumulation_steps(self._handle))

    @property
    def compute_dtype(self):
        """"fp32", "bf16" or "fp16", as the config resolved it."""
        return DTYPE_NAMES[self._lib.strata_compute_dtype(self._handle)]

    @property
    def rank(self):
        return self._lib.strata_rank(self._handle)

    @property
    def world_size(self):
        return self._lib.strata_world_size(self._handle)

    def memory(self):
        m = _Memory()
        _check(self._lib.strata_memory(self._handle, ctypes.byref(m)))
        return {tier: {k: getattr(getattr(m, tier), k) for k, _ in _Tier._fields_}
                for tier in ("device", "host", "nvme")}

    def io_stats(self):
        s = _Io()
        _check(self._lib.strata_io_stats(self._handle, ctypes.byref(s)))
        return {k: getattr(s, k) for k, _ in _Io._fields_}

    def synchronize(self):
        _check(self._lib.strata_synchronize(self._handle))

    def full_parameters(self):
        n = ctypes.c_size_t()
        self._lib.strata_full_parameters(self._handle, None, 0, ctypes.byref(n))  # asks for the size
        out = np.empty(n.value, dtype=np.float32)
        _check(self._lib.strata_full_parameters(self._handle, out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
                                                out.size, ctypes.byref(n)))
        return out

    def layer_parameters(self, layer, count):
        """Layer `layer`'s fp32 values (its parameters in registration order; `count` of them),
        read a layer at a time. Collective."""
        out = np.empty(count, dtype=np.float32)
        n = ctypes.c_size_t()
        _check(self._lib.strata_layer_parameters(self._handle, int(layer), out.ctypes.data_as(
            ctypes.POINTER(ctypes.c_float)), out.size, ctypes.byref(n)))
        return out

    def save(self, root, trainer_state=None, keep=0):
        _check(self._lib.strata_save(self._handle, str(root).encode(), json.dumps(trainer_state or {}).encode(),
                                     int(keep)))

    def load(self, path):
        _check(self._lib.strata_load(self._handle, str(path).encode(), None, 0))
        size = ctypes.c_size_t()
        _check(self._lib.strata_loaded_trainer_state(self._handle, None, 0, ctypes.byref(size)))
        buf = ctypes.create_string_buffer(size.value)  # a trainer state of any size
        _check(self._lib.strata_loaded_trainer_state(self._handle, buf, len(buf), ctypes.byref(size)))
        return json.loads(buf.value.decode())

    def init_weights(self, read):
        """Right after setup(): read(name, elem, count) -> float32 numpy array of `count` values of
        tensor `name`; the moments start at zero."""
        self._weights(self._lib.strata_init_weights, read)

    def write_weights(self, read, source_rank=-1):
        """Between steps: every tensor's new values from read(name, elem, count), as init_weights
        asks for them; the optimizer moments and step counters are kept. Collective. source_rank
        >= 0: only that rank's read is called, its values broadcast; -1: each rank's own."""
        _with_reader(read, lambda callback: self._lib.strata_write_weights(self._handle, callback, None,
                                                                           int(source_rank)))

    def _weights(self, fn, read):
        _with_reader(read, lambda callback: fn(self._handle, callback, None))
