"""Pipelines: budget arithmetic, stage order and bit-exact hand-over, the combined stream, resume,
split sweeps, and the held-out probe logging the same fields for ES and GRPO.

Everything runs the real code (TRL's GRPOTrainer, the ES engine, run directories) on a tiny random
llama with the real SmolLM2 tokenizer and the toy vowel task from conftest.
"""

from __future__ import annotations

import json
import random
from fractions import Fraction

import pytest
import torch

from evolm import config
from evolm.errors import ConfigError, UserError
from evolm.runs import RunDir

pytest.importorskip("trl")

from conftest import make_tiny_model, make_vowel_task  # noqa: E402

from evolm.pipeline import (PipelineJob, combined_records, largest_remainder, plan_stages,  # noqa: E402
                            run_pipeline, stage_config)
from evolm.sweep import split_points  # noqa: E402
from evolm.tasks import register  # noqa: E402

VowelTask = register(type(make_vowel_task()))  # the CLI sweep builds its task from the config by name

TIMING = {"seconds", "seconds_total", "peak_rss_mb", "probe_seconds", "seconds_generate", "seconds_perturb",
          "seconds_restore", "seconds_update"}


# -- the plan ----------------------------------------------------------------------------------------

def _plan(stages, budget, interleave=False):
    return [(s.method, s.updates, s.index, s.start) for s in plan_stages(stages, budget, interleave)]


def test_fractions_split_the_budget():
    assert _plan(["grpo:0.5", "es:0.5"], 20) == [("grpo", 10, 0, 0), ("es", 10, 1, 10)]
    assert _plan(["es:0.25", "grpo:0.75"], 3) == [("es", 1, 0, 0), ("grpo", 2, 1, 1)]  # remainders .75 vs .25
    assert _plan(["grpo:1/3", "es:1/3", "grpo:1/3"], 10) == [("grpo", 4, 0, 0), ("es", 3, 1, 4), ("grpo", 3, 2, 7)]
    assert _plan(["grpo:0.3", "es:0.7"], 7) == [("grpo", 2, 0, 0), ("es", 5, 1, 2)]  # 2.1 / 4.9 -> exact rationals
    # a stage rounded to zero updates is dropped and the rest renumbered
    assert _plan(["grpo:0.05", "es:0.95"], 5) == [("es", 5, 0, 0)]
    assert _plan(["grpo:1.0"], 3) == [("grpo", 3, 0, 0)]


def test_largest_remainder_always_sums_to_the_budget():
    rng = random.Random(0)
    for _ in range(200):
        weights = [rng.randint(1, 9) for _ in range(rng.randint(1, 5))]
        shares = [Fraction(w, sum(weights)) for w in weights]
        budget = rng.randint(1, 50)
        counts = largest_remainder(shares, budget)
        assert sum(counts) == budget
        assert all(abs(c - s * budget) < 1 for c, s in zip(counts, shares))


def test_counts_and_interleaving():
    assert _plan(["grpo:3", "es:2"], 5) == [("grpo", 3, 0, 0), ("es", 2, 1, 3)]
    assert _plan(["grpo:10", "es:10"], 35, True) == [("grpo", 10, 0, 0), ("es", 10, 1, 10), ("grpo", 10, 2, 20),
                                                       ("es", 5, 3, 30)]
    assert _plan(["es:10", "grpo:10"], 4, True) == [("es", 4, 0, 0)]
    assert plan_stages(["grpo:1", "es:1"], 3, True)[2].name == "02-grpo"


