#!/usr/bin/env bash
# The GPU measurements in one run (sized for <= 8 minutes on one H200), outputs under OUT:
#
#   bench/gpu.sh OUT            # on the GPU machine, from the repository root
#   bench/gpu.sh OUT --tiny     # (or CODESPEC_GPU_TINY=1) the same steps at tiny shapes on the CPU, < 60 s:
#                               # what CI runs (tests/bench/test_gpu_script.py) so GPU minutes go to numbers
#
# Steps, each under its own time limit (a step that fails or runs out is recorded and the next runs):
#   1. env.txt                 GPU, driver, torch / transformers versions
#   2. equivalence.json        greedy equivalence at qwen2.5-coder-1.5b in fp32 and bf16, with the logit
#                              gap at every mismatch (bench/equivalence.py)
#   3. bench-1.5b.{json,md}    codespec bench --mode replay at qwen2.5-coder-1.5b on edits-httpx and
#      bench-7b.{json,md}      completions-httpx, configs greedy, auto, hf-pld, hf-greedy (bf16), and at 7b
#   4. inline-1.5b.json        inline completion latency through the language server (bench/inline.py)
#                              on a saved random 1.5b, item / engine / TTFT p50 and p95 per phase
#   5. summary.md              every step's status and headline figures, CUDA peak memory per config
#
# Workloads: $CODESPEC_WORKLOADS, else shared/workloads or ../shared/workloads (edits-httpx.jsonl,
# completions-httpx.jsonl, workspace-httpx.jsonl). Nothing is downloaded: models are random weights
# of the published shapes (bench/shapes.py) and the shipped tokenizer.
set -uo pipefail

OUT=${1:?usage: bench/gpu.sh OUT [--tiny]}
TINY=${CODESPEC_GPU_TINY:-0}
[[ "${2:-}" == "--tiny" ]] && TINY=1
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1

WORK=${CODESPEC_WORKLOADS:-}
for candidate in shared/workloads ../shared/workloads; do
  [[ -z "$WORK" && -f "$candidate/edits-httpx.jsonl" ]] && WORK=$candidate
done
[[ -n "$WORK" ]] || { echo "gpu.sh: no workloads (set CODESPEC_WORKLOADS)" >&2; exit 2; }

if [[ "$TINY" == 1 ]]; then
  DEVICE=cpu; SMALL=tiny; LARGE=tiny; THREADS="--threads 1"
  EQUIV="--prompts 1 --prompt-len 32 --max-new-tokens 8 --draft-lens 4"
  SIZE_SMALL="--max-requests 1 --max-new-tokens 12 --max-chars 600"
  SIZE_LARGE="$SIZE_SMALL"
  INLINE="--limit 1"  # no workspace: indexing it is most of a tiny run
  LIMIT_EQUIV=60; LIMIT_SMALL=60; LIMIT_LARGE=60; LIMIT_INLINE=60
else
  DEVICE=cuda; SMALL=qwen2.5-coder-1.5b; LARGE=qwen2.5-coder-7b; THREADS=""
  EQUIV="--prompts 3 --prompt-len 256 --max-new-tokens 40 --draft-lens 4 16"
  # ~18 ms (1.5b) and ~28 ms (7b) a bf16 forward through transformers: greedy and hf-greedy decode
  # every budgeted token, the speculative configurations a fraction of them
  SIZE_SMALL="--stride 7 --max-requests 8 --max-chars 6000 --token-budget 600 --max-new-tokens 400"
  SIZE_LARGE="--stride 7 --max-requests 6 --max-chars 6000 --token-budget 400 --max-new-tokens 400"
  INLINE="--limit 12 --workspace $WORK/workspace-httpx.jsonl"
  LIMIT_EQUIV=75; LIMIT_SMALL=120; LIMIT_LARGE=140; LIMIT_INLINE=80  # 475 s of limits in all
fi
STATUS="$OUT/status.tsv"
: > "$STATUS"

step() {  # step NAME LIMIT_S COMMAND...: run, log to OUT/NAME.log, record the exit status and seconds
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  echo "== $name (limit ${limit}s): $*" >&2
  timeout --kill-after=10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - start))" >> "$STATUS"
  [[ $rc == 0 ]] || { echo "== $name failed (exit $rc); last lines:" >&2; tail -5 "$OUT/$name.log" >&2; }
}

{
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')  tiny: $TINY  device: $DEVICE"
  command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  $PY -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'available', torch.cuda.is_available()); print('transformers', transformers.__version__)"
} > "$OUT/env.txt" 2>&1

step equivalence "$LIMIT_EQUIV" $PY -m bench.equivalence --shape "$SMALL" --device "$DEVICE" \
  --dtype float32 bfloat16 $EQUIV $THREADS --json "$OUT/equivalence.json"

BENCH_COMMON=(--workload "$WORK/edits-httpx.jsonl" "$WORK/completions-httpx.jsonl"
              --workspace "$WORK/workspace-httpx.jsonl" --mode replay --configs greedy,auto,hf-pld,hf-greedy
              --device "$DEVICE" --draft-len 32)
step bench-1.5b "$LIMIT_SMALL" $PY -m codespec.commands.cli bench "${BENCH_COMMON[@]}" --model-shape "$SMALL" \
  $SIZE_SMALL $THREADS --json "$OUT/bench-1.5b.json" --report "$OUT/bench-1.5b.md"
if [[ "$TINY" == 1 ]]; then  # the same code path as the step before at the same tiny shape: save CI the time
  printf 'bench-7b\tskipped\t0\n' >> "$STATUS"
else
  step bench-7b "$LIMIT_LARGE" $PY -m codespec.commands.cli bench "${BENCH_COMMON[@]}" --model-shape "$LARGE" \
    $SIZE_LARGE $THREADS --json "$OUT/bench-7b.json" --report "$OUT/bench-7b.md"
fi

MODEL_DIR="$OUT/model-1.5b"
DTYPE=bfloat16; [[ "$TINY" == 1 ]] && DTYPE=float32
step save-1.5b 60 $PY -m bench.shapes save "$SMALL" "$MODEL_DIR" --dtype "$DTYPE"
step inline-1.5b "$LIMIT_INLINE" $PY -m bench.inline --cases "$WORK/completions-httpx.jsonl" \
  --model "$MODEL_DIR" --device "$DEVICE" $INLINE --json "$OUT/inline-1.5b.json"
rm -rf "$MODEL_DIR"  # GBs of random weights: not an output

$PY -m bench.gpu_summary "$OUT" > "$OUT/summary.md" 2> "$OUT/summary.log"
cat "$OUT/summary.md"
