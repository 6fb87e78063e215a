#!/usr/bin/env bash
# scripts/gpu_check.sh and scripts/gpu_report.py without a GPU (they exist for the GPU minutes
# that are scarce, so a mistake in them must show up here first): the dry-run plan lists
# every suite that has [cuda] tests and each benchmark within the budget; bad arguments, a
# build without binaries and a machine without a GPU are refused with their exit codes and
# messages; the report of the committed sample (tests/tools/gpu_report_sample.json, shaped as
# gpu_check_collect.py writes it) has every target line and "not measured" for the figure
# the sample lacks, and a malformed report is refused; the collector reads a bench's JSON
# among warnings and a failing Catch2 summary. scripts/gpu_carry.sh packs the stripped
# binaries with the libraries a bare machine lacks and never the C runtime or CUDA's (the GPU
# machine's own), and refuses a run without a pack or an output folder;
# `strata bench adam --device host` gives its figures (the GPU check's AdamW step runs it on
# cuda).
# Usage: gpu_check_test.sh BUILD_DIR (the directory whose bin/ holds strata and the test suites)
set -euo pipefail
build=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
check=$root/scripts/gpu_check.sh report=$root/scripts/gpu_report.py sample=$here/gpu_report_sample.json
fail() { echo "FAIL: $*" >&2; exit 1; }
# refused WHAT CODE MESSAGE COMMAND...: COMMAND exits CODE and its output says MESSAGE.
refused() {
  local what=$1 code=$2 want=$3 rc=0 out
  shift 3
  out=$("$@" 2>&1) || rc=$?
  [ "$rc" = "$code" ] || fail "$what: exit $rc, not $code: $out"
  grep -q -- "$want" <<<"$out" || fail "$what: the message does not say '$want': $out"
  echo "ok: $what: exit $code, '$want'"
}
dir=$(mktemp -d "${STRATA_TEST_TMPDIR:-/var/tmp}/strata-gpu-check-test-XXXXXX")
trap 'rm -rf "$dir"' EXIT

