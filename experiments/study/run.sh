#!/usr/bin/env bash
# The reproduction study (docs/REPRODUCTION.md): one resumable driver per claim.
#
#   bash experiments/study/run.sh c1c2     # C1 + C2 (+ C4, C5, C6 analyses of the same runs): ES and GRPO side by side
#   bash experiments/study/run.sh c1seeds [SEED...]  # C1: c1c2-grpo again with run.seed = 1, 2 (SEED), side by side, each then
#                                          evaluated on c1c2's 64 problems too (one GRPO seed is not enough at 4 x 8 per step)
#   bash experiments/study/run.sh cd       # C1 + C2 on a second task, procedural Countdown: ES and GRPO side by side, 1,200 s each
#   bash experiments/study/run.sh q1       # Q1: ES on normalisation + attention parameters only (c1c2-es otherwise)
#   bash experiments/study/run.sh c8       # C8: antithetic ES (c1c2-es otherwise)
#   bash experiments/study/run.sh c9       # C9: GRPO then ES, and ES then GRPO, half of each method's c1c2 update count;
#                                          and the second order's GRPO stage alone from the base (control)
#   bash experiments/study/run.sh c7       # C7: ES with N = 10, 20, 30 on SmolLM2-135M and on Gemma-3-270M, 20 updates each
#   bash experiments/study/run.sh c7x [UPDATES [N...]]  # C7: copies of the N = 10 and 30 points continued to 40 (UPDATES) updates
#   bash experiments/study/run.sh seeds [SEED...]  # C1, C2, C9: a second seed (default 1) of GRPO on Countdown and of the
#                                          GRPO -> ES pipeline, side by side, each then evaluated on its seed-0 counterpart's problems
#   bash experiments/study/run.sh c3       # C3: population vs centre coverage around c1c2-es's final weights (and at updates 160, 240),
#                                          and around Gemma-3-270M's after c7-gemma's N = 30 point
#   bash experiments/study/run.sh q2       # Q2: base, ES and GRPO fake-quantised to int8 / int4 and re-evaluated; after c1seeds,
#                                          group-wise int4 (groups of 128) and 25% magnitude pruning
#   bash experiments/study/run.sh c5       # C5: the masked models (small update coordinates zeroed), re-evaluated greedily;
#                                          after c2xl, ES's at 240 updates sampled (pass@1, pass@16)
#   bash experiments/study/run.sh c2long   # C2: c1c2-es continued to 4,800 s of update time (a copy, resumed with a larger budget)
#   bash experiments/study/run.sh c2xl     # C2: c2-es-long continued to 240 updates (a copy, resumed with a larger cap)
#   bash experiments/study/run.sh k32 [NAME...]  # C1, C2, C9: the base and the trained models on c1c2's 64 problems, 32 samples
#   bash experiments/study/run.sh c4 [NAME...]   # C4: forgetting, the base, GRPO and ES (240 updates) on 64 Countdown problems
#                                          (NAME: base grpo es-240 es-160 c9 c9-reverse es grpo-s1 grpo-s2; default: all for k32,
#                                          base grpo es-240 for c4)
#   bash experiments/study/run.sh n30 [SEED...]  # C1, C2 at the paper's N = 30: ES (40 updates) then GRPO (36 steps) per
#                                          run.seed (default 0 1 2), one run at a time on one thread, each resumed if it
#                                          exists; refused while claims.toml has uncommitted changes (the tests must be
#                                          declared before their data); each run records the claims file's sha256
#   bash experiments/study/run.sh collect  # copy the committed files (configs, logs, seed logs, eval JSON, analyses) from OUT to
#                                          docs/study/ (PUBLISH: another destination), the one stage that publishes
#   bash experiments/study/run.sh twins    # which held-out arithmetic problems had their commutative twin in training (docs/study/analyses/twins/)
#   bash experiments/study/run.sh report   # regenerate docs/REPRODUCTION.md from docs/study/ (evolm report --study)
#
# Every stage writes only under OUT (default runs/study; OUT=/tmp/x bash experiments/study/run.sh c1c2 leaves runs/
# and docs/ untouched: every run's run.out_dir is set to OUT); `collect` copies OUT's small files to docs/study/,
# `twins` and `report` regenerate docs/ from the committed files. tests/test_study_commands.py runs every stage the
# claims' commands name into a temporary OUT with a stand-in interpreter and checks that what `collect` copies holds
# every file the claims read.
# Every stage skips what is already done; training runs resume what was stopped (evolm ... --resume),
# the analyses (c3, c5, q2: minutes to an hour) start again if killed, so the script can be run again
# after a kill. Budgets: each claim's `cost` in experiments/study/claims.toml
# (shown on docs/REPRODUCTION.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-runs/study}
mkdir -p "$OUT"

