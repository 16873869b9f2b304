"""Copy what the study commits from its run directories into docs/study/: never weights.

    python experiments/study/collect.py runs/study docs/study

Per run directory (one with a ``run.json``): ``config.toml``, ``config_history.jsonl``, ``run.json``,
``metrics.jsonl``, ``seed_log.jsonl`` (an ES run's weights at any update are rebuilt from it with
``evolm replay`` on top of the base model its ``run.json`` fingerprints), ``eval_before.json``,
``eval_after.json``, earlier ``eval_after_step<M>.json`` of a continued run, and the plots. Per other directory: the ``*.json``, ``*.md`` and ``*.png`` files
(analyses, rollout-matched evaluations). Weights (``final/``, ``checkpoints/``, ``model/``, ``replay/`` and
any directory holding weight files, such as an analysis's ``base/``) and logs of progress bars stay behind.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

RUN_FILES = ("config.toml", "config_history.jsonl", "run.json", "metrics.jsonl", "seed_log.jsonl",
             "eval_before.json", "eval_after.json")
"""The files of a run directory the study commits."""
RETIRED_EVALS = "eval_after_step*.json"
"""A continued run's earlier end-of-run evaluations (``evolm ... --resume`` moves them aside)."""
SKIP_DIRS = {"final", "checkpoints", "model", "replay", "tensorboard", "wandb"}
"""Directories that hold weights or tracker output: never committed."""
WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt", "*.gguf")
"""Any other directory holding one of these is a saved model (e.g. an analysis's base/): skipped too."""


def holds_weights(d: Path) -> bool:
    return any(next(d.glob(pattern), None) is not None for pattern in WEIGHT_FILES)


def collect(src: Path, dst: Path) -> list[Path]:
    written = []
    for d in sorted(p for p in src.rglob("*") if p.is_dir() and not (SKIP_DIRS & set(p.relative_to(src).parts))):
        rel = d.relative_to(src)
        if holds_weights(d) or any(holds_weights(p) for p in d.parents if src in p.parents):
            continue
        if (d / "run.json").exists():
            names = [d / f for f in RUN_FILES if (d / f).exists()] + sorted(d.glob(RETIRED_EVALS)) \
                + sorted((d / "plots").glob("*.png"))
        else:
            names = [f for f in sorted(d.iterdir()) if f.is_file() and f.suffix in (".json", ".md", ".png")]
        for f in names:
            out = dst / rel / f.relative_to(d)
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, out)
            written.append(out)
    return written


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python experiments/study/collect.py RUNS_DIR DOCS_DIR")
    files = collect(Path(sys.argv[1]), Path(sys.argv[2]))
    print(f"copied {len(files)} files to {sys.argv[2]}")
