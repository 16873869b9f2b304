#!/usr/bin/env bash
# The numerics question asked of the paper's own arithmetic (issue 41, items 3-4): null walks (seeded random fitness,
# no generation: experiments/refnum/null_walk.py) at the artifact's Easy setting — N = 32, sigma = 1.5e-3,
# lr = 2.5e-4 with 1/sigma folded in (es.divide_by_sigma = false), 234 updates (its 2 epochs) — under
#   exact      exact float32 (float32 weights, restore bit for bit)
#   reference  Qiu et al.'s single-process in-place bfloat16 loop (es.arithmetic = "reference")
#   artifact   the artifact's loop: 8 simulated engines, each reverting its own 4 members, synced every 117 updates
#              and at checkpoints (es.arithmetic = "artifact", es.engines = 8, es.engine_sync_every = 117); the
#              replicas' divergence before each sync is in metrics.jsonl (replica_divergence)
# on SmolLM2-135M and Gemma-3-270M, for run.seed 0, 1, 2 (the seed changes the members' noise and the fitness draws).
#
#   bash experiments/refnum/artifact_walks.sh                 # every model, arm and seed not done yet, one at a time
#   MODELS=smollm2 SEEDS=0 bash experiments/refnum/artifact_walks.sh   # a subset
#   MODELS=gemma ARMS="exact artifact reference" bash experiments/refnum/artifact_walks.sh   # another order: the artifact
#       arm cannot resume between its syncs (117, 234) but the others checkpoint every 10 updates, so a session
#       that cannot finish all three should leave the resumable one for last
#   ITERATIONS=2 POPULATION=8 OUT=/tmp/aw bash experiments/refnum/artifact_walks.sh   # a smoke of the plumbing
#
# Writes only under OUT (default runs/refnum-artifact): aw-<model>-<arm>-s<seed>-null/, their analyses (drift, sparsity,
# localisation, and magnitude for the bf16 arms unless MAGNITUDE=0; analyses/aw-...-null/) and summary.json (experiments/refnum/artifact_summary.py: per model and seed, the
# numbers the study's Q4 tests read); PUBLISH=docs/study/artifact copies the small files, analyses and summary there. Resumable: a finished walk is
# skipped, a stopped one continued (null_walk.py --resume); across sessions, a walk published under PUBLISH is restored
# from there (small files and analyses) and counts as done. Cost, one thread: SmolLM2 exact ~1.2 s per update; with the
# chunked in-place arithmetic (2026-12-05; docs/benchmarks.md, "In-place arithmetic") one N = 32 update of the reference
# (artifact) loop takes ~8 s (~6.5 s plus the replicas' swaps and updates) on SmolLM2 and ~15 s (~11 s) on Gemma alone,
# so ~5 min + ~30 min + ~30 min per SmolLM2 seed and ~10 min + ~1 h + ~1 h per Gemma seed (before: ~40-50 min per
# SmolLM2 bf16 arm, measured, and ~2.6 h per Gemma one); magnitude adds 2-6 min and 7.6 GB resident per SmolLM2 bf16
# walk and 2.5-4 min and 17.2 GB peak per Gemma one (measured 2026-12-05; 20 min in an earlier session).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-runs/refnum-artifact}
ITERATIONS=${ITERATIONS:-234}
POPULATION=${POPULATION:-32}
MODELS=${MODELS:-smollm2 gemma}
SEEDS=${SEEDS:-0 1 2}
ARMS=${ARMS:-exact reference artifact}
mkdir -p "$OUT"

SETTING=(--set "es.population=$POPULATION" --set es.sigma=0.0015 --set es.lr=0.00025 --set es.divide_by_sigma=false)
ARTIFACT=(--set 'es.arithmetic="artifact"' --set es.engines=8 --set es.engine_sync_every=117 --set run.checkpoint_every=117
          --set 'model.dtype="bfloat16"')