# run_or_resume KIND CONFIG NAME: start the run, or resume it if its directory exists (a finished run
# with the same budget has nothing to do and changes no file).
run_or_resume() {
  local kind=$1 config=$2 name=$3
  if [ -d "$OUT/$name" ]; then
    "$PY" -m evolm "$kind" --resume "$OUT/$name" --set run.progress=false   # the run's own config.toml
  else
    "$PY" -m evolm "$kind" --config "$config" --set "run.out_dir=\"$OUT\"" --set run.progress=false
  fi
}

weights() {  # weights RUN: rebuild an ES run's final/ from its seed log (evolm replay) when it is missing, e.g. after a copy from docs/study/
  [ -d "$1/final" ] || "$PY" -m evolm replay "$1" --out "$1/final"
}

side_by_side() {  # side_by_side PREFIX: PREFIX-es and PREFIX-grpo at once, one thread each, on the same budget of update seconds
  run_or_resume es "experiments/study/$1-es.toml" "$1-es" > "$OUT/$1-es.log" 2>&1 &
  local es_pid=$!
  run_or_resume grpo "experiments/study/$1-grpo.toml" "$1-grpo" > "$OUT/$1-grpo.log" 2>&1 &
  local grpo_pid=$!
  wait $es_pid; wait $grpo_pid
}

c1c2() {
  side_by_side c1c2
  "$PY" experiments/study/matched.py "$OUT/c1c2-es" "$OUT/c1c2-grpo" --out "$OUT/matched"   # ES at GRPO's rollouts, evaluated like the runs
  local a="$OUT/analyses/c1c2"
  [ -f "$a/drift.json" ] || "$PY" -m evolm analyze drift --trained es="$OUT/c1c2-es" --trained grpo="$OUT/c1c2-grpo" --out "$a"
  [ -f "$a/localisation.json" ] || "$PY" -m evolm analyze localisation --trained es="$OUT/c1c2-es" --trained grpo="$OUT/c1c2-grpo" --out "$a"
  [ -f "$a/sparsity.json" ] || "$PY" -m evolm analyze sparsity --trained es="$OUT/c1c2-es" --trained grpo="$OUT/c1c2-grpo" --no-eval --out "$a"
}

seed_run() {  # seed_run KIND CONFIG NAME SEED LIKE: CONFIG with run.seed = SEED as run NAME (resumed if it exists; its
  # training prompts, rollouts and own held-out problems change with the seed), then evaluated with `evolm eval --like`
  # on run LIKE's held-out problems into matched/NAME, where the seed-0 runs it is compared with were measured
  local kind=$1 config=$2 name=$3 seed=$4 like=$5
  if [ -d "$OUT/$name" ]; then "$PY" -m evolm "$kind" --resume "$OUT/$name" --set run.progress=false
  else "$PY" -m evolm "$kind" --config "$config" --set "run.seed=$seed" --set "run.name=\"$name\"" \
    --set "run.out_dir=\"$OUT\"" --set run.progress=false; fi
  [ -f "$OUT/matched/$name/eval.json" ] || "$PY" -m evolm eval --like "$OUT/$like" --model "$OUT/$name" --no-progress \
    --out "$OUT/matched/$name"
}

single() {  # single NAME: one ES run of experiments/study/NAME.toml
  run_or_resume es "experiments/study/$1.toml" "$1" > "$OUT/$1.log" 2>&1
}