# The plan: each suite with [cuda] cases (found here through --list-tags, not the script's
# own listing) and each benchmark, with a budget, within --budget-seconds.
plan=$("$check" --dry-run --build "$build" --out "$dir/out") || fail "dry run: $plan"
[ ! -e "$dir/out" ] || fail "the dry run wrote $dir/out"
suites=0
for t in "$build"/bin/strata_*_tests; do
  tags=$("$t" --list-tags "*" 2>/dev/null) || true
  grep -q "\[cuda\]" <<<"$tags" || continue
  s=${t##*/}; s=${s#strata_}; s=${s%_tests}
  grep -Eq "^test_$s +catch2 +[0-9]+s +.*${t##*/} .*cuda" <<<"$plan" || fail "the plan lacks $t's [cuda] tests: $plan"
  suites=$((suites + 1))
done
[ "$suites" -gt 0 ] || fail "no suite in $build/bin has [cuda] tests: is this a build with the tests?"
echo "ok: the plan runs the $suites suites with [cuda] tests"
for step in "bench_device .*bench device --device cuda" "bench_gpt_124m_bf16 .*--preset 124M --seq-len 1024 .*--products bf16" \
  "train_gpt_124m_bf16 .*train --model gpt --preset 124M" "torch_gpt_124m_bf16 .*bench_gpt_torch.py 12 12 768 1024 50257" \
  "train_offload .*--preset 1.5B .*--device cuda .*gpt-offload-gpu.json .*--trace" "bench_gpt_offload_compute .*--preset 1.5B" \
  "bench_adam_cuda " "cli_train_gpt_cuda .*train_gpt_cuda_test.sh" "cli_train_llama_cuda .*train_llama_cuda_test.sh" \
  "gpu_info .*nvidia-smi"; do
  grep -Eq "^$step" <<<"$plan" || fail "the plan lacks '$step': $plan"
done
echo "ok: the plan has the GPU info, link, GPT 124M (Strata and PyTorch), offloaded, AdamW and CLI steps"
for args in "" "--quick" "--budget-seconds 120"; do
  # shellcheck disable=SC2086  # $args is a list of words
  p=$("$check" --dry-run --build "$build" $args)
  want=$(sed -n 's/^gpu_check plan: .*budget \([0-9]*\)s.*/\1/p' <<<"$p")
  sum=$(awk '$3 ~ /^[0-9]+s$/ {s += $3} END {print s}' <<<"$p")
  [ -n "$want" ] && [ "$sum" -le "$want" ] || fail "plan ($args): step budgets sum to ${sum}s, over ${want}s: $p"
  grep -q "^total step budget: ${sum}s of ${want}s" <<<"$p" || fail "plan ($args): the total line is not ${sum}s of ${want}s: $p"
done
grep -q -- "--preset 774M" <<<"$("$check" --dry-run --build "$build" --quick)" || fail "--quick does not shrink the offloaded model"
rel=$(cd "$build/.." && "$check" --dry-run --build "${build##*/}" --out rel-out) || fail "dry run with a relative --build: $rel"
grep -q "^bench_device .* $(cd "$build" && pwd)/bin/strata bench" <<<"$rel" || fail "a relative --build is not made absolute: $rel"
echo "ok: the step budgets fit --budget-seconds (default, --quick, 120 s)"

refused "an unknown argument" 2 "unknown argument '--bogus'" "$check" --dry-run --build "$build" --bogus
refused "--budget-seconds abc" 2 "--budget-seconds 'abc'" "$check" --dry-run --build "$build" --budget-seconds abc
refused "--budget-seconds 5" 2 "60..3600" "$check" --dry-run --build "$build" --budget-seconds 5
refused "--build with no value" 2 "--build needs a value" "$check" --dry-run --build
refused "a build without strata" 2 "no strata binary at $dir/bin/strata" "$check" --dry-run --build "$dir"
mkdir -p "$dir/only/bin" && cp "$build/bin/strata" "$dir/only/bin/"
refused "a build without test suites" 2 "no test binaries" "$check" --dry-run --build "$dir/only"
# No GPU: a stand-in nvidia-smi that lists none (so this holds on a GPU machine too).
mkdir -p "$dir/fake" && printf '#!/bin/sh\necho "No devices were found"\nexit 6\n' > "$dir/fake/nvidia-smi" && chmod +x "$dir/fake/nvidia-smi"
refused "a machine without a GPU" 77 "SKIPPED: nvidia-smi lists no GPU" env PATH="$dir/fake:$PATH" "$check" --build "$build" --out "$dir/out"
[ ! -e "$dir/out" ] || fail "the skipped run wrote $dir/out"

# The collector: figures from a bench's JSON among warnings, and a Catch2 summary with failures.
collect=(python3 "$root/scripts/gpu_check_collect.py")
mkdir -p "$dir/rep/logs" && "${collect[@]}" start "$dir/rep" --build "$build" --budget 480 --quick 0
printf 'warning: before\n{"h2d_gbps": 50.5, "d2h_gbps": 51.5}\nwarning: after {x}\n' > "$dir/rep/logs/d.log"
printf 'test cases: 6 | 4 passed | 2 failed\n' > "$dir/rep/logs/t.log"
"${collect[@]}" step "$dir/rep" bench_device bench_device 20 0 1.5 logs/d.log "strata bench device"
"${collect[@]}" step "$dir/rep" test_models catch2 22 1 2.0 logs/t.log "strata_models_tests" cases=6
"${collect[@]}" finish "$dir/rep"
python3 - "$dir/rep/report.json" <<'PY' || fail "the collector misread the logs: $(cat "$dir/rep/report.json")"
import json, sys
s = {x["name"]: x for x in json.load(open(sys.argv[1]))["steps"]}
assert s["bench_device"]["figures"] == {"h2d_gbps": 50.5, "d2h_gbps": 51.5} and s["bench_device"]["status"] == "passed"
assert s["test_models"]["figures"] == {"cases": 6, "passed": 4, "failed": 2, "skipped": 0} and s["test_models"]["status"] == "failed"
PY
grep -q "D2H 51.5 GB/s" "$dir/rep/report.md" || fail "report.md lacks the measured D2H: $(cat "$dir/rep/report.md")"
echo "ok: the collector reads a bench's JSON among warnings and a failing Catch2 summary"

# The report: the sample's step names are the plan's, every target has its line, the
# missing AdamW figure reads "not measured", and --out writes the same text.
python3 - "$sample" "$plan" <<'PY' || fail "the sample is not shaped like the plan's report"
import json, re, sys
r = json.load(open(sys.argv[1]))
assert r["sample"] is True, "the sample must say \"sample\": true"
planned = set(re.findall(r"^(\w+) ", sys.argv[2], re.M)) - {"gpu_check", "total"}
names = {s["name"] for s in r["steps"]}
assert planned == names, (sorted(planned ^ names))
for s in r["steps"]:
    assert set(s) >= {"name", "kind", "command", "budget_s", "status", "exit_status", "seconds", "log", "figures"}, s
PY
md=$(python3 "$report" "$sample") || fail "gpu_report.py on the sample: $md"
for line in "- bf16 GPT >= 1.0x PyTorch eager autocast (GPT-2 124M, seq 1024): 0.92x" \
  "- offloaded gradient path >= 0.8x measured pinned D2H bandwidth: 0.03x" \
  "- offloaded step <= 1.15x max(GPU compute, link floor): 19.53x" \
  "- GPU AdamW >= 0.85x HBM roofline: not measured (bench_adam_cuda unavailable" \
  "Sample figures" "| test_engine_offload | failed | 2 | 1 | 0 |"; do
  grep -qF -- "$line" <<<"$md" || fail "the report lacks '$line': $md"
done
echo "ok: the sample's report has each target with its ratio, 'not measured' for AdamW, and the test counts"
python3 "$report" "$sample" --out "$dir/section.md" && [ "$(cat "$dir/section.md")" = "$md" ] || fail "--out did not write the section"
echo "ok: --out writes the same section"
printf '{"steps": [' > "$dir/torn.json"
refused "a malformed report.json" 2 "is not valid JSON" python3 "$report" "$dir/torn.json"
echo '{"steps": [{"name": 3}]}' > "$dir/odd.json"
refused "a report whose step has no name" 2 "steps\[0\] is not a step" python3 "$report" "$dir/odd.json"
refused "a missing report" 2 "cannot read $dir/none.json" python3 "$report" "$dir/none.json"
carry=$root/scripts/gpu_carry.sh
"$carry" pack --build "$build" --out "$dir/carry" > "$dir/pack.log" 2>&1 || fail "gpu_carry.sh pack: $(cat "$dir/pack.log")"
listing=$(tar -tJf "$dir/carry/strata-gpu.tar.xz")
for want in bin/strata lib/libtbb.so.12 lib/libgloo.so; do
  grep -q "^$want" <<<"$listing" || fail "the pack lacks $want: $listing"
done
for t in "$build"/bin/strata_*_tests; do  # exactly the suites with [cuda] cases
  tags=$("$t" --list-tags "*" 2>/dev/null) || true
  if grep -q "\[cuda\]" <<<"$tags"; then want=1; else want=0; fi
  got=$(grep -c "^bin/${t##*/}\$" <<<"$listing" || true)
  [ "$got" = "$want" ] || fail "the pack has ${t##*/} $got times, not $want: $listing"
done
if grep -Eq "lib/lib(c|m|stdc\+\+|gcc_s|cudart|cublas|cublasLt|nccl)\.so" <<<"$listing"; then
  fail "the pack carries the C runtime or CUDA's libraries: $listing"
fi
tar -xJf "$dir/carry/strata-gpu.tar.xz" -C "$dir/carry" bin/strata
if nm "$dir/carry/bin/strata" 2>/dev/null | grep -q .; then fail "the packed strata is not stripped"; fi
echo "ok: gpu_carry.sh pack: the [cuda] suites and strata, stripped, with their non-CUDA libraries"
refused "gpu_carry.sh run without --out" 2 "run needs --out" "$carry" run --carry "$dir/carry"
refused "gpu_carry.sh run without a pack" 2 "no $dir/none/strata-gpu.tar.xz" "$carry" run --carry "$dir/none" --out "$dir/o"
refused "gpu_carry.sh with an unknown verb" 2 "unknown verb" "$carry" fly

adam=$("$build/bin/strata" bench adam --device host --params 1M --iters 2 --json) || fail "bench adam --device host: $adam"
python3 - "$adam" <<'PY' || fail "bench adam --device host: $adam"
import json, sys
j = json.loads(sys.argv[1])
assert j["backend"] == "host" and j["params"] == 1000000 and j["bytes_per_param"] == 28, j
assert j["step_ms"] > 0 and j["gbps"] > 0 and j["roofline_gbps"] > 0 and j["fraction_of_roofline"] > 0, j
PY
refused "bench adam --device with lion" 1 "has no device kernel" "$build/bin/strata" bench adam --device host --optimizer lion --params 1M
echo "ok: bench adam --device host"
echo "ok: gpu_check.sh, gpu_carry.sh and gpu_report.py"