@pytest.mark.parametrize("stages, budget, interleave, message", [
    (["grpo:0.5", "es:0.5"], 0, False, r"pipeline\.budget must be an integer >= 1"),
    (["ppo:0.5", "es:0.5"], 4, False, r"pipeline\.stages\[0\]: unknown method 'ppo'"),
    (["grpo"], 4, False, r"pipeline\.stages\[0\] must look like 'method:amount'"),
    (["grpo:0.6", "es:0.6"], 4, False, r"pipeline\.stages fractions must sum to 1"),
    (["grpo:0.33", "es:0.33", "grpo:0.33"], 4, False, r"must sum to 1 \(got 0\.99"),
    (["grpo:0.5", "es:2"], 4, False, r"mixes fractions and update counts"),
    (["grpo:3", "es:2"], 4, False, r"sum to 5 but pipeline\.budget is 4"),
    (["grpo:0.5", "es:0.5"], 4, True, r"pipeline\.interleave needs stages given as update counts"),
    (["grpo:0", "es:4"], 4, False, r"pipeline\.stages\[0\]: an update count must be >= 1"),
    (["grpo:x.y"], 4, False, r"pipeline\.stages\[0\]: 'x\.y' is not a number"),
    ([], 4, False, r"pipeline\.stages must list at least one stage"),
])
def test_plan_errors_name_the_field(stages, budget, interleave, message):
    with pytest.raises(ConfigError, match=message):
        plan_stages(stages, budget, interleave)


@pytest.mark.parametrize("override, message", [
    ("pipeline.stages=['grpo:0.7','es:0.7']", r"pipeline\.stages fractions must sum to 1"),
    ("pipeline.budget=0", r"pipeline\.budget"),
    ("pipeline.interleave=1", r"pipeline\.interleave must be true or false"),
    ("model.dtype='bfloat16'", r"model\.dtype must be float32 in a pipeline"),
    ("pipeline.stagez=['es:1.0']", r"did you mean 'stages'"),
    ("grpo.num_generations=1", r"grpo\.num_generations must be >= 2"),
])
def test_config_errors_name_the_field(override, message):
    with pytest.raises(ConfigError, match=message):
        config.from_dict(PipelineJob, {}, [override])


def test_stage_configs_take_the_plan_budget_and_distinct_seeds(tmp_path):
    cfg = config.from_dict(PipelineJob, {"pipeline": {"budget": 6, "stages": ["es:2", "grpo:1"], "interleave": True}})
    plan = plan_stages(cfg.pipeline.stages, 6, True)
    jobs = [stage_config(cfg, s, tmp_path) for s in plan]
    assert [type(j).__name__ for j in jobs] == ["ESJob", "GRPOJob", "ESJob", "GRPOJob"]
    assert [j.es.iterations if s.method == "es" else j.grpo.steps for j, s in zip(jobs, plan)] == [2, 1, 2, 1]
    assert len({j.run.seed for j in jobs}) == 4 and all(j.run.seed != cfg.run.seed for j in jobs)
    assert all(not j.eval.before_after and j.run.name == s.name for j, s in zip(jobs, plan))
    config.validate(jobs[0])
    config.validate(jobs[1])
    assert cfg.es.iterations == 20 and cfg.grpo.steps == 20, "the pipeline's own sections are left alone"


def test_split_points():
    points = split_points(["0.25", "0", "1/3", "1", "0"], ["grpo-es", "es-grpo"])
    assert [(name, a["pipeline.stages"]) for name, a in points] == [
        ("grpo-es-0.25", ["grpo:0.25", "es:0.75"]), ("es-grpo-0.25", ["es:0.75", "grpo:0.25"]),
        ("es-only", ["es:1.0"]), ("grpo-es-1_3", ["grpo:1/3", "es:2/3"]),
        ("es-grpo-1_3", ["es:2/3", "grpo:1/3"]), ("grpo-only", ["grpo:1.0"])]
    assert all(a["pipeline.interleave"] is False for _, a in points)
    for _, a in points:
        plan_stages(a["pipeline.stages"], 7)  # every point is a valid plan
    with pytest.raises(UserError, match="--orders"):
        split_points(["0.5"], ["ppo-es"])
    with pytest.raises(UserError, match=r"\[0, 1\]"):
        split_points(["1.5"])


# -- running on a tiny model -------------------------------------------------------------------------

