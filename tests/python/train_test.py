"""strata.train (the C API's strata_train, train/c_train.h) runs the trainer `strata train` runs:
the same options give the same bytes of --save-params and the same per-step losses, plain and
pipelined, alone and as two ranks of `strata launch`; bad options raise StrataError naming the
key (unknown, wrong type, out of range, for the other model, a pipeline key without stages, no
config). strata.plan (strata_plan) searches what `strata plan --json` searches: the same
candidates fit, with the same bytes per step and peaks (the pass profiled in process, so the
times are its own), its best config trains through strata.train, and a budget nothing fits is
refused naming the smallest that would. strata.calibrate (strata_calibrate) writes a
calibration file with every rate positive that strata.plan reads. Needs no torch."""
import json
import os
import subprocess
import sys
import tempfile

import strata

STRATA = os.environ["STRATA_BIN"]
checks = {"passed": 0, "failed": 0}


def check(cond, what):
    checks["passed" if cond else "failed"] += 1
    if not cond:
        print("FAILED:", what, file=sys.stderr)


def raises(options, text, what):
    try:
        strata.train(**options)
    except strata.StrataError as e:
        check(text in str(e), f"{what}: message {str(e)!r} lacks {text!r}")
        return
    check(False, f"{what}: no StrataError")


def flags(options):
    out = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is not False:
            out += [flag, str(value)]
    return out


def losses(path):
    with open(path) as f:
        return [json.loads(line)["loss"] for line in f]


def same_run(tmp, name, options, launch=0):
    """The options through Python and through the command, each writing its own outputs."""
    outs = {}
    for how in ("python", "cli"):
        o = dict(options, save_params=f"{tmp}/{name}-{how}.safetensors", log_json=f"{tmp}/{name}-{how}.jsonl")
        if how == "python" and not launch:
            strata.train(**o)
        elif how == "python":
            code = f"import strata; strata.train(**{o!r})"
            subprocess.run([STRATA, "launch", "-n", str(launch), "--", sys.executable, "-c", code], check=True,
                           stdout=subprocess.DEVNULL)
        else:
            cmd = [STRATA, "train"] + flags(o)
            if launch:
                cmd = [STRATA, "launch", "-n", str(launch), "--"] + cmd
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        with open(o["save_params"], "rb") as f:
            outs[how] = (f.read(), losses(o["log_json"]))
    check(len(outs["python"][1]) == options["steps"], f"{name}: {len(outs['python'][1])} logged steps")
    check(outs["python"][1] == outs["cli"][1], f"{name}: losses {outs['python'][1]} != {outs['cli'][1]}")
    check(outs["python"][0] == outs["cli"][0], f"{name}: --save-params bytes differ from strata train's")


# A calibration file as `strata bench calibrate` writes it (a fixture: which candidates fit and
# what they move do not depend on the rates, only their predicted times do).
CALIBRATION = {"format": "strata-calibration-1", "host": "fixture", "threads": 2, "adam_params_per_s": 1.7e9,
               "gemm_bf16_flops": 3.9e11, "gemm_fp32_flops": 2.6e11, "grad_path_ns_per_elem": 2.3,
               "h2d_gbps": 7.0, "d2h_gbps": 7.3, "nvme_read_gbps": 1.6, "nvme_write_gbps": 2.3, "nvme_mixed_gbps": 2.0,
               "reduce_scatter_busbw_gbps": 0.28, "all_gather_busbw_gbps": 1.6, "all_reduce_busbw_gbps": 0.9}
FIXED = ("h2d_bytes_per_step", "d2h_bytes_per_step", "nvme_read_bytes_per_step", "nvme_write_bytes_per_step",
         "device_peak", "host_peak", "nvme_peak", "config")


def check_plan(tmp, data):
    cal = f"{tmp}/cal.json"
    with open(cal, "w") as f:
        json.dump(CALIBRATION, f)
    shape = {"model": "gpt", "layers": 2, "heads": 2, "d_model": 32, "seq_len": 32, "vocab": 256}
    opts = dict(shape, budget="device=1MiB,host=256MiB", calibration=cal, iters=1, batch=4)  # 35 of 54 fit
    got = strata.plan(**opts)
    cli = json.loads(subprocess.run([STRATA, "plan"] + flags(opts) + ["--json", "--top", "100000"], check=True,
                                    capture_output=True, text=True).stdout)
    for key in ("fitting", "candidates", "batch", "world"):
        check(got[key] == cli[key], f"plan: {key} {got[key]} != strata plan's {cli[key]}")
    mine = {c["label"]: c for c in got["best"]}
    theirs = {c["label"]: c for c in cli["best"]}
    check(len(mine) == got["fitting"] and set(mine) == set(theirs), f"plan: candidates {sorted(mine)} != {sorted(theirs)}")
    for label in set(mine) & set(theirs):
        for key in FIXED:
            check(mine[label][key] == theirs[label][key], f"plan: {label}: {key} differs from strata plan's")
    times = [c["step_ms"] for c in got["best"]]
    check(times == sorted(times) and times[0] > 0, f"plan: step times {times} not fastest first")
    best = f"{tmp}/best.json"
    with open(best, "w") as f:
        json.dump(got["best"][0]["config"], f)
    strata.train(**dict(shape, config=best, data=data, steps=2, val_fraction=0, quiet=True,
                        log_json=f"{tmp}/best.jsonl"))
    check(len(losses(f"{tmp}/best.jsonl")) == 2, "plan: its best config did not train two steps")
    try:
        strata.plan(**dict(opts, budget="device=64KiB,host=64KiB"))
        check(False, "plan: a budget nothing fits was accepted")
    except strata.StrataError as e:
        check("raise --budget to" in str(e) or "raise several" in str(e), f"plan: refusal {str(e)!r}")
    raises_plan = [({k: v for k, v in opts.items() if k != "budget"}, "'budget'"),
                   (dict(opts, steps=3), "plan option 'steps' is not one of Strata's")]
    for bad, text in raises_plan:
        try:
            strata.plan(**bad)
            check(False, f"plan: {bad} accepted")
        except strata.StrataError as e:
            check(text in str(e), f"plan: message {str(e)!r} lacks {text!r}")


