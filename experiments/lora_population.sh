#!/usr/bin/env bash
# What the LoRA population learns (issue 42, item 4): low-rank ES members as vLLM LoRA adapters against the HF
# low-rank path on the same members, and against the committed full-rank and all-parameter low-rank runs, at the
# same budget and seed: docs/lowrank-experiment/lowrank-30/config.toml (SmolLM2-135M float32, 2-digit addition,
# N = 8, rank 4, sigma 1e-3, lr 5e-4, 16 prompts per update, 30 updates, held-out 64 problems x 16 samples).
#   vllm-lora     generation.backend = "vllm", es.params = attention + mlp (what a LoRA adapter can carry)
#   hf-lowrank    the same members on the HF backend (same keys and parameters: its twin)
# Compared with docs/lowrank-experiment/lowrank-30 (HF low-rank, every parameter) and full-at-30 (full rank).
#   bash experiments/lora_population.sh           # ~1 hour on one core; resumable (re-run skips finished runs)
#   OUT=/tmp/smoke EXTRA="es.iterations=1 es.prompts_per_iteration=2 eval.count=2 eval.n_samples=2 probe.every=0" \
#     bash experiments/lora_population.sh         # a smoke of the plumbing
# Writes only under OUT (default runs/lora-population); PUBLISH=docs/lora-population copies the small files
# (configs, metrics, seed logs, held-out JSON; never weights) there.
set -euo pipefail
cd "$(dirname "$0")/.."
EVOLM=${EVOLM:-.venv-vllm/bin/evolm}
OUT=${OUT:-runs/lora-population}
CONFIG=docs/lowrank-experiment/lowrank-30/config.toml
EXTRA=${EXTRA:-}
mkdir -p "$OUT"

train() {  # train NAME [--set KEY=VALUE ...]: start, resume or skip a finished run
  local name=$1; shift
  if grep -qs '"status": "finished"' "$OUT/$name/run.json"; then echo "$name: done"; return; fi
  if [ -f "$OUT/$name/config.toml" ]; then "$EVOLM" es --resume "$OUT/$name"; return; fi
  local extra=()
  for kv in $EXTRA; do extra+=(--set "$kv"); done
  "$EVOLM" es --config "$CONFIG" --set "run.out_dir='$OUT'" --set "run.name='$name'" --set run.progress=false \
    --set model.threads=1 --set "es.params=['attention', 'mlp']" "$@" "${extra[@]}"
}

train vllm-lora --set generation.backend=vllm --set generation.vllm_kv_cache_gb=1.0 > "$OUT/vllm-lora.log" 2>&1
train hf-lowrank > "$OUT/hf-lowrank.log" 2>&1
if [ -n "${PUBLISH:-}" ]; then
  for name in vllm-lora hf-lowrank; do
    mkdir -p "$PUBLISH/$name"
    for f in config.toml run.json metrics.jsonl seed_log.jsonl eval_before.json eval_after.json; do
      [ -f "$OUT/$name/$f" ] && cp "$OUT/$name/$f" "$PUBLISH/$name/"
    done
  done
fi