def tiny_cfg(tmp_path, stages, budget, interleave=False, name="p", **sections) -> PipelineJob:
    data = {
        "run": {"out_dir": str(tmp_path), "name": name, "checkpoint_every": 1, "keep_checkpoints": 3, "progress": False},
        "task": {"name": "vowels"},
        "generation": {"max_new_tokens": 8, "batch_size": 16, "temperature": 1.0},
        "es": {"population": 4, "prompts_per_iteration": 4, "sigma": 0.02, "lr": 0.01},
        "grpo": {"num_generations": 4, "prompts_per_step": 2, "max_completion_length": 8, "lr": 1e-3},
        "eval": {"before_after": False},
        "probe": {"every": 1},
        "pipeline": {"budget": budget, "stages": stages, "interleave": interleave},
    }
    for section, values in sections.items():
        data[section] = {**data.get(section, {}), **values}
    return config.from_dict(PipelineJob, data)


class CountingProbe:
    """A deterministic function of the weights (plus RNG use that must not leak into training)."""

    def __init__(self):
        self.calls = 0

    def __call__(self, model, step):
        self.calls += 1
        torch.rand(10)
        return {"weight_sum": float(sum(p.double().sum() for p in model.parameters())), "pass@1": 0.0}


def weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def saved_weights(directory):
    from safetensors.torch import load_file

    return load_file(str(directory / "model.safetensors"))


def same(a, b):
    keys = set(a) & set(b)
    assert "model.embed_tokens.weight" in keys
    return all(torch.equal(a[k], b[k]) for k in keys)


def test_interleaved_stages_hand_over_weights_bit_for_bit(tmp_path, tokenizer, vowel_task):
    cfg = tiny_cfg(tmp_path, ["grpo:1", "es:1"], 3, interleave=True,
                   eval={"before_after": True, "count": 2, "n_samples": 2, "k": [1, 2], "max_new_tokens": 4})
    model = make_tiny_model(tokenizer)
    start = weights(model)
    seen = []
    probe = CountingProbe()
    run = run_pipeline(cfg, model=model, tokenizer=tokenizer, task=vowel_task, probe=probe, quiet=True,
                       on_stage_start=lambda stage, m: seen.append((stage.name, weights(m))))

    assert [name for name, _ in seen] == ["00-grpo", "01-es", "02-grpo"]
    assert same(seen[0][1], start)
    stages = run.path / "stages"
    for (name, init), prev in zip(seen[1:], ["00-grpo", "01-es"]):
        assert same(init, saved_weights(stages / prev / "final")), f"{name} did not start from {prev}/final"
    assert not same(seen[1][1], start) and not same(seen[2][1], seen[1][1]), "each stage moved the weights"
    assert same(weights(model), saved_weights(run.path / "final"))
    assert same(saved_weights(run.path / "final"), saved_weights(stages / "02-grpo" / "final"))
    fp = run.info()["fingerprints"]
    assert fp["01-es"]["init"] == fp["00-grpo"]["final"] and fp["02-grpo"]["init"] == fp["01-es"]["final"]
    for name, kind in [("00-grpo", "grpo"), ("01-es", "es"), ("02-grpo", "grpo")]:
        info = RunDir.open(stages / name).info()
        assert info["kind"] == kind and info["status"] == "finished"
    assert run.info()["kind"] == "pipeline" and run.info()["status"] == "finished"

    records = run.metrics()
    train = [r for r in records if r["kind"] == "train"]
    assert [(r["step"], r["stage"], r["stage_method"], r["stage_step"]) for r in train] == [
        (1, 0, "grpo", 1), (2, 1, "es", 1), (3, 2, "grpo", 1)]
    assert [r["method"] for r in train] == ["grpo", "es", "grpo"]
    assert train[-1]["gen_sequences_total"] == sum(r["gen_sequences"] for r in train) == 8 + 4 * 4 + 8
    assert train[-1]["seconds_total"] == pytest.approx(sum(r["seconds"] for r in train))
    for r in train:
        for key in ("gen_sequences", "gen_tokens", "seconds", "peak_rss_mb"):
            assert r[key] > 0, key
    probes = [r for r in records if r["kind"] == "probe"]
    assert [(r["step"], r["stage"]) for r in probes] == [(0, 0), (1, 0), (2, 1), (3, 2)]
    assert probe.calls == 4, "a stage's opening probe reuses the previous stage's closing one"
    evals = [r for r in records if r["kind"] == "eval"]
    assert [(r["label"], r["step"], r["stage"]) for r in evals] == [("before", 0, 0), ("after", 3, 2)]
    assert records[0]["label"] == "before" and records[-1]["label"] == "after"
    assert records == combined_records(run.path, plan_stages(["grpo:1", "es:1"], 3, True))
    assert (run.path / "eval_before.json").exists() and (run.path / "eval_after.json").exists()
    assert not (stages / "00-grpo" / "eval_before.json").exists(), "held-out evaluation is the pipeline's"


