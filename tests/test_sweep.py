"""evolm sweep: grid parsing, point directories, resumable runs with a failed point, and the summary.

Points run the real ES engine on a tiny random llama through an injected runner (the model spec of a
sweep config is otherwise loaded by name); the vowel toy task is registered under "vowels".
"""

from __future__ import annotations

import json

import pytest

from conftest import make_tiny_model, make_vowel_task
from evolm.errors import UserError
from evolm.sweep import collect_sweep, grid_points, parse_grid, point_name, run_sweep, split_values
from evolm.tasks import TASKS

TASKS.setdefault("vowels", type(make_vowel_task()))

BASE = {"run": {"progress": False, "checkpoint_every": 1, "seed": 0},
        "task": {"name": "vowels"},
        "generation": {"max_new_tokens": 4, "batch_size": 16},
        "es": {"iterations": 2, "population": 4, "prompts_per_iteration": 4, "lr": 0.01, "noise_table_size": 1 << 22},
        "eval": {"before_after": False}}


def test_split_values_and_parse_grid():
    assert split_values("8,16, 32") == ["8", "16", "32"]
    assert split_values('["norm","mlp"],["all"]') == ['["norm","mlp"]', '["all"]']
    assert split_values("'a,b',c") == ["'a,b'", "c"]
    grid = parse_grid(["es.population=8,16", "es.sigma=1e-3,0.01", "es.estimator=one_point,antithetic",
                       'es.params=["norm"],["all"]'])
    assert grid == {"es.population": [8, 16], "es.sigma": [0.001, 0.01], "es.estimator": ["one_point", "antithetic"],
                    "es.params": [["norm"], ["all"]]}
    points = grid_points({"a": [1, 2], "b": ["x", "y"]})
    assert points == [{"a": 1, "b": "x"}, {"a": 1, "b": "y"}, {"a": 2, "b": "x"}, {"a": 2, "b": "y"}]
    assert point_name({"es.population": 8, "es.sigma": 0.001}) == "es.population=8,es.sigma=0.001"
    assert point_name({"es.estimator": "one_point"}) == "es.estimator=one_point"
    assert point_name({"es.params": ["norm", "mlp"]}) == "es.params=_norm,mlp_"
    from evolm.config import parse_value, toml_inline

    for v in (8, 0.001, 1e-05, -2.5, True, "one_point", 'a "q"', ["norm", "mlp"], {"digits": 2, "ops": "+"}, [],
              {"a b": 1}):
        assert parse_value(toml_inline(v)) == v
    for bad in (["es.population"], ["es.population="], ["es.population=1", "es.population=2"], ["x=[1,2"]):
        with pytest.raises(UserError):
            parse_grid(bad)


def make_runner(tokenizer, fail_on=None, kill_after=None):
    """run_es on a fresh tiny model; optionally fail a point or interrupt it after a checkpoint."""
    from evolm.backends.hf import HFGenerator
    from evolm.jobs import run_es

    calls = []

    class Killed(Exception):
        pass

    def runner(cfg, resume, eval_before=None):
        calls.append((cfg.run.name, resume is not None))
        runner.shared_before.append((cfg.run.name, eval_before is not None))
        if fail_on and fail_on in cfg.run.name:
            raise RuntimeError("planted failure")
        model = make_tiny_model(tokenizer)
        callbacks = ()
        if kill_after and kill_after[0] in cfg.run.name and resume is None:
            def kill(step, record):
                if step == kill_after[1]:
                    raise Killed("killed")
            callbacks = (kill,)
        return run_es(cfg, resume=resume, model=model, tokenizer=tokenizer, task=TASKS["vowels"](),
                      generator=HFGenerator(model, tokenizer, 16), callbacks=callbacks, quiet=True, eval_before=eval_before)

    runner.calls = calls
    runner.shared_before = []
    return runner


