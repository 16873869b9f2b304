#!/usr/bin/env bash
# Reference numerics: is what ES does to the weights (C4 drift, C5 sparsity, C6 localisation) ES's, or
# bfloat16 arithmetic? Runs, one at a time (each on one thread), then the analyses:
#   SmolLM2-135M, 2-digit addition, N = 30, 240 updates, same run.seed / minibatches / members:
#     smollm2-es-exact-f32       (a) exact float32 ES
#     smollm2-es-reference-bf16  (b) Qiu et al.'s in-place bf16 arithmetic (es.arithmetic = "reference")
#     smollm2-es-exact-bf16      (c) bf16 generation, float32 masters
#     smollm2-grpo-bf16          GRPO with bf16 weights (240 steps)
#   Gemma-3-270M, 1-digit addition, N = 30, 60 updates: gemma-es-exact-f32 (a), gemma-es-reference-bf16 (b)
#
#   bash experiments/refnum/run.sh             # everything not done yet, then the analyses
#   bash experiments/refnum/run.sh smollm2     # the SmolLM2 runs and their analyses only
#   bash experiments/refnum/run.sh analyses    # the analyses of whatever has finished
#   bash experiments/refnum/run.sh arm es smollm2-es-exact-f32 &   # one run, e.g. two side by side on 2 cores:
#   bash experiments/refnum/run.sh arm es smollm2-es-reference-bf16 &  # (ANALYSE=1: its analyses too; MAGNITUDE=0: not analyze magnitude)
#   bash experiments/refnum/run.sh walk smollm2-es-artifact-bf16 120   # one config's null walk to 120 updates, and its
#                                              # analyses (e.g. an arm not in null's list)
#   bash experiments/refnum/run.sh save        # before a session ends: every run's small files (seed log, metrics,
#                                              # held-out tables, config; no weights) to docs/study/refnum/runs/, to commit;
#                                              # the next session's run.sh restores a run absent from runs/refnum from
#                                              # there and resumes it by replaying its seed log
#   bash experiments/refnum/run.sh null        # ES's arithmetic alone (null_walk.py: seeded random fitness, no
#                                              # generation): every walk to 120 SmolLM2 / 20 Gemma updates, analysed, then
#                                              # the exact float32 walks to 240 / 60 (first analyses kept in -at-120 / -at-20)
#                                              # and summarised (~3.5 CPU-hours; the reference arms are 30-60 s/update)
#   PUBLISH=docs/study/refnum bash experiments/refnum/run.sh summarise   # the summary into docs/ (to commit); without
#                                              # PUBLISH every stage writes only under OUT (its summary: OUT/summary)
#   HORIZON=120 bash experiments/refnum/run.sh smollm2   # every run to update 120 (held-out table, analyses); run again
#                                              # without HORIZON to extend them to the configs' 240 (analyses at 120 kept
#                                              # in analyses/NAME-at-120)
#   ITERATIONS=1 POPULATION=4 PERMUTATIONS=1000 OUT=runs/refnum-smoke bash experiments/refnum/run.sh smollm2   # a smoke of the plumbing
#
# Cost, one thread, estimated from 1-2 update smokes (N = 4) on the shared 2-core machine: ~25 CPU-hours
# in all (20-35): per SmolLM2 member 2.1-2.7 s of float32 and 1.7-3 s of bf16 generation, so the three
# SmolLM2 ES runs 4-7 h each; GRPO 33 s/step, ~2.2 h; Gemma (a) 1.5-3.3 h, (b) ~1.2 h; held-out
# evaluations ~2.5 h; analyses under 1 h (analyze magnitude ~3 min per SmolLM2 model, ~6 per Gemma one).
# Every run resumes from its checkpoint when killed (evolm es/grpo --resume); finished runs and written
# analyses are skipped, so the script can be run again after a kill. Runs write runs/refnum/<name>/.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-runs/refnum}
SMOKE=()  # ITERATIONS / POPULATION shrink every run (a smoke); unset for the real experiment
[ -n "${ITERATIONS:-}" ] && SMOKE+=(--set "es.iterations=$ITERATIONS" --set "eval.before_after=false")
[ -n "${POPULATION:-}" ] && SMOKE+=(--set "es.population=$POPULATION")
mkdir -p "$OUT"

KEEP=${KEEP:-docs/study/refnum/runs}  # where a run's small files are kept between sessions (committed, no weights)
# the small files of a run (no weights): summarise.py's list, read from there so the two cannot drift apart
small=$("$PY" -c 'import sys; sys.path.insert(0, "experiments/refnum"); from summarise import SMALL; print(*SMALL)')
read -r -a SMALL <<< "$small"

