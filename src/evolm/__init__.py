"""evolm: post-train language models with Evolution Strategies on verifiable rewards, and measure
what ES and GRPO each do to a model (pass@k coverage, entropy, drift, sparsity, localisation).

The public API, in TRL's shape (``evolm.trainer``; docs/custom-tasks.md)::

    from evolm import ESTrainer, ESConfig          # GRPOTrainer, GRPOConfig: the GRPO baseline, same arguments
    ESTrainer(model="smollm2-135m", reward_funcs=[my_reward], args=ESConfig(output_dir="runs/mine"),
              train_dataset=rows).train()

and underneath, ask/tell ES for your own generation loop (``evolm.es.ask_tell.AskTell``), a task of
your own (``evolm.Task``, ``evolm.Example``, ``evolm.Verdict``) and the run directory (``evolm.RunDir``).
Names are imported on first use, so ``import evolm`` (and ``evolm --help``) stays light.
"""

__version__ = "0.1.0"

_EXPORTS = {
    "ESTrainer": "evolm.trainer", "ESConfig": "evolm.trainer", "GRPOTrainer": "evolm.trainer",
    "GRPOConfig": "evolm.trainer", "TrainOutput": "evolm.trainer", "AskTell": "evolm.es.ask_tell",
    "Task": "evolm.tasks.base", "Example": "evolm.tasks.base", "Verdict": "evolm.rewards", "RunDir": "evolm.runs",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'evolm' has no attribute '{name}'")