def test_sweep_runs_skips_resumes_and_records_failures(tmp_path, tokenizer):
    from evolm import config

    out = tmp_path / "sweep"
    grid = parse_grid(["es.sigma=0.02,0.05", "es.shaping=zscore,none"])
    runner = make_runner(tokenizer, fail_on="none", kill_after=("es.sigma=0.05,es.shaping=zscore", 1))
    sweep = run_sweep(BASE, grid, out, runner=runner, config_class=config.ESJob, say=lambda *a: None)
    status = {p["name"]: p["status"] for p in sweep.manifest["points"]}
    assert status == {"es.sigma=0.02,es.shaping=zscore": "finished", "es.sigma=0.02,es.shaping=none": "failed",
                      "es.sigma=0.05,es.shaping=zscore": "failed", "es.sigma=0.05,es.shaping=none": "failed"}
    failed = sweep.point("es.sigma=0.02,es.shaping=none")
    assert failed["error"] == "RuntimeError: planted failure"
    assert "planted failure" in (out / "es.sigma=0.02,es.shaping=none" / "sweep_error.txt").read_text()
    # each point is an ordinary run directory with its resolved config
    cfg = config.load(config.ESJob, out / "es.sigma=0.02,es.shaping=zscore" / "config.toml")
    assert cfg.es.sigma == 0.02 and cfg.es.shaping == "zscore" and cfg.run.name == "es.sigma=0.02,es.shaping=zscore"
    manifest = json.loads((out / "sweep.json").read_text())
    assert manifest["grid"] == {"es.sigma": [0.02, 0.05], "es.shaping": ["zscore", "none"]} and manifest["kind"] == "es"

    # re-run: the finished point is skipped, the killed one resumes from its checkpoint, the failed ones retry
    runner2 = make_runner(tokenizer)
    sweep = run_sweep(BASE, grid, out, runner=runner2, config_class=config.ESJob, say=lambda *a: None)
    assert {p["status"] for p in sweep.manifest["points"]} == {"finished"}
    calls = dict(runner2.calls)
    assert "es.sigma=0.02,es.shaping=zscore" not in calls
    assert calls["es.sigma=0.05,es.shaping=zscore"] is True  # resumed
    assert calls["es.sigma=0.02,es.shaping=none"] is False  # failed before creating its run: fresh start
    killed = [json.loads(line)["step"] for line in
              (out / "es.sigma=0.05,es.shaping=zscore" / "metrics.jsonl").read_text().splitlines()]
    assert killed == [1, 2]  # step 1 from the first attempt, step 2 after the resume; nothing doubled
    assert not (out / "es.sigma=0.02,es.shaping=none" / "sweep_error.txt").exists()

    # a third run does nothing
    from evolm.analysis.ablations import ablations_for

    runner3 = make_runner(tokenizer)
    run_sweep(BASE, grid, out, runner=runner3, config_class=config.ESJob, say=lambda *a: None, analyze=ablations_for)
    assert runner3.calls == []

    summary = json.loads((out / "sweep_summary.json").read_text())
    assert len(summary["points"]) == 4
    p = next(p for p in summary["points"] if p["name"] == "es.sigma=0.02,es.shaping=zscore")
    assert p["updates"] == 2 and len(p["curve"]) == 2 and p["final_reward"] == p["curve"][-1][1]
    assert p["evaluations"] == 8 and p["gen_tokens_total"] > 0 and p["peak_rss_mb"] > 0 and p["seconds_total"] > 0
    assert set(summary["ablations"]) == {"sigma", "shaping"}
    assert "| 0.02 | zscore | finished |" in (out / "sweep.md").read_text()

    # the base config is part of the sweep's identity
    with pytest.raises(UserError, match="different base config"):
        run_sweep(BASE, grid, out, runner=runner3, config_class=config.ESJob, overrides=["es.lr=0.5"], say=lambda *a: None)
    # a grid that grows adds points, the old ones stay in the manifest
    more = run_sweep(BASE, {"es.sigma": [0.02], "es.shaping": ["zscore", "centered_rank"]}, out, runner=runner3,
                     config_class=config.ESJob, say=lambda *a: None)
    assert len(more.manifest["points"]) == 5 and more.manifest["grid"]["es.shaping"] == ["zscore", "none", "centered_rank"]
    assert collect_sweep(out)["points"][-1]["status"] == "finished"


