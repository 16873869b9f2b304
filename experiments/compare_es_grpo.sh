#!/usr/bin/env bash
# ES vs GRPO on SmolLM2-135M-Instruct, 2-digit addition, one matched budget each, then the analyses
# and one report. Both methods generate with one completion length limit (generation.max_new_tokens,
# 24 tokens, which GRPO's max_completion_length = 0 takes). The two trainings run side by side, one
# thread each; docs/results.md has the measured duration.
#   bash experiments/compare_es_grpo.sh                       # 20 updates each; writes runs/compare/ and runs/compare/report/
#   MATCH=tokens BUDGET=60000 bash experiments/compare_es_grpo.sh   # each side stops once it has generated 60,000 tokens
# MATCH is updates (default), sequences, tokens or seconds (run.match); with anything but updates each
# run stops after the update at which its running total reaches BUDGET, capped at CAP updates (default 200).
# The report's curves and budget table are drawn against MATCH (evolm report --match).
# Every step is resumable: re-running skips finished runs (and `evolm es/grpo --resume` continues).
set -euo pipefail
cd "$(dirname "$0")/.."
EVOLM=${EVOLM:-.venv/bin/evolm}
OUT=${OUT:-runs/compare}
MATCH=${MATCH:-updates}
BUDGET=${BUDGET:-0}
CAP=${CAP:-200}
mkdir -p "$OUT"

es_sets=() grpo_sets=()
if [ "$MATCH" != updates ]; then
  es_sets=(--set "run.match='$MATCH'" --set "run.budget=$BUDGET" --set "es.iterations=$CAP")
  grpo_sets=(--set "run.match='$MATCH'" --set "run.budget=$BUDGET" --set "grpo.steps=$CAP")
fi

train() {  # train KIND CONFIG NAME [--set ...]
  local kind=$1 config=$2 name=$3
  shift 3
  if [ -f "$OUT/$name/final/config.json" ]; then echo "$name: done"; return; fi
  if [ -f "$OUT/$name/config.toml" ]; then "$EVOLM" "$kind" --resume "$OUT/$name"; return; fi
  "$EVOLM" "$kind" --config "$config" --set "run.out_dir='$OUT'" --set "run.name='$name'" --set run.progress=false "$@"
}

train es configs/es-arithmetic.toml es "${es_sets[@]}" > "$OUT/es.log" 2>&1 &
train grpo configs/grpo-arithmetic.toml grpo "${grpo_sets[@]}" > "$OUT/grpo.log" 2>&1 &
wait

# the base of every analysis is each run's own step-0 weights, checked against the fingerprint in its run.json
"$EVOLM" analyze drift --trained "es=$OUT/es" --trained "grpo=$OUT/grpo" --out "$OUT/analysis"
"$EVOLM" analyze localisation --trained "es=$OUT/es" --trained "grpo=$OUT/grpo" --k 100 --k 144 --out "$OUT/analysis"
"$EVOLM" analyze sparsity --trained "$OUT/es" --limit 64 --out "$OUT/analysis"
"$EVOLM" report "$OUT/es" "$OUT/grpo" "$OUT/analysis" --match "$MATCH" --out "$OUT/report" \
  --title "ES vs GRPO on SmolLM2-135M, 2-digit addition (matched on $MATCH)"
echo "report: $OUT/report/report.md"