def _comparable(records):
    return [{k: v for k, v in r.items() if k not in TIMING} for r in records]


def test_resume_skips_finished_stages_and_resumes_the_interrupted_one(tmp_path, tokenizer, vowel_task):
    class Kill(KeyboardInterrupt):  # as Ctrl-C or a scheduler's SIGTERM would stop it
        pass

    def kill_at(step):
        def cb(s, record):
            if s == step:
                raise Kill
        return cb

    cfg = tiny_cfg(tmp_path, ["grpo:1/3", "es:2/3"], 3)
    whole = make_tiny_model(tokenizer)
    run_a = run_pipeline(cfg, model=whole, tokenizer=tokenizer, task=vowel_task, probe=CountingProbe(),
                         run_dir=tmp_path / "a", quiet=True)

    with pytest.raises(Kill):
        run_pipeline(cfg, model=make_tiny_model(tokenizer), tokenizer=tokenizer, task=vowel_task, probe=CountingProbe(),
                     run_dir=tmp_path / "b", quiet=True, stage_callbacks={"es": [kill_at(1)]})
    run_b = RunDir.open(tmp_path / "b")
    assert run_b.info()["status"] == "interrupted"
    grpo_stage = RunDir.open(run_b.path / "stages" / "00-grpo")
    finished_at = grpo_stage.info()["finished"]
    es_stage = RunDir.open(run_b.path / "stages" / "01-es")
    assert es_stage.info()["status"] == "interrupted" and es_stage.latest_checkpoint()[1]["step"] == 1

    seen = []
    resumed = make_tiny_model(tokenizer)
    run_pipeline(cfg, resume=run_b, model=resumed, tokenizer=tokenizer, task=vowel_task, probe=CountingProbe(),
                 quiet=True, on_stage_start=lambda stage, m: seen.append(stage.name))
    assert seen == ["01-es"], "the finished GRPO stage is skipped"
    assert grpo_stage.info()["finished"] == finished_at
    assert same(weights(whole), weights(resumed)), "resumed pipeline ends with the uninterrupted weights"
    assert same(saved_weights(run_a.path / "final"), saved_weights(run_b.path / "final"))
    assert _comparable(run_a.metrics()) == _comparable(run_b.metrics())
    assert run_b.info()["status"] == "finished"
    with pytest.raises(UserError, match="plans it differently"):
        run_pipeline(tiny_cfg(tmp_path, ["grpo:2/3", "es:1/3"], 3), resume=run_b, model=make_tiny_model(tokenizer),
                     tokenizer=tokenizer, task=vowel_task, quiet=True)