def check_calibrate(tmp):
    out = f"{tmp}/measured.json"
    strata.calibrate(nvme=f"{tmp}/nvme", out=out, quick=True)  # bin/strata beside the library
    with open(out) as f:
        cal = json.load(f)
    # Rates are positive; the gradient path is a time per element beyond the optimizer's, which
    # a loaded machine can measure as 0 (the calibration format allows it), never below.
    rates = [k for k in CALIBRATION if k not in ("format", "host", "threads", "grad_path_ns_per_elem")]
    check(all(cal.get(k, 0) > 0 for k in rates), f"calibrate: a rate missing or not positive: {cal}")
    check(cal.get("grad_path_ns_per_elem", -1) >= 0, f"calibrate: the gradient path's time is missing or negative: {cal}")
    got = strata.plan(model="gpt", layers=2, heads=2, d_model=32, seq_len=32, vocab=256,
                      budget="device=64MiB,host=256MiB", calibration=out, iters=1, batch=4)
    check(got["fitting"] > 0, "calibrate: the plan fits nothing with the measured rates")
    for bad, text in [({"out": out}, "'nvme'"), ({"nvme": tmp, "strata": f"{tmp}/no-strata"}, "no-strata")]:
        try:
            strata.calibrate(**bad)
            check(False, f"calibrate: {bad} accepted")
        except strata.StrataError as e:
            check(text in str(e), f"calibrate: message {str(e)!r} lacks {text!r}")


def main():
    with tempfile.TemporaryDirectory(dir=os.environ.get("STRATA_TEST_TMPDIR", "/var/tmp")) as tmp:
        cfg = f"{tmp}/ds.json"
        with open(cfg, "w") as f:
            json.dump({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "gradient_clipping": 1.0,
                       "bf16": {"enabled": True}, "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
                       "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}, f)
        data = f"{tmp}/text.txt"
        with open(data, "w") as f:
            for i in range(400):
                f.write(f"line {i * 7919 % 1000}: the quick brown fox jumps over {i % 13} lazy dogs\n")
        gpt = {"model": "gpt", "config": cfg, "data": data, "layers": 2, "heads": 2, "d_model": 32, "seq_len": 32,
               "vocab": 256, "steps": 4, "val_fraction": 0, "seed": 5, "quiet": True, "device_budget": "64MiB"}
        same_run(tmp, "gpt", gpt)
        same_run(tmp, "gpt-pipelined", dict(gpt, pipeline_stages=2, schedule="zb-h1"))
        same_run(tmp, "gpt-two-ranks", gpt, launch=2)

        check_plan(tmp, data)
        check_calibrate(tmp)

        raises(dict(gpt, bogus=1), "training option 'bogus' is not one of Strata's", "an unknown key")
        raises(dict(gpt, steps="4"), "'steps' takes a whole number", "a string for a number")
        raises(dict(gpt, steps=0), "'steps' is 0, outside 1..", "a step count out of range")
        raises(dict(gpt, model="mlp"), "'heads' applies to 'model' gpt only", "a GPT key for the MLP")
        raises(dict(gpt, schedule="1f1b"), "'schedule' needs 'pipeline_stages'", "a pipeline key alone")
        raises(dict(gpt, verbose=True), "'quiet' and 'verbose' exclude each other", "quiet and verbose")
        raises(dict(gpt, seed=-1), "'seed' takes a whole number of at least 0", "a negative seed")
        raises({k: v for k, v in gpt.items() if k != "config"}, "'config'", "no config")
        raises(dict(gpt, config=f"{tmp}/missing.json"), "missing.json", "a config that is not there")
    print(f"{checks['passed']} checks passed, {checks['failed']} failed")
    sys.exit(1 if checks["failed"] else 0)


main()
