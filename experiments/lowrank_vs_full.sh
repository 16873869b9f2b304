#!/usr/bin/env bash
# Low-rank (EGGROLL, rank 4) vs full-rank ES on SmolLM2-135M-Instruct, 2-digit addition
# (configs/es-arithmetic.toml: N = 8, sigma 1e-3, lr 5e-4, 32 prompts per update, 20 updates):
#   1. equal member evaluations: `full` and `lowrank`, 20 updates each, side by side (one thread each,
#      so both see the same machine load);
#   2. equal wall-clock: `lowrank-wall`, a low-rank run given as many updates as fit in the seconds the
#      full-rank run spent on its 20 updates, at the low-rank run's measured seconds per update
#      (skipped when that is 20: then `lowrank` is that run). Its first updates are the `lowrank` run's,
#      bit for bit (same keys), which the script checks on the seed logs;
#   3. drift, localisation (top-k coordinates; rerun with the null model once it lands) and the
#      sparsity counts, one report, a reward-vs-seconds figure, and a copy of the small files
#      (configs, metrics, seed logs, eval JSON; never weights) under docs/lowrank-experiment/.
#   bash experiments/lowrank_vs_full.sh          # writes runs/lowrank/ (about 2-3 hours on the shared 2-core machine)
#   OUT=/tmp/smoke DOCS=/tmp/smoke/docs ITER=2 EXTRA="es.prompts_per_iteration=4 eval.count=4 probe.every=0" bash experiments/lowrank_vs_full.sh
# Every step is resumable: re-running skips finished runs (and `evolm es --resume` continues a killed one).
set -euo pipefail
cd "$(dirname "$0")/.."
EVOLM=${EVOLM:-.venv/bin/evolm}
PY=${PY:-.venv/bin/python}
OUT=${OUT:-runs/lowrank}
DOCS=${DOCS:-docs/lowrank-experiment}
CONFIG=configs/es-arithmetic.toml
ITER=${ITER:-20}      # updates of the equal-evaluations runs
EXTRA=${EXTRA:-}      # more --set overrides for every run (a smoke test: EXTRA="es.prompts_per_iteration=4 eval.count=4")
mkdir -p "$OUT"

train() {  # train NAME [--set KEY=VALUE ...]
  local name=$1; shift
  if grep -qs '"status": "finished"' "$OUT/$name/run.json"; then echo "$name: done"; return; fi
  if [ -f "$OUT/$name/config.toml" ]; then "$EVOLM" es --resume "$OUT/$name"; return; fi
  local extra=()
  for kv in $EXTRA; do extra+=(--set "$kv"); done
  "$EVOLM" es --config "$CONFIG" --set "run.out_dir='$OUT'" --set "run.name='$name'" --set run.progress=false \
    --set "es.iterations=$ITER" "${extra[@]}" "$@"
}

# 1. equal member evaluations
train full > "$OUT/full.log" 2>&1 &
train lowrank --set es.perturbation=lowrank > "$OUT/lowrank.log" 2>&1 &
wait

# 2. equal wall-clock: updates = full's update seconds / lowrank's seconds per update
WALL=$("$PY" - "$OUT" <<'EOF'
import sys
from evolm.runs import RunDir
def train(name):
    return [r for r in RunDir(f"{sys.argv[1]}/{name}").metrics() if r.get("kind") == "train"]
full, low = train("full"), train("lowrank")
print(max(1, round(sum(r["seconds"] for r in full) / (sum(r["seconds"] for r in low) / len(low)))))
EOF
)
echo "equal wall-clock: $WALL low-rank updates"
RUNS=(full lowrank)
if [ "$WALL" != "$ITER" ]; then
  train lowrank-wall --set es.perturbation=lowrank --set "es.iterations=$WALL" > "$OUT/lowrank-wall.log" 2>&1
  RUNS+=(lowrank-wall)
  "$PY" - "$OUT" <<'EOF'
import sys
from evolm.runs import RunDir
a, b = (RunDir(f"{sys.argv[1]}/{n}").seed_log() for n in ("lowrank", "lowrank-wall"))
shared = min(len(a), len(b))
same = all(x.get("coefficients") == y.get("coefficients") for x, y in zip(a[1:shared], b[1:shared]))
print(f"lowrank and lowrank-wall share their first {shared - 1} updates bit for bit: {same}")
EOF
fi

# 3. analyses and report
TRAINED=()
for r in "${RUNS[@]}"; do TRAINED+=(--trained "$r=$OUT/$r"); done
"$EVOLM" analyze drift --base smollm2-135m "${TRAINED[@]}" --out "$OUT/analysis"
"$EVOLM" analyze localisation --base smollm2-135m "${TRAINED[@]}" --k 100 --k 144 --out "$OUT/analysis"
for r in "${RUNS[@]}"; do  # counts only: each run thresholded on its own single-update scale
  "$EVOLM" analyze sparsity --base smollm2-135m --trained "$r=$OUT/$r" --no-eval --out "$OUT/analysis/sparsity-$r" \
    || echo "sparsity of $r skipped (no applied update)"
done
"$EVOLM" report "${RUNS[@]/#/$OUT/}" "$OUT/analysis" --out "$OUT/report" \
  --title "Low-rank (rank 4) vs full-rank ES on SmolLM2-135M, 2-digit addition"

"$PY" - "$OUT" "$DOCS" "${RUNS[@]}" <<'EOF'
import shutil, sys
from pathlib import Path

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

from evolm.runs import RunDir

out, docs, names = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
(docs / "figures").mkdir(parents=True, exist_ok=True)
fig, axes = plt.subplots(1, 2, figsize=(11, 4))
for name in names:
    train = [r for r in RunDir(out / name).metrics() if r.get("kind") == "train"]
    steps = [r["step"] for r in train]
    axes[0].plot(steps, [r["reward_mean"] for r in train], marker=".", label=name)
    axes[1].plot([r["seconds_total"] / 60 for r in train], [r["reward_mean"] for r in train], marker=".", label=name)
axes[0].set_xlabel("update (8 members each)")
axes[1].set_xlabel("cumulative update time (min)")
for ax in axes:
    ax.set_ylabel("population mean train reward")
    ax.grid(alpha=0.3)
    ax.legend()
fig.tight_layout()
fig.savefig(docs / "figures" / "reward_vs_updates_and_seconds.png", dpi=110)
for name in names:  # small files only: never weights
    target = docs / "runs" / name
    target.mkdir(parents=True, exist_ok=True)
    for f in ("config.toml", "run.json", "metrics.jsonl", "seed_log.jsonl", "eval_before.json", "eval_after.json"):
        if (out / name / f).exists():
            shutil.copy(out / name / f, target / f)
shutil.copytree(out / "analysis", docs / "analysis", dirs_exist_ok=True,
                ignore=lambda d, files: [f for f in files if f.endswith(".safetensors")])
shutil.copy(out / "report" / "report.md", docs / "report.md")
shutil.copy(out / "report" / "report.json", docs / "report.json")
shutil.copytree(out / "report" / "figures", docs / "figures", dirs_exist_ok=True)
print(f"copied to {docs}")
EOF