def test_probe_and_eval_records_have_the_same_fields_for_es_and_grpo(tmp_path, tokenizer, vowel_task):
    """Both trainers build the default probe from [probe] and evaluate before/after from [eval]."""
    from evolm.config import ESJob
    from evolm.jobs import run_es
    from evolm.grpo import GRPOJob
    from evolm.jobs import run_grpo

    sections = {
        "run": {"out_dir": str(tmp_path), "checkpoint_every": 0, "progress": False},
        "task": {"name": "vowels"}, "generation": {"max_new_tokens": 4, "batch_size": 16},
        "eval": {"count": 2, "n_samples": 2, "k": [1, 2]},
        "probe": {"every": 1, "task": "", "count": 2, "n_samples": 2, "k": [1, 2]},
    }
    es_cfg = config.from_dict(ESJob, {**sections, "run": {**sections["run"], "name": "es"},
                                      "es": {"iterations": 1, "population": 2, "prompts_per_iteration": 2}})
    grpo_cfg = config.from_dict(GRPOJob, {**sections, "run": {**sections["run"], "name": "grpo"},
                                          "grpo": {"steps": 1, "num_generations": 2, "prompts_per_step": 1,
                                                   "max_completion_length": 4}})
    es_run = run_es(es_cfg, model=make_tiny_model(tokenizer), tokenizer=tokenizer, task=vowel_task, quiet=True)
    grpo_run = run_grpo(grpo_cfg, model=make_tiny_model(tokenizer), tokenizer=tokenizer, task=vowel_task)

    def by_kind(run, kind):
        return [r for r in run.metrics() if r.get("kind") == kind]

    es_probes, grpo_probes = by_kind(es_run, "probe"), by_kind(grpo_run, "probe")
    assert [r["step"] for r in es_probes] == [r["step"] for r in grpo_probes] == [0, 1]
    assert {"entropy", "pass@1", "pass@2", "task", "probe_seconds"} <= set(es_probes[0])
    for a, b in zip(es_probes, grpo_probes):
        assert set(a) == set(b)
    cost = {"seconds", "seconds_total", "gen_sequences", "gen_tokens", "gen_sequences_total", "gen_tokens_total",
            "peak_rss_mb", "reward_mean", "reward_std"}
    for run in (es_run, grpo_run):
        (train,) = by_kind(run, "train")
        assert cost <= set(train) and train["gen_sequences_total"] == train["gen_sequences"] > 0
    es_evals, grpo_evals = by_kind(es_run, "eval"), by_kind(grpo_run, "eval")
    assert [r["label"] for r in grpo_evals] == ["before", "after"] == [r["label"] for r in es_evals]
    assert all(set(a) == set(b) for a, b in zip(es_evals, grpo_evals))
    assert (grpo_run.path / "eval_before.json").exists() and (grpo_run.path / "eval_after.json").exists()
    # the probe saw the same held-out problems in both runs
    assert [r["task"] for r in es_probes] == [r["task"] for r in grpo_probes] == ["vowels", "vowels"]


# -- command line --------------------------------------------------------------------------------------

def test_cli_help_config_and_errors(tmp_path, capsys):
    from evolm.commands import main

    with pytest.raises(SystemExit) as e:
        main(["pipeline", "--help"])
    assert e.value.code == 0
    assert main(["config", "pipeline"]) == 0
    listing = capsys.readouterr().out
    for key in ("pipeline.budget", "pipeline.stages", "pipeline.interleave", "es.sigma", "grpo.loss_type", "probe.every",
                "eval.before_after", "generation.max_new_tokens"):
        assert key in listing
    assert main(["pipeline"]) == 2
    assert "needs --config FILE" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text('[pipeline]\nstages = ["grpo:0.5", "es:0.6"]\n')
    assert main(["pipeline", "--config", str(bad)]) == 2
    assert capsys.readouterr().err.strip().startswith("evolm: error: pipeline.stages fractions must sum to 1")
    assert main(["pipeline", "--config", str(bad), "--set", "pipeline.stages=['es:1.0']",
                 "--sweep-splits", "0.5,2"]) == 2
    assert "[0, 1]" in capsys.readouterr().err