# evaluate NAME SPEC OUTDIR ARGS...: `evolm eval` of the model SPEC (an embedded name, or a study run whose
# final/ is used once the run has finished) into OUTDIR, unless done or the run is not finished yet
evaluate() {
  local name=$1 model=$2 out=$3; shift 3
  if [ "$model" != smollm2-135m ]; then
    [ -f "$OUT/$model/eval_after.json" ] || { echo "$name: $model not finished yet, skipped"; return 0; }
    model="$OUT/$model"
  fi
  [ -f "$out/eval.json" ] || "$PY" -m evolm eval --model "$model" "$@" --threads 1 --no-progress --out "$out"
}

# the models the evaluation stages measure, NAME:RUN (the base is the embedded model)
MODELS="base:smollm2-135m grpo:c1c2-grpo es-240:c2-es-240 es-160:c2-es-long c9:c9-pipeline-grpo-es c9-reverse:c9-pipeline-es-grpo es:c1c2-es grpo-s1:c1-grpo-seed1 grpo-s2:c1-grpo-seed2"

# each_model STAGE FUNCTION [NAME...]: FUNCTION NAME RUN for the named models (default: all of MODELS)
each_model() {
  local fn=$1 m; shift
  for m in $MODELS; do
    if [ $# -eq 0 ] || [[ " $* " == *" ${m%%:*} "* ]]; then "$fn" "${m%%:*}" "${m#*:}"; fi
  done
}

k32_one() {  # pass@32 (the paper's largest k): c1c2's 64 held-out problems, 32 samples (~15-20 min per model)
  evaluate "$1" "$2" "$OUT/k32/$1" --like "$OUT/c1c2-es" --n 32 --k 1,2,4,8,16,32 >> "$OUT/k32.log" 2>&1
}

c4_one() {  # forgetting: Countdown (not trained on), 64 problems x 16 samples at the study's 24 tokens (~6 min per model)
  evaluate "$1" "$2" "$OUT/forgetting/countdown-$1" --tasks countdown --limit 64 --n 16 --k 1,2,4,8,16 --seed 0 \
    --max-new-tokens 24 >> "$OUT/c4.log" 2>&1
}

# n30 budget overrides, for a smoke run only (tests/test_study_smoke.py): each one set in the environment replaces the
# config's value when a run starts; unset (as in every command the page prints), the configs' declared budgets run
# (ES: 40 updates of N = 30 on 16 prompts; GRPO: 36 steps; 64 held-out problems). ITERATIONS, POPULATION and
# PROMPTS are ES's (es.iterations, es.population, es.prompts_per_iteration), STEPS is GRPO's (grpo.steps), EVAL_COUNT
# both's held-out problems (eval.count).
n30_budget() {  # n30_budget KIND: the --set flags of the overrides set for KIND (es or grpo)
  local kind=$1
  if [ "$kind" = es ]; then
    [ -z "${ITERATIONS:-}" ] || echo "es.iterations=$ITERATIONS"
    [ -z "${POPULATION:-}" ] || echo "es.population=$POPULATION"
    [ -z "${PROMPTS:-}" ] || echo "es.prompts_per_iteration=$PROMPTS"
  else
    [ -z "${STEPS:-}" ] || echo "grpo.steps=$STEPS"
  fi
  [ -z "${EVAL_COUNT:-}" ] || echo "eval.count=$EVAL_COUNT"
}

# n30_one KIND SEED: n30-KIND-sSEED from experiments/study/c1c2n30-KIND.toml with run.seed = SEED (resumed if it exists)
n30_one() {
  local kind=$1 seed=$2 name="n30-$1-s$2" budget=() b
  for b in $(n30_budget "$kind"); do budget+=(--set "$b"); done
  if [ -d "$OUT/$name" ]; then "$PY" -m evolm "$kind" --resume "$OUT/$name" --set run.progress=false
  else "$PY" -m evolm "$kind" --config "experiments/study/c1c2n30-$kind.toml" --set "run.seed=$seed" \
    --set "run.name=\"$name\"" --set "run.out_dir=\"$OUT\"" --set run.progress=false ${budget[@]+"${budget[@]}"}; fi \
    > "$OUT/$name.log" 2>&1
}

case "${1:-}" in
  c1c2) c1c2 ;;
  n30) shift
      if ! git diff --quiet HEAD -- experiments/study/claims.toml; then
        echo "run.sh n30: experiments/study/claims.toml has uncommitted changes; commit the declaration before its runs start" >&2
        exit 2
      fi
      export EVOLM_RECORD_FILES=experiments/study/claims.toml   # each run records the declaration it started under
      for s in ${*:-0 1 2}; do n30_one es "$s"; n30_one grpo "$s"; done ;;
  c1seeds) shift; seeds=${*:-1 2}
      # c1c2-grpo.toml with another root seed, two at once, one thread each on 2,400 s of update time as c1c2 ran;
      # then evaluated on c1c2's problems
      for s in $seeds; do
        seed_run grpo experiments/study/c1c2-grpo.toml "c1-grpo-seed$s" "$s" c1c2-es > "$OUT/c1-grpo-seed$s.log" 2>&1 &
      done
      wait ;;
  cd) side_by_side cd ;;   # C1/C2 on procedural Countdown, 1,200 s of update time each
  seeds) shift; seeds=${*:-1}
      # a second seed where one setting had one: GRPO on Countdown (cd-grpo.toml, 1,200 s of update time) and the
      # GRPO -> ES pipeline (c9-pipeline-grpo-es.toml, 18 + 31 updates), side by side, one thread each; then each
      # evaluated on its seed-0 counterpart's problems (cd-grpo's, c1c2's)
      for s in $seeds; do
        seed_run grpo experiments/study/cd-grpo.toml "cd-grpo-seed$s" "$s" cd-grpo > "$OUT/cd-grpo-seed$s.log" 2>&1 &
        seed_run pipeline experiments/study/c9-pipeline-grpo-es.toml "c9-pipeline-grpo-es-seed$s" "$s" c1c2-es \
          > "$OUT/c9-pipeline-grpo-es-seed$s.log" 2>&1 &
        wait
      done ;;
  q1) single q1-es-norm-attention
      "$PY" experiments/study/at_step.py "$OUT/c1c2-es" 30 "$OUT/matched/c1c2-es-at-30" ;;
  c8) single c8-es-antithetic
      "$PY" experiments/study/at_step.py "$OUT/c1c2-es" 30 "$OUT/matched/c1c2-es-at-30" ;;
  c9) for order in grpo-es es-grpo; do   # the two orders one after the other
        run_or_resume pipeline "experiments/study/c9-pipeline-$order.toml" "c9-pipeline-$order" > "$OUT/c9-pipeline-$order.log" 2>&1
      done
      # the control: the ES -> GRPO pipeline's GRPO stage run alone from the base (its own config: seed, 18 steps),
      # then evaluated on the pipeline's held-out problems; what is left between the two is the ES stage's doing
      c="$OUT/c9-control-grpo"
      if [ ! -f "$c/final/config.json" ]; then
        if [ -d "$c" ]; then "$PY" -m evolm grpo --resume "$c" --set run.progress=false
        else "$PY" -m evolm grpo --config "$OUT/c9-pipeline-es-grpo/stages/01-grpo/config.toml" --set probe.every=0 \
          --set "run.out_dir=\"$OUT\"" --set 'run.name="c9-control-grpo"' --set run.progress=false; fi > "$OUT/c9-control-grpo.log" 2>&1
      fi
      [ -f "$OUT/matched/c9-control-grpo/eval.json" ] || "$PY" -m evolm eval --like "$OUT/c9-pipeline-es-grpo" --model "$c" \
        --no-progress --out "$OUT/matched/c9-control-grpo" >> "$OUT/c9-control-grpo.log" 2>&1 ;;
  c7) # the two sweeps at once, one thread each; re-running resumes unfinished points. A sweep skips a point only when
      # its run finished with its final/ weights, so a point copied back from docs/study/ (no weights) first gets
      # final/ rebuilt from its seed log (evolm replay, a minute or two) instead of being trained again
      for m in smollm2:10,20,30 gemma:10,20,30; do
        ( for d in "$OUT/c7-${m%%:*}"/es.population=*; do
            if [ -f "$d/eval_after.json" ]; then weights "$d"; fi
          done
          "$PY" -m evolm sweep --config "experiments/study/c7-${m%%:*}.toml" --grid "es.population=${m#*:}" \
            --set run.progress=false --out "$OUT/c7-${m%%:*}" ) > "$OUT/c7-${m%%:*}.log" 2>&1 &
      done
      wait ;;
  c7x) # C7 continued: bash experiments/study/run.sh c7x [UPDATES [N...]] copies the N points (default 10 30, the ones
      # the tests compare) of both sweeps to c7x-<model>/ and resumes the copies to UPDATES (default 40) with evolm es
      # --resume (as c2long does: the 20-update sweeps stay as they are), final/ rebuilt from the seed log first where
      # it is missing; the two models side by side, one thread each. A copy's 20-update evaluation stays beside it as
      # eval_after_step20.json.
      n=${2:-40}; shift $(( $# > 1 ? 2 : $# )); points=${*:-10 30}
      for m in smollm2 gemma; do
        ( for p in $points; do
            src="$OUT/c7-$m/es.population=$p" d="$OUT/c7x-$m/es.population=$p"
            [ -f "$src/run.json" ] || { echo "$src: not run yet (bash $0 c7 first)"; continue; }
            [ -d "$d" ] || { mkdir -p "$OUT/c7x-$m"; cp -r "$src" "$d"; }
            weights "$d"
            "$PY" -m evolm es --resume "$d" --set es.iterations="$n" --set run.progress=false
          done ) > "$OUT/c7x-$m.log" 2>&1 &
      done
      wait ;;
  c3) [ -f "$OUT/analyses/c3/diversity.json" ] || "$PY" -m evolm analyze diversity --model "$OUT/c1c2-es" --count 64 \
        --samples-per-member 4 --threads 1 --out "$OUT/analyses/c3"
      if [ -d "$OUT/c2-es-long/final" ]; then   # the same around update 160, after c2long
        [ -f "$OUT/analyses/c3-at-160/diversity.json" ] || "$PY" -m evolm analyze diversity --model "$OUT/c2-es-long" \
          --count 64 --samples-per-member 4 --threads 1 --out "$OUT/analyses/c3-at-160"
      fi
      if [ -f "$OUT/c2-es-240/eval_after.json" ]; then   # and around update 240, after c2xl
        [ -f "$OUT/analyses/c3-at-240/diversity.json" ] || "$PY" -m evolm analyze diversity --model "$OUT/c2-es-240" \
          --count 64 --samples-per-member 4 --threads 1 --out "$OUT/analyses/c3-at-240"
      fi
      # Gemma-3-270M after 20 updates at N = 30 (c7), where ES moved pass@1 most: its whole 1-digit test split (23
      # problems), 8 members as above; the centre's weights are rebuilt from the seed log if final/ is gone
      g="$OUT/c7-gemma/es.population=30"
      if [ -f "$g/eval_after.json" ] && [ ! -f "$OUT/analyses/c3-gemma/diversity.json" ]; then
        weights "$g"
        "$PY" -m evolm analyze diversity --model "$g" --population 8 --count 23 --samples-per-member 4 --threads 1 \
          --out "$OUT/analyses/c3-gemma"
      fi ;;
  c5) [ -f "$OUT/analyses/c5/sparsity.json" ] || "$PY" -m evolm analyze sparsity --trained es="$OUT/c1c2-es" \
        --trained grpo="$OUT/c1c2-grpo" --threads 1 --out "$OUT/analyses/c5"
      # after 240 ES updates (c2xl), sampled: pass@1 and pass@16 of the masked models, 16 samples per problem
      g="$OUT/c2-es-240"
      if [ -f "$g/eval_after.json" ] && [ ! -f "$OUT/analyses/c5-240/sparsity.json" ]; then
        weights "$g"
        "$PY" -m evolm analyze sparsity --trained es="$g" --multipliers 1,2,4,8 --n 16 --pass-k 1 --pass-k 16 \
          --metric pass@1 --threads 1 --out "$OUT/analyses/c5-240"
      fi ;;
  q2) [ -f "$OUT/analyses/q2/compression.json" ] || "$PY" -m evolm analyze compression --trained es="$OUT/c1c2-es" \
        --trained grpo="$OUT/c1c2-grpo" --methods none,int8,int4 --n 16 --pass-k 1 --pass-k 16 --threads 1 --out "$OUT/analyses/q2"
      # then group-wise int4 (GPTQ/AWQ's layout: one scale per 128 inputs of a row) and 25% global magnitude pruning,
      # where per-channel int4 took every model to near zero: c1c2-es (weights rebuilt from its seed log) against the
      # GRPO run of seed 1 (c1seeds stage; c1c2-grpo's own weights are not committed and GRPO has no seed log to
      # replay), on c1c2's 64 problems (the first --trained run's held-out problems)
      g="$OUT/c1-grpo-seed1"
      if [ -f "$g/eval_after.json" ] && [ ! -f "$OUT/analyses/q2-groups/compression.json" ]; then
        weights "$OUT/c1c2-es"
        "$PY" -m evolm analyze compression --trained es="$OUT/c1c2-es" --trained grpo="$g" --methods none,int4g128,prune:0.25 \
          --n 16 --pass-k 1 --pass-k 16 --threads 2 --out "$OUT/analyses/q2-groups"
      fi
      # the null for ES's rows: the base plus an isotropic Gaussian step as large as ES's in every tensor
      # (experiments/study/null_model.py), compressed and measured beside ES on the same problems
      if [ -f "$OUT/analyses/q2-groups/compression.json" ] && [ ! -f "$OUT/analyses/q2-groups-null/compression.json" ]; then
        weights "$OUT/c1c2-es"
        "$PY" experiments/study/null_model.py "$OUT/c1c2-es" "$OUT/models/null-c1c2-es" --seed 0
        "$PY" -m evolm analyze compression --trained es="$OUT/c1c2-es" --trained null="$OUT/models/null-c1c2-es" \
          --methods none,int4g128,prune:0.25 --n 16 --pass-k 1 --pass-k 16 --threads 2 --out "$OUT/analyses/q2-groups-null"
      fi ;;
  c2long) [ -d "$OUT/c2-es-long" ] || cp -r "$OUT/c1c2-es" "$OUT/c2-es-long"   # the same run, continued in its own directory
      "$PY" -m evolm es --resume "$OUT/c2-es-long" --set run.budget=4800 --set run.progress=false > "$OUT/c2-es-long.log" 2>&1 ;;
  c2xl) [ -d "$OUT/c2-es-240" ] || cp -r "$OUT/c2-es-long" "$OUT/c2-es-240"   # needs c2long first
      "$PY" -m evolm es --resume "$OUT/c2-es-240" --set es.iterations=240 --set run.budget=100000 \
        --set run.progress=false > "$OUT/c2-es-240.log" 2>&1 ;;
  k32) shift; each_model k32_one "$@" ;;
  c4) shift; each_model c4_one "${@:-base grpo es-240}"
      if [ -f "$OUT/c2-es-240/eval_after.json" ] && [ ! -f "$OUT/analyses/c4/drift.json" ]; then   # drift after 240 updates
        "$PY" -m evolm analyze drift --trained es="$OUT/c2-es-240" --trained grpo="$OUT/c1c2-grpo" --out "$OUT/analyses/c4"
      fi ;;
  collect) "$PY" experiments/study/collect.py "$OUT" "${PUBLISH:-docs/study}" ;;
  twins) "$PY" experiments/study/twins.py docs/study docs/study/analyses/twins/twins.json ;;  # seconds, from the committed files
  report) "$PY" -m evolm report --study experiments/study/claims.toml --out docs ;;
  *) echo "usage: $0 c1c2 | n30 [SEED...] | c1seeds [SEED...] | cd | seeds [SEED...] | q1 | c8 | c9 | c7 | c7x [UPDATES [N...]] | c3 | c5 | q2 | c2long | c2xl | k32 [NAME...] | c4 [NAME...] | collect | twins | report" >&2; exit 2 ;;
esac
