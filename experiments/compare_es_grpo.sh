#!/usr/bin/env bash
# ES vs GRPO on SmolLM2-135M-Instruct, 2-digit addition, one 20-update budget each, then the analyses
# and one report. About half an hour on 2 CPU cores (the two trainings run side by side, one thread each).
#   bash experiments/compare_es_grpo.sh            # writes runs/compare/ and runs/compare/report/
# Every step is resumable: re-running skips finished runs (and `evolm es/grpo --resume` continues).
set -euo pipefail
cd "$(dirname "$0")/.."
EVOLM=${EVOLM:-.venv/bin/evolm}
OUT=${OUT:-runs/compare}
mkdir -p "$OUT"

train() {  # train KIND CONFIG NAME
  local kind=$1 config=$2 name=$3
  if [ -f "$OUT/$name/final/config.json" ]; then echo "$name: done"; return; fi
  if [ -f "$OUT/$name/config.toml" ]; then "$EVOLM" "$kind" --resume "$OUT/$name"; return; fi
  "$EVOLM" "$kind" --config "$config" --set "run.out_dir='$OUT'" --set "run.name='$name'" --set run.progress=false
}

train es configs/es-arithmetic.toml es > "$OUT/es.log" 2>&1 &
train grpo configs/grpo-arithmetic.toml grpo > "$OUT/grpo.log" 2>&1 &
wait

"$EVOLM" analyze drift --base smollm2-135m --trained "es=$OUT/es" --trained "grpo=$OUT/grpo" --out "$OUT/analysis"
"$EVOLM" analyze localisation --base smollm2-135m --trained "es=$OUT/es" --trained "grpo=$OUT/grpo" --k 100 --k 144 --out "$OUT/analysis"
"$EVOLM" analyze sparsity --trained "$OUT/es" --limit 64 --out "$OUT/analysis"
"$EVOLM" report "$OUT/es" "$OUT/grpo" "$OUT/analysis" --out "$OUT/report" --title "ES vs GRPO on SmolLM2-135M, 2-digit addition"
echo "report: $OUT/report/report.md"