save() {  # copy every run's small files under $OUT to $KEEP, so a later session (runs/ is not kept) can continue it
  local dir name f
  for dir in "$OUT"/*/; do
    name=$(basename "$dir")
    [ -f "$dir/config.toml" ] && [ -f "$dir/seed_log.jsonl" ] || continue
    mkdir -p "$KEEP/$name"
    for f in "${SMALL[@]}"; do [ -f "$dir/$f" ] && cp "$dir/$f" "$KEEP/$name/"; done
    echo "$name: saved to $KEEP/$name (updates to $(last_step "$name") logged)"
  done
}

restore() {  # restore NAME: a run kept in $KEEP but absent from $OUT comes back (its weights by replaying its seed log)
  local name=$1
  if [ ! -e "$OUT/$name" ] && [ -f "$KEEP/$name/seed_log.jsonl" ] && [ -f "$KEEP/$name/config.toml" ]; then
    cp -r "$KEEP/$name" "$OUT/$name"
    echo "$name: restored from $KEEP/$name (resumes by replaying its seed log)"
  fi
}

last_step() {  # last_step NAME: the last update NAME has logged in metrics.jsonl (0 when none)
  "$PY" -c 'import json, sys; p = sys.argv[1]
try: print(max([int(r["step"]) for r in map(json.loads, open(p)) if r.get("kind") == "train"] or [0]))
except OSError: print(0)' "$OUT/$1/metrics.jsonl"
}

planned() {  # planned NAME FIELD: FIELD of experiments/refnum/NAME.toml (es.iterations, grpo.steps)
  "$PY" -c 'import sys, tomllib; s, f = sys.argv[2].split("."); print(tomllib.load(open(sys.argv[1], "rb"))[s][f])' \
    "experiments/refnum/$1.toml" "$2"
}

run() {  # run KIND NAME: start experiments/refnum/NAME.toml, resume it, or skip it when it has reached its target
  # target: HORIZON when set (e.g. 120: every run finishes there, with its held-out table and analyses, and a later
  # run.sh without HORIZON extends it to the config's budget, bit-identical to a run made with that budget), else
  # the config's budget (ITERATIONS in a smoke)
  local kind=$1 name=$2 sets=("${SMOKE[@]}") field=es.iterations target
  [ -z "${ITERATIONS:-}" ] && restore "$name"
  if [ "$kind" = grpo ]; then  # es.* overrides do not apply to GRPO
    field=grpo.steps
    sets=(); [ -n "${ITERATIONS:-}" ] && sets=(--set "grpo.steps=$ITERATIONS" --set "eval.before_after=false")
  fi
  target=${HORIZON:-${ITERATIONS:-$(planned "$name" "$field")}}
  if [ -f "$OUT/$name/final/config.json" ] && [ "$(last_step "$name")" -ge "$target" ]; then echo "$name: done ($target)"; return; fi
  echo "$name: $(date -u +%H:%M:%S) start (to $target)"
  if [ -f "$OUT/$name/config.toml" ]; then
    "$PY" -m evolm "$kind" --resume "$OUT/$name" --set run.progress=false --set "$field=$target" >> "$OUT/$name.log" 2>&1
  else
    "$PY" -m evolm "$kind" --config "experiments/refnum/$name.toml" --set "run.out_dir=\"$OUT\"" --set run.progress=false \
      ${sets[@]+"${sets[@]}"} --set "$field=$target" > "$OUT/$name.log" 2>&1
  fi
  echo "$name: $(date -u +%H:%M:%S) finished"
}

analyse() {  # analyse DIR LABEL=RUN: drift, localisation, magnitude and sparsity of RUN's final weights, once per
  # horizon: analyses of an earlier finish (HORIZON, then extended) move to DIR-at-<update> (summarise.py reads both)
  local dir=$1 args=() pair at; shift
  for pair in "$@"; do [ -f "$OUT/${pair#*=}/final/config.json" ] && args+=(--trained "${pair%%=*}=$OUT/${pair#*=}"); done
  [ ${#args[@]} -gt 0 ] || return 0
  at=$(last_step "${1#*=}")
  if [ -f "$dir/updates" ] && [ "$(cat "$dir/updates")" != "$at" ]; then mv "$dir" "$dir-at-$(cat "$dir/updates")"; fi
  mkdir -p "$dir"
  echo "$at" > "$dir/updates"
  [ -f "$dir/drift.json" ] || "$PY" -m evolm analyze drift "${args[@]}" --out "$dir"
  [ -f "$dir/localisation.json" ] || "$PY" -m evolm analyze localisation "${args[@]}" --k 100 --k 144 --out "$dir"
  # MAGNITUDE=0 skips analyze magnitude (its dtype null holds ~50 bytes per coordinate: 13 GB for Gemma-3-270M)
  [ -f "$dir/magnitude.json" ] || [ "${MAGNITUDE:-1}" = 0 ] || "$PY" -m evolm analyze magnitude "${args[@]}" --k 100 --permutations "${PERMUTATIONS:-10000}" --out "$dir"
  # τ = m x the single-update RMS lr / sqrt(N) = 5e-4 / sqrt(30) (the paper's "a threshold within the magnitude range
  # of a single ES update"); counts only (--no-eval): the random-walk prediction is erf(m / sqrt(2T))
  [ -f "$dir/sparsity.json" ] || "$PY" -m evolm analyze sparsity "${args[@]}" --no-eval --tau-scale 9.128709291752768e-05 \
    --multipliers 0.25,0.5,1,2,4,8 --out "$dir"
}

null_walk() {  # null_walk NAME UPDATES: NAME's null walk (seeded random fitness) to UPDATES, resumed or extended
  local name=$1 it=$2
  if [ -f "$OUT/$name-null/final/config.json" ] && [ "$(last_step "$name-null")" -ge "$it" ]; then echo "$name-null: done ($it)"; return; fi
  echo "$name-null: $(date -u +%H:%M:%S) start (to $it)"
  if [ -f "$OUT/$name-null/config.toml" ]; then  # killed or extended: resume (from a checkpoint, or by replaying the seed log)
    "$PY" experiments/refnum/null_walk.py --resume "$OUT/$name-null" --iterations "$it" >> "$OUT/$name-null.log" 2>&1
  else
    "$PY" experiments/refnum/null_walk.py "experiments/refnum/$name.toml" --iterations "$it" --out-dir "$OUT" > "$OUT/$name-null.log" 2>&1
  fi
}

null() {  # the same configs, seeded random fitness, no generation (null_walk.py): ES's arithmetic alone. The committed
  # numbers: every walk to 120 SmolLM2 / 20 Gemma updates and analysed there (the study's Q3a-c read these), then the
  # exact float32 walks extended to 240 / 60 and analysed again; analyse() moves the first horizon's analyses to
  # analyses/NAME-null-at-120 / -at-20 (the study's exact float32 baselines). ITERATIONS=n (a smoke): n, then 2n.
  local name short long
  for name in smollm2-es-exact-f32 smollm2-es-exact-bf16 smollm2-es-reference-bf16 gemma-es-exact-f32 gemma-es-reference-bf16; do
    short=${ITERATIONS:-120}; [[ $name == gemma-* ]] && short=${ITERATIONS:-20}
    null_walk "$name" "$short"
    analyse "$OUT/analyses/$name-null" "${name#*-es-}=$name-null"  # one directory per run: each is analysed when it ends
  done
  for name in smollm2-es-exact-f32 gemma-es-exact-f32; do
    long=240; [[ $name == gemma-* ]] && long=60; [ -n "${ITERATIONS:-}" ] && long=$((ITERATIONS * 2))
    null_walk "$name" "$long"
    analyse "$OUT/analyses/$name-null" "${name#*-es-}=$name-null"
  done
  summarise
}

summarise() {  # the experiment's summary under $OUT/summary; PUBLISH=docs/study/refnum writes it there instead (to commit)
  mkdir -p "${PUBLISH:-$OUT/summary}"
  "$PY" experiments/refnum/summarise.py "$OUT" --out "${PUBLISH:-$OUT/summary}"
}

smollm2() {
  run es smollm2-es-exact-f32
  run es smollm2-es-reference-bf16
  run es smollm2-es-exact-bf16
  run grpo smollm2-grpo-bf16
}

gemma() {
  run es gemma-es-exact-f32
  run es gemma-es-reference-bf16
}

label() {  # label NAME: the run's label in its analyses (exact-f32, reference-bf16, exact-bf16, grpo-bf16), which the
  # study's claims file names in its paths (models.<label>....)
  local l=${1#*-es-}; echo "${l#smollm2-}"
}

analyses() {  # each run against its own base (the bf16 runs: their bf16-rounded base/, checked by fingerprint), one directory per run
  local name
  for name in smollm2-es-exact-f32 smollm2-es-reference-bf16 smollm2-es-exact-bf16 smollm2-grpo-bf16 gemma-es-exact-f32 gemma-es-reference-bf16; do
    analyse "$OUT/analyses/$name" "$(label "$name")=$name"
  done
  summarise
  # the restore error per update of the reference runs: metrics.jsonl, ref_* (docs/es.md)
  "$PY" - "$OUT" <<'PYEOF'
import json, sys
from pathlib import Path
for run in sorted(Path(sys.argv[1]).glob("*reference*/metrics.jsonl")):
    rows = [json.loads(l) for l in run.read_text().splitlines() if '"ref_error_rel"' in l]
    if rows:
        last = rows[-1]
        print(f"{run.parent.name}: after {last['step']} updates ref_error_rel {last['ref_error_rel']:.3g}, "
              f"ref_error_frac {last['ref_error_frac']:.3g}, ref_moved_ratio {last['ref_moved_ratio']}, "
              f"ref_changed_frac {last['ref_changed_frac']:.3g} (exact: {last['ref_exact_changed_frac']:.3g})")
PYEOF
}

case "${1:-all}" in
  null) null ;;
  summarise) summarise ;;
  save) save ;;
  arm) run "$2" "$3"; [ -z "${ANALYSE:-}" ] || analyse "$OUT/analyses/$3" "$(label "$3")=$3" ;;
  walk) null_walk "$2" "$3"; analyse "$OUT/analyses/$2-null" "$(label "$2")=$2-null" ;;
  smollm2) smollm2; analyses ;;
  gemma) gemma; analyses ;;
  analyses) analyses ;;
  all) smollm2; gemma; analyses ;;
  *) echo "usage: $0 [all|null|smollm2|gemma|analyses|summarise|save|arm KIND NAME|walk NAME UPDATES]" >&2; exit 2 ;;
esac
