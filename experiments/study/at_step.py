"""An ES run's weights after a given update, measured exactly as the run measured ``eval_after.json``.

The Q1 and C8 runs make a fixed number of updates; the one-point full-parameter ES run they are compared
with (c1c2-es) ran longer, matched on seconds with GRPO. Its weights after the same number of updates are
rebuilt bit-identically from its seed log (``evolm replay``) and evaluated like the runs
(``evolm eval --like``): the same problems, samples and seeds, so the comparison is paired problem by
problem at equal updates and equal rollouts.

    python experiments/study/at_step.py runs/study/c1c2-es 30 runs/study/matched/c1c2-es-at-30

Writes OUT/{eval.json, eval.md, passk.png} (``eval.json`` carries ``matched``: the run, the update and
what it had spent by then); skips the work when OUT/eval.json exists.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from evolm.evaluate import write_outputs
from evolm.heldout import evaluate_like
from evolm.jobs import replay_run
from evolm.runs import RunDir


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        raise SystemExit("usage: python experiments/study/at_step.py ES_RUN STEP OUT_DIR")
    run, step, out = RunDir.open(argv[0]), int(argv[1]), Path(argv[2])
    if (out / "eval.json").exists():
        print(f"{out / 'eval.json'} exists: nothing to do")
        return 0
    record = next((r for r in run.train_records() if int(r["step"]) == step), None)
    if record is None:
        raise SystemExit(f"{run.path} has no update {step} in its metrics.jsonl")
    model_dir = out / "model"
    replay_run(run.path, step, model_dir)
    report = evaluate_like(run.path, str(model_dir), progress=False)
    report["matched"] = {"run": str(run.path), "on": "updates", "update": step,
                         "sequences": int(record.get("gen_sequences_total") or 0),
                         "tokens": int(record.get("gen_tokens_total") or 0),
                         "seconds": float(record.get("seconds_total") or 0)}
    write_outputs(report, out)
    shutil.rmtree(model_dir)  # rebuildable: evolm replay ES_RUN --step STEP
    print(f"wrote {out / 'eval.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
