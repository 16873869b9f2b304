"""Matched budgets (issue 11, item 8): ES and GRPO runs and pipelines can be matched on updates, sequences,
tokens or seconds; one completion length limit on both sides by default; reports show what was matched
and what each side spent."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest

from conftest import make_tiny_model
from evolm import config
from evolm.errors import ConfigError
from evolm.grpo import GRPOJob, completion_limit, trl_args
from evolm.pipeline import PipelineJob, plan_stages, run_pipeline
from evolm.runs import RunDir

ROOT = Path(__file__).parent.parent


# -- config ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("overrides, message", [
    (["run.budget=100"], "run.budget counts sequences"),
    (["run.match='tokens'"], "needs run.budget > 0"),
    (["run.match='flops'", "run.budget=1"], "run.match must be one of"),
])
def test_run_budget_config_errors_name_the_field(overrides, message):
    with pytest.raises(ConfigError, match=message):
        config.from_dict(config.ESJob, {}, overrides)
    assert config.from_dict(config.ESJob, {}, ["run.match='tokens'", "run.budget=5000"]).run.budget == 5000.0


def test_grpo_takes_the_es_length_limit_unless_told_otherwise():
    job = config.from_dict(GRPOJob, {"generation": {"max_new_tokens": 17}})
    assert job.grpo.max_completion_length == 0 and completion_limit(job) == 17
    assert trl_args(job, "/tmp/x")["max_completion_length"] == 17
    job = config.from_dict(GRPOJob, {"generation": {"max_new_tokens": 17}, "grpo": {"max_completion_length": 40}})
    assert trl_args(job, "/tmp/x")["max_completion_length"] == 40


def test_shipped_comparison_uses_one_length_limit_on_both_sides():
    es = config.load(config.ESJob, ROOT / "configs" / "es-arithmetic.toml")
    grpo = config.load(GRPOJob, ROOT / "configs" / "grpo-arithmetic.toml")
    assert es.generation.max_new_tokens == completion_limit(grpo)
    assert es.es.iterations == grpo.grpo.steps  # the default comparison matches updates
    for name in ("pipeline-grpo-es.toml", "pipeline-interleaved.toml"):
        p = config.load(PipelineJob, ROOT / "configs" / name)
        assert p.grpo.max_completion_length == 0  # GRPO stages take generation.max_new_tokens, as ES stages do
    script = (ROOT / "experiments" / "compare_es_grpo.sh").read_text()
    assert "--match" in script and not re.search(r"--set\s+\S*(max_new_tokens|max_completion_length)", script)


def test_pipeline_match_plans_cumulative_targets():
    plan = plan_stages(["grpo:0.25", "es:0.75"], 1000, match="tokens", caps={"es": 50, "grpo": 30})
    assert [(s.method, s.updates, s.target) for s in plan] == [("grpo", 30, 250.0), ("es", 50, 1000.0)]
    with pytest.raises(ConfigError, match="fractions"):
        plan_stages(["grpo:10", "es:10"], 20, match="tokens")
    with pytest.raises(ConfigError, match="interleave"):
        plan_stages(["grpo:0.5", "es:0.5"], 20, interleave=True, match="seconds")
    with pytest.raises(ConfigError, match="pipeline.match"):
        config.from_dict(PipelineJob, {"run": {"match": "tokens", "budget": 10}})


# -- runs that stop on their budget ---------------------------------------------------------------------------

def _es_cfg(tmp_path, name, **run):
    cfg = config.ESJob()
    cfg.run.out_dir, cfg.run.name, cfg.run.progress, cfg.run.checkpoint_every = str(tmp_path), name, False, 2
    for k, v in run.items():
        setattr(cfg.run, k, v)
    cfg.eval.before_after = False
    cfg.generation.max_new_tokens = 8
    cfg.es.population, cfg.es.prompts_per_iteration, cfg.es.iterations = 4, 4, 50
    cfg.es.sigma, cfg.es.lr = 0.02, 0.01
    return cfg


def test_es_stops_once_its_token_budget_is_spent(tmp_path, tokenizer, vowel_task):
    from evolm.backends.hf import HFGenerator
    from evolm.jobs import run_es

    model = make_tiny_model(tokenizer)
    run = run_es(_es_cfg(tmp_path, "tok", match="tokens", budget=300), model=model, tokenizer=tokenizer, task=vowel_task,
                 generator=HFGenerator(model, tokenizer, 16), quiet=True)
    totals = [r["gen_tokens_total"] for r in run.train_records()]
    assert totals[-1] >= 300 and (len(totals) == 1 or totals[-2] < 300), totals
    assert 1 < len(totals) < 50  # 16 sequences x <= 8 tokens per update: a few updates, far below the cap
    assert run.info()["steps"] == len(totals) and run.info()["status"] == "finished"
    assert json.loads((run.path / "final" / "state.json").read_text())["step"] == len(totals)
    assert [r["step"] for r in run.probes()] == [0, len(totals)] or not run.probes()


def test_grpo_stops_once_its_sequence_budget_is_spent(tmp_path, tokenizer, vowel_task):
    from evolm.jobs import run_grpo

    cfg = config.from_dict(GRPOJob, {
        "run": {"out_dir": str(tmp_path), "name": "g", "progress": False, "checkpoint_every": 0,
                "match": "sequences", "budget": 20},
        "generation": {"max_new_tokens": 6}, "eval": {"before_after": False},
        "grpo": {"steps": 10, "num_generations": 4, "prompts_per_step": 2, "lr": 1e-3}})
    run = run_grpo(cfg, model=make_tiny_model(tokenizer), tokenizer=tokenizer, task=vowel_task, quiet=True)
    train = run.train_records()
    assert [r["gen_sequences_total"] for r in train] == [8, 16, 24]  # 8 rollouts per update; stops at the first >= 20
    assert run.info()["steps"] == 3
    assert max(r["gen_tokens"] / r["gen_sequences"] for r in train) <= 6  # the length limit came from [generation]


def test_pipeline_matched_on_tokens_splits_the_budget_by_cumulative_share(tmp_path, tokenizer, vowel_task):
    cfg = config.from_dict(PipelineJob, {
        "run": {"out_dir": str(tmp_path), "name": "p", "checkpoint_every": 0, "progress": False},
        "generation": {"max_new_tokens": 8, "batch_size": 16},
        "es": {"population": 4, "prompts_per_iteration": 4, "sigma": 0.02, "lr": 0.01, "iterations": 30},
        "grpo": {"num_generations": 4, "prompts_per_step": 2, "lr": 1e-3, "steps": 30},
        "eval": {"before_after": False}, "probe": {"every": 0},
        "pipeline": {"budget": 400, "stages": ["grpo:0.5", "es:0.5"], "match": "tokens"}})
    run = run_pipeline(cfg, model=make_tiny_model(tokenizer), tokenizer=tokenizer, task=vowel_task, quiet=True)
    grpo_train = RunDir(run.path / "stages" / "00-grpo").train_records()
    es_train = RunDir(run.path / "stages" / "01-es").train_records()
    g_spent = grpo_train[-1]["gen_tokens_total"]
    assert g_spent >= 200 and (len(grpo_train) == 1 or grpo_train[-2]["gen_tokens_total"] < 200)
    es_budget = tomllib.loads((run.path / "stages" / "01-es" / "config.toml").read_text())["run"]["budget"]
    assert es_budget == pytest.approx(400 - g_spent)  # the ES stage runs to the pipeline's cumulative target
    assert es_train[-1]["gen_tokens_total"] >= es_budget
    combined = [r for r in run.metrics() if r.get("kind") == "train"]
    assert [r["step"] for r in combined] == list(range(1, len(grpo_train) + len(es_train) + 1))
    assert combined[-1]["gen_tokens_total"] == g_spent + es_train[-1]["gen_tokens_total"] >= 400
    assert run.info()["steps"] == len(combined)
    assert RunDir(run.path / "stages" / "01-es").info()["base"]["path"] == "../00-grpo"


# -- the report ----------------------------------------------------------------------------------------------

def test_report_draws_against_the_matched_quantity_and_states_what_each_side_spent(tmp_path, tokenizer, vowel_task):
    from evolm.backends.hf import HFGenerator
    from evolm.jobs import run_es
    from evolm.report import build_report

    runs = []
    for name, extra in (("a", {}), ("b", {"match": "sequences", "budget": 40})):
        cfg = _es_cfg(tmp_path, name, **extra)
        cfg.es.iterations = 4
        model = make_tiny_model(tokenizer)
        runs.append(run_es(cfg, model=model, tokenizer=tokenizer, task=vowel_task,
                           generator=HFGenerator(model, tokenizer, 16), quiet=True))
    out = build_report([str(r.path) for r in runs], tmp_path / "rep", match="sequences")
    report = json.loads(out.json.read_text())
    budget = next(s for s in report["sections"] if s["title"].startswith("Budget"))
    table = budget["tables"][0]
    assert table["columns"][:4] == ["run", "method", "configured budget", "matched: sequences"]
    rows = {r[0]: r for r in table["rows"]}
    assert rows["es (a)"][2] == "updates = 4" and rows["es (a)"][3] == 64  # 4 updates x 16 sequences
    assert rows["es (b)"][2] == "sequences = 40" and rows["es (b)"][3] == 48  # stopped at the update reaching 40
    assert rows["es (a)"][-1] == "es 8"
    md = out.markdown.read_text()
    assert "Compared on **sequences**" in md and "One completion length limit" in md
    reward = next(s for s in report["sections"] if s["title"] == "Training reward")
    long = reward["tables"][1]
    assert "sequences generated" in long["columns"]
    assert [r[2] for r in long["rows"] if r[0] == "es (b)"] == [16, 32, 48]
