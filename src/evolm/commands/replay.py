"""``evolm replay RUN_DIR --step N``: an ES run's weights at any update, rebuilt from its seed log
(``jobs.replay_run``), so a run saved with ``run.save = "final"`` or ``"none"`` loses no weights."""

from __future__ import annotations

import argparse


def register(sub) -> None:
    p = sub.add_parser(
        "replay", help="rebuild an ES run's weights at any update from its seed log",
        description="Load the ES run's base model (its model.spec, as the run loaded it) and re-apply the updates "
                    "1..N logged in seed_log.jsonl; write the float32 weights as a Hugging Face model directory, "
                    "bit-identical to what the run had after update N (its checkpoint, or final/ for the last update). "
                    "Use it for runs saved with run.save = 'final' or 'none', or for a step whose checkpoint was "
                    "deleted. The output loads like any model: evolm eval --model DIR, evolm analyze --trained DIR.",
        epilog="example: evolm replay runs/es-demo --step 6 --out runs/es-demo-step6",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", metavar="RUN_DIR", help="an ES run directory (config.toml + seed_log.jsonl)")
    p.add_argument("--step", type=int, default=None, help="updates to apply (default: every logged update)")
    p.add_argument("--out", "-o", metavar="DIR", help="model directory to write (default: RUN_DIR/replay/step_NNNNNN)")
    p.add_argument("--device", default=None, help="torch device (default: the run's model.device)")
    p.set_defaults(func=run)


def run(args) -> int:
    from evolm.jobs import replay_run  # torch: imported when the verb runs

    print(f"wrote {replay_run(args.run_dir, args.step, args.out, device=args.device)}")
    return 0