def test_points_on_the_same_start_share_one_before_evaluation(tmp_path, tokenizer):
    from evolm import config

    base = {**BASE, "es": {**BASE["es"], "iterations": 1},
            "eval": {"before_after": True, "count": 2, "n_samples": 2, "k": [1, 2]}}
    runner = make_runner(tokenizer)
    out = tmp_path / "sweep"
    run_sweep(base, {"es.sigma": [0.02, 0.05], "generation.max_new_tokens": [4, 3]}, out, runner=runner,
              config_class=config.ESJob, say=lambda *a: None)
    shared = dict(runner.shared_before)
    # the first point of each starting setting measures; the others reuse it (eval length follows generation)
    assert shared == {"es.sigma=0.02,generation.max_new_tokens=4": False, "es.sigma=0.02,generation.max_new_tokens=3": False,
                      "es.sigma=0.05,generation.max_new_tokens=4": True, "es.sigma=0.05,generation.max_new_tokens=3": True}
    before = lambda name: json.loads((out / name / "eval_before.json").read_text())  # noqa: E731
    assert before("es.sigma=0.05,generation.max_new_tokens=4") == before("es.sigma=0.02,generation.max_new_tokens=4")
    assert before("es.sigma=0.05,generation.max_new_tokens=3") != before("es.sigma=0.02,generation.max_new_tokens=4")


def test_invalid_grid_points_fail_before_any_run(tmp_path, tokenizer):
    from evolm import config

    runner = make_runner(tokenizer)
    with pytest.raises(UserError, match="es.sigma must be > 0"):
        run_sweep(BASE, {"es.sigma": [0.01, -1.0]}, tmp_path / "s", runner=runner, config_class=config.ESJob,
                  say=lambda *a: None)
    assert runner.calls == []


def test_cli_sweep_errors(tmp_path, capsys):
    from evolm.commands import main

    assert main(["sweep", "--out", str(tmp_path / "s")]) == 2
    assert "--grid" in capsys.readouterr().err
    assert main(["sweep", "--grid", "es.sigmaa=0.1", "--out", str(tmp_path / "s")]) == 2
    assert "did you mean 'sigma'" in capsys.readouterr().err


def test_members_against_the_centre_from_a_points_metrics(tmp_path):
    """An ES point that scored its centre on each update's prompts: members above, equal to and below it."""
    from evolm.sweep import members_vs_centre, point_metrics

    assert members_vs_centre([([0.5, 0.6, 0.4, 0.5 + 1e-15], 0.5), ([0.2, 0.2], 0.1)]) == \
        {"above": 3, "tied": 2, "below": 1, "members": 6, "updates": 2}
    run = tmp_path / "point"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"kind": "es", "status": "finished"}))
    (run / "config.toml").write_text("[es]\npopulation = 3\n")
    records = [{"step": 1, "kind": "train", "reward_mean": 0.5, "fitness": [0.5, 0.5, 0.5], "center_reward": 0.5,
                "update_status": "zero"},
               {"step": 2, "kind": "train", "reward_mean": 0.5, "fitness": [0.4, 0.5, 0.6], "center_reward": 0.5,
                "update_status": "applied"}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    m = point_metrics(run)
    assert m["members_vs_centre"] == {"above": 1, "tied": 4, "below": 1, "members": 6, "updates": 2}
    assert m["update_status"] == {"zero": 1, "applied": 1}
    records = [{k: v for k, v in r.items() if k != "center_reward"} for r in records]  # the centre not scored
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert "members_vs_centre" not in point_metrics(run)
