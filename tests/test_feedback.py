"""What the training verbs print: the run directory first (so a killed run can be resumed from what the
terminal shows), the held-out before/after table last; the demo's closing lines say what the numbers
mean (held-out problems vs each update's own training minibatch)."""

from __future__ import annotations

import pytest

from conftest import make_tiny_model
from evolm import config
from evolm.commands import main
from evolm.runs import RunDir


def _model_dir(tmp_path, tokenizer):
    base = tmp_path / "base"
    make_tiny_model(tokenizer).save_pretrained(base)
    tokenizer.save_pretrained(base)
    return base


EVAL = {"count": 2, "n_samples": 2, "k": [1, 2], "max_new_tokens": 4, "temperature": 0.7}


def _check_order(out: str, run_dir) -> list[str]:
    lines = [line for line in out.splitlines() if line.strip()]
    assert lines[0] == f"[evolm] run directory: {run_dir}", lines[:3]
    assert lines[-6].startswith("held-out metric") and lines[-5].startswith("greedy accuracy")
    assert lines[-4].startswith("pass@1 (T=0.7)") and lines[-1].startswith("distinct correct answers")
    assert "problems never trained on, the same before and after" in lines[-7]
    return lines


def test_es_prints_its_run_directory_first_and_the_before_after_table_last(tmp_path, tokenizer, capsys):
    cfg = config.from_dict(config.ESJob, {
        "run": {"out_dir": str(tmp_path), "name": "es", "progress": False, "checkpoint_every": 0},
        "model": {"spec": str(_model_dir(tmp_path, tokenizer))}, "task": {"name": "arithmetic"},
        "generation": {"max_new_tokens": 4}, "es": {"population": 2, "prompts_per_iteration": 2, "iterations": 1},
        "eval": EVAL})
    (tmp_path / "es.toml").write_text(config.to_toml(cfg))
    capsys.readouterr()
    assert main(["es", "--config", str(tmp_path / "es.toml")]) == 0
    _check_order(capsys.readouterr().out, tmp_path / "es")


def test_pipeline_prints_its_run_directory_first_and_the_before_after_table_last(tmp_path, tokenizer, capsys):
    pytest.importorskip("trl")
    from evolm.pipeline import PipelineJob

    cfg = config.from_dict(PipelineJob, {
        "run": {"out_dir": str(tmp_path), "name": "p", "progress": False, "checkpoint_every": 0},
        "model": {"spec": str(_model_dir(tmp_path, tokenizer))}, "task": {"name": "arithmetic"},
        "generation": {"max_new_tokens": 4}, "es": {"population": 2, "prompts_per_iteration": 2},
        "grpo": {"num_generations": 2, "prompts_per_step": 1, "max_completion_length": 4},
        "pipeline": {"budget": 2, "stages": ["grpo:1", "es:1"]}, "eval": EVAL})
    (tmp_path / "p.toml").write_text(config.to_toml(cfg))
    capsys.readouterr()
    assert main(["pipeline", "--config", str(tmp_path / "p.toml")]) == 0
    lines = _check_order(capsys.readouterr().out, tmp_path / "p")
    assert sum(line.startswith("[evolm] run directory: ") for line in lines) == 3, "the pipeline, then each stage"


def test_demo_closing_lines_label_the_training_reward_as_minibatch_values(tmp_path, tokenizer):
    from evolm.commands.demo import meaning_lines

    run = RunDir.create(tmp_path, "demo", config.to_toml(config.ESJob()), kind="es")
    for step, reward in ((1, 0.351), (2, 0.4), (3, 0.526)):
        run.log_metrics({"step": step, "kind": "train", "reward_mean": reward})
    run.write_json("eval_after.json", {"task": "arithmetic", "summary": {"problems": 32}})
    cfg = config.ESJob()
    lines = meaning_lines(run, cfg)
    assert lines[0] == "What these numbers mean:"
    assert "32 test problems the run never trained on, the same problems before and after" in lines[1]
    assert "one problem is 0.031 of greedy accuracy" in lines[1]
    assert "each update's own minibatch of 32 training prompts" in lines[2]
    assert "not a before/after comparison: update 1 0.351, update 3 0.526, mean over the 3 updates 0.426" in lines[2]
    assert lines[-1].startswith(f"- everything is in {run.path}")