def test_cli_split_sweep_runs_every_point_once(tmp_path, tokenizer, capsys):
    from evolm.commands import main

    make_tiny_model(tokenizer).save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    cfg_file = tmp_path / "p.toml"
    cfg = tiny_cfg(tmp_path, ["grpo:0.5", "es:0.5"], 2, name="sweep", probe={"every": 0},
                   model={"spec": str(tmp_path / "tiny")},
                   eval={"before_after": True, "count": 2, "n_samples": 2, "k": [1, 2]})
    cfg_file.write_text(config.to_toml(cfg))
    argv = ["pipeline", "--config", str(cfg_file), "--sweep-splits", "0.5", "--orders", "grpo-es,es-grpo"]
    assert main(argv) == 0
    sweep = tmp_path / "sweep"
    rows = json.loads((sweep / "sweep_summary.json").read_text())["points"]
    assert [(r["name"], r["stages"], r["status"], r["updates"]) for r in rows] == [
        ("grpo-es-0.5", "grpo:1 es:1", "finished", 2), ("es-grpo-0.5", "es:1 grpo:1", "finished", 2)]
    assert "| [grpo:0.5,es:0.5] | false | grpo:1 es:1 | finished |" in (sweep / "sweep.md").read_text()
    # both points start from the same weights: one before-evaluation, shared
    before = [json.loads((sweep / p / "eval_before.json").read_text()) for p in ("grpo-es-0.5", "es-grpo-0.5")]
    assert before[0] == before[1]
    for point, first in [("grpo-es-0.5", "00-grpo"), ("es-grpo-0.5", "00-es")]:
        assert (sweep / point / "stages" / first / "final" / "config.json").exists()
    finished = {p: RunDir.open(sweep / p).info()["finished"] for p in ("grpo-es-0.5", "es-grpo-0.5")}
    capsys.readouterr()
    assert main(argv) == 0, "re-running the same command continues the sweep"
    assert {p: RunDir.open(sweep / p).info()["finished"] for p in finished} == finished, "finished points are skipped"
    assert main(["pipeline", "--resume", str(sweep)]) == 0
    assert {p: RunDir.open(sweep / p).info()["finished"] for p in finished} == finished


# -- configs -------------------------------------------------------------------------------------------

def test_default_probe_is_arithmetic_with_subtraction_unless_another_task_is_named():
    from evolm.config import ESJob, ProbeConfig

    assert (ProbeConfig().task, ProbeConfig().params) == ("arithmetic", {"digits": 2, "operators": "+-"})
    assert config.from_dict(ESJob, {"probe": {"task": "csqa"}}).probe.params == {}
    assert config.from_dict(ESJob, {"probe": {"params": {"digits": 3}}}).probe.params == {"digits": 3}


def test_shipped_arithmetic_configs_share_one_budget_and_probe():
    from pathlib import Path

    from evolm.config import ESJob
    from evolm.grpo import GRPOJob

    root = Path(__file__).resolve().parents[1] / "configs"
    es = config.load(ESJob, root / "es-arithmetic.toml")
    grpo = config.load(GRPOJob, root / "grpo-arithmetic.toml")
    pipes = [config.load(PipelineJob, root / f) for f in ("pipeline-grpo-es.toml", "pipeline-interleaved.toml")]
    assert es.es.iterations == grpo.grpo.steps == pipes[0].pipeline.budget == pipes[1].pipeline.budget
    for job in (grpo, *pipes):
        assert job.probe == es.probe and job.eval == es.eval and job.task == es.task and job.probe.every > 0
    for job in pipes:
        assert job.es == dataclasses_replace(es.es, iterations=job.es.iterations)
        assert job.grpo == dataclasses_replace(grpo.grpo, steps=job.grpo.steps)
    assert [(s.method, s.updates) for s in plan_stages(pipes[0].pipeline.stages, 20)] == [("grpo", 10), ("es", 10)]
    plan = plan_stages(pipes[1].pipeline.stages, 20, pipes[1].pipeline.interleave)
    assert [(s.method, s.updates) for s in plan] == [("grpo", 5), ("es", 5)] * 2


def dataclasses_replace(obj, **kw):
    import dataclasses

    return dataclasses.replace(obj, **kw)