config_of() {  # config_of MODEL ARM: the refnum config an arm starts from
  case "$1:$2" in
    smollm2:exact) echo experiments/refnum/smollm2-es-exact-f32.toml ;;
    smollm2:*) echo experiments/refnum/smollm2-es-reference-bf16.toml ;;
    gemma:exact) echo experiments/refnum/gemma-es-exact-f32.toml ;;
    gemma:*) echo experiments/refnum/gemma-es-reference-bf16.toml ;;
  esac
}

walk() {  # walk MODEL ARM SEED
  local model=$1 arm=$2 seed=$3 name="aw-$1-$2-s$3" dir
  dir="$OUT/$name-null"
  if grep -qs '"status": "finished"' "$dir/run.json"; then echo "$name: done"; return; fi
  if [ -f "$dir/config.toml" ]; then
    "$PY" experiments/refnum/null_walk.py --resume "$dir" --iterations "$ITERATIONS"
  else
    local extra=()
    [ "$arm" = artifact ] && extra=("${ARTIFACT[@]}")
    "$PY" experiments/refnum/null_walk.py "$(config_of "$model" "$arm")" --iterations "$ITERATIONS" --out-dir "$OUT" \
      --set "run.name=\"$name\"" --set "run.seed=$seed" "${SETTING[@]}" "${extra[@]}"
  fi
}

# tau = 1 x the single-update RMS lr / sqrt(N) (C5's "a threshold within one update's magnitude range")
TAU=$("$PY" -c "import math; print(0.00025 / math.sqrt($POPULATION))")

analyse() {  # analyse NAME: drift, sparsity and localisation of a finished walk against its own base (counts only)
  local name=$1 dir="$OUT/analyses/$1" args=(--trained "$1=$OUT/$1")
  [ -f "$OUT/$name/final/config.json" ] || return 0
  mkdir -p "$dir"
  [ -f "$dir/drift.json" ] || "$PY" -m evolm analyze drift "${args[@]}" --out "$dir"
  [ -f "$dir/sparsity.json" ] || "$PY" -m evolm analyze sparsity "${args[@]}" --no-eval --tau-scale "$TAU" \
    --multipliers 0.25,0.5,1,2,4,8 --out "$dir"
  [ -f "$dir/localisation.json" ] || "$PY" -m evolm analyze localisation "${args[@]}" --k 100 --out "$dir"
  # the bf16 walks' top 100 against the dtype-spacing null (is a localisation the ulps'?): MAGNITUDE=0 skips it
  # (its cost is in the header)
  case "$name" in *-exact-*) return 0 ;; esac
  [ -f "$dir/magnitude.json" ] || [ "${MAGNITUDE:-1}" = 0 ] || "$PY" -m evolm analyze magnitude "${args[@]}" --k 100 \
    --permutations "${PERMUTATIONS:-10000}" --out "$dir"
}

restore() {  # restore NAME: a walk published by an earlier session (PUBLISH) and not under OUT: its small files and
  # analyses copied back, so it counts as done (its weights are not needed: the summary reads only these files)
  local name=$1 src="${PUBLISH:-}"
  [ -n "$src" ] && [ ! -d "$OUT/$name" ] && grep -qs '"status": "finished"' "$src/runs/$name/run.json" || return 0
  mkdir -p "$OUT/analyses"
  cp -r "$src/runs/$name" "$OUT/$name"
  [ -d "$src/analyses/$name" ] && cp -r "$src/analyses/$name" "$OUT/analyses/$name"
  echo "$name: restored from $src"
}

for model in $MODELS; do
  for seed in $SEEDS; do
    for arm in $ARMS; do
      restore "aw-$model-$arm-s$seed-null"
      walk "$model" "$arm" "$seed" > "$OUT/aw-$model-$arm-s$seed.log" 2>&1 || { echo "aw-$model-$arm-s$seed failed: see $OUT/aw-$model-$arm-s$seed.log" >&2; exit 1; }
      analyse "aw-$model-$arm-s$seed-null" >> "$OUT/aw-$model-$arm-s$seed.log" 2>&1
    done
  done
done
# the per-seed contrasts the study's Q4 tests read; PUBLISH=docs/study/artifact also copies them (and the small files)
"$PY" experiments/refnum/artifact_summary.py "$OUT" ${PUBLISH:+--publish "$PUBLISH"}
