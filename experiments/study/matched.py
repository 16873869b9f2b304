"""ES at GRPO's rollout budget: the comparison at equal generated sequences, from two finished runs.

The C1/C2 runs are matched on update seconds (``run.match = "seconds"``); ES generates far more
sequences per second than GRPO (no backward pass), so at equal seconds ES has also seen far more
rollouts. The rollout-matched point is an ES update the run already made: the first update at which
its running total of generated sequences reaches GRPO's whole-run total (an overshoot of less than
one update, stated in the output). That update's weights are rebuilt bit-identically from the seed
log (``evolm replay``) and measured exactly as the runs measured ``eval_after.json``
(``evolm eval --like``), so the two evaluations are paired problem by problem.

    python experiments/study/matched.py runs/study/c1c2-es runs/study/c1c2-grpo [--out runs/study/matched]

Writes OUT/es-at-grpo-sequences/{eval.json, eval.md, passk.png}; ``eval.json`` carries a ``matched``
block (the two runs, GRPO's sequences and tokens, the ES update chosen and what it had spent). Skips
the work when that file exists.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from evolm.evaluate import write_outputs
from evolm.heldout import evaluate_like
from evolm.jobs import replay_run
from evolm.runs import RunDir


def matched_step(es: RunDir, sequences: int) -> dict:
    """The first ES training record whose running total of generated sequences reaches ``sequences``."""
    records = es.train_records()
    for r in records:
        if int(r.get("gen_sequences_total") or 0) >= sequences:
            return r
    raise SystemExit(f"{es.path} generated {records[-1].get('gen_sequences_total') if records else 0} sequences in all, "
                     f"fewer than GRPO's {sequences}: no rollout-matched ES update exists")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("es_run")
    ap.add_argument("grpo_run")
    ap.add_argument("--out", default="runs/study/matched")
    args = ap.parse_args(argv)
    es, grpo = RunDir.open(args.es_run), RunDir.open(args.grpo_run)
    target = Path(args.out) / "es-at-grpo-sequences"
    if (target / "eval.json").exists():
        print(f"{target / 'eval.json'} exists: nothing to do")
        return 0
    for run in (es, grpo):
        if run.state() != "finished":
            raise SystemExit(f"{run.path} has not finished; finish it first (evolm ... --resume {run.path})")
    g_last = grpo.train_records()[-1]
    sequences = int(g_last["gen_sequences_total"])
    r = matched_step(es, sequences)
    step = int(r["step"])
    model_dir = target / "model"
    replay_run(es.path, step, model_dir)
    report = evaluate_like(es.path, str(model_dir), progress=False)
    report["matched"] = {
        "es_run": str(es.path), "grpo_run": str(grpo.path), "on": "gen_sequences_total",
        "grpo_updates": int(g_last["step"]), "grpo_sequences": sequences,
        "grpo_tokens": int(g_last.get("gen_tokens_total") or 0), "grpo_seconds": float(g_last.get("seconds_total") or 0),
        "es_update": step, "es_sequences": int(r["gen_sequences_total"]),
        "es_tokens": int(r.get("gen_tokens_total") or 0), "es_seconds": float(r.get("seconds_total") or 0),
        "rule": "the first ES update whose running total of generated sequences reaches GRPO's whole-run total",
    }
    write_outputs(report, target)
    shutil.rmtree(model_dir)  # rebuildable: evolm replay ES_RUN --step N
    print(json.dumps(report["matched"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
