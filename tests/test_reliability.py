"""Reliability (issue 10): no NaN weights, no silent rollback, no hang, no traceback on a bad file.

Fast tests, each aimed at one failure the fault-injection pass found; the kill -9 / resume tests that
need child processes are in ``test_faults.py``.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import make_tiny_model, make_vowel_task
from evolm import config
from evolm.commands import main
from evolm.errors import ConfigError, UserError
from evolm.es.noise import StreamNoise, TableNoise
from evolm.es.params import ParamSet
from evolm.es.shaping import SHAPINGS, zscore
from evolm.es.update import compute_update
from evolm.runs import RunDir, read_jsonl


def _run_es(tmp_path, tokenizer, task, model=None, **es):
    from evolm.backends.hf import HFGenerator
    from evolm.jobs import run_es

    cfg = config.ESJob()
    cfg.run.out_dir, cfg.run.name, cfg.run.progress, cfg.run.checkpoint_every = str(tmp_path), "run", False, 0
    cfg.eval.before_after = False
    cfg.generation.max_new_tokens = 6
    cfg.es.population, cfg.es.prompts_per_iteration, cfg.es.iterations, cfg.es.sigma, cfg.es.lr = 4, 1, 2, 0.05, 0.01
    for k, v in es.items():
        setattr(cfg.es, k, v)
    model = model or make_tiny_model(tokenizer)
    return run_es(cfg, model=model, tokenizer=tokenizer, task=task, generator=HFGenerator(model, tokenizer, 16),
                  quiet=True), model


def _finite(model) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


# -- item 3: huge finite fitness must not write NaN --------------------------------------------------

def test_zscore_is_overflow_safe_and_unchanged_for_ordinary_rewards():
    assert zscore(np.array([1e308, 1e308, 0.0, 0.0])).tolist() == [1.0, 1.0, -1.0, -1.0]
    f = np.array([0.25, 0.5, 0.0, 1.0, 0.125])
    assert zscore(f).tolist() == ((f - f.mean()) / f.std()).tolist()  # bit for bit the plain formula
    for name, shape in SHAPINGS.items():
        if name != "none":
            assert np.all(np.isfinite(shape(np.array([1e308, -1e308, 5e307, 0.0])))), name


@pytest.mark.parametrize("fitness, shaping, estimator, status", [
    ([1e308, 1e308, 0, 0], "zscore", "one_point", "applied"),      # used to be "applied" with NaN coefficients
    ([1e308, -1e308, 0, 0], "none", "antithetic", "skipped"),     # 1e308 - (-1e308) overflows
    ([1e200, 0, 0, 0], "none", "one_point", "skipped"),          # finite, but a step of 1e196
    ([0.5, 0.25, 0, 1], "none", "one_point", "applied"),
])
def test_compute_update_never_applies_non_finite_or_absurd_steps(fitness, shaping, estimator, status):
    u = compute_update(fitness, estimator=estimator, shaping=shaping, lr=5e-4, sigma=1e-3)
    assert u.status == status, u.message
    assert all(math.isfinite(c) for c in u.coefficients)
    if status == "skipped":
        assert "update skipped" in u.message


def test_apply_update_refuses_to_write_non_finite_weights(tiny_model):
    params = ParamSet(tiny_model, StreamNoise(1))
    last = params.tensors[-1].view(-1)
    original = last[:200].clone()
    last[:100], last[100:200] = 3.4e38, -3.4e38  # at float32's largest values: a step of ~1e36 overflows some
    before = [t.clone() for t in params.tensors]
    assert params.apply_update(0, [1.0, -1.0], 1e36) is False
    assert all(torch.equal(a, b) for a, b in zip(before, params.tensors)), "a refused update changes nothing"
    assert params.apply_update(0, [1.0, -1.0], 1e-3) is True, "near the limit, a small step is still safe"
    last[:200] = original
    before = [t.clone() for t in params.tensors]
    assert params.apply_update(0, [1.0, -1.0], 1e-3) is True
    assert not all(torch.equal(a, b) for a, b in zip(before, params.tensors))
    assert params.apply_update(0, [float("nan"), 1.0], 1e-3) is False


def test_apply_update_result_is_bit_identical_to_the_plain_formula(tiny_model):
    """The guard costs a bound check; the weights it writes are the formula's, bit for bit."""
    params = ParamSet(tiny_model, StreamNoise(5))
    expect = []
    for k, t in enumerate(params.tensors):
        acc = torch.zeros(t.numel())
        for d, c in enumerate([0.5, -1.25]):
            acc.add_(params._eps(k, 3, d), alpha=c)
        expect.append(t.view(-1).clone().add_(acc, alpha=2e-3))
    assert params.apply_update(3, [0.5, -1.25], 2e-3)
    for t, e in zip(params.tensors, expect):
        assert torch.equal(t.view(-1), e)


def test_float16_masters_refuse_an_update_the_model_dtype_cannot_hold(tokenizer):
    model = make_tiny_model(tokenizer).to(torch.float16)
    params = ParamSet(model, StreamNoise(2))
    params.masters[0].view(-1)[0] = 65000.0  # float16's largest finite value is 65504
    params.tensors[0].view(-1)[0] = 65000.0
    before = [t.clone() for t in params.tensors]
    assert params.apply_update(0, [1.0], 1e3) is False
    assert all(torch.equal(a, b) for a, b in zip(before, params.tensors))


class HugeReward(type(make_vowel_task())):
    """Finite but enormous rewards: 1e308 x the vowel share (the fault-injection pass's fitness)."""

    def reward(self, completion, example):
        return 1e308 * super().reward(completion, example)


def test_es_with_enormous_finite_rewards_keeps_every_weight_finite(tmp_path, tokenizer):
    run, model = _run_es(tmp_path / "z", tokenizer, HugeReward())
    statuses = [r["update_status"] for r in run.train_records()]
    assert run.info()["status"] == "finished" and _finite(model), statuses
    assert "applied" in statuses, "zscore of rescaled fitness is an ordinary update"
    run, model = _run_es(tmp_path / "n", tokenizer, HugeReward(), shaping="none")
    assert [r["update_status"] for r in run.train_records()] == ["skipped", "skipped"]
    assert "update skipped" in run.train_records()[0]["message"] and _finite(model)
    assert run.info()["status"] == "finished"


# -- item 4: validation refuses inf, nan and absurd values -------------------------------------------

def _float_fields(cls, prefix=""):
    import typing

    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            yield from _float_fields(tp, f"{prefix}{f.name}.")
        elif tp is float:
            yield f"{prefix}{f.name}"


def _job_classes():
    from evolm.registry import JOBS

    return [(name, job.config_class) for name, job in JOBS.items()]


@pytest.mark.parametrize("kind, cls", _job_classes())
def test_every_float_field_refuses_inf_and_nan(kind, cls):
    fields = list(_float_fields(cls))
    assert "run.seed" not in fields and len(fields) >= 6
    for name in fields:
        for value in ("inf", "-inf", "nan"):
            with pytest.raises(ConfigError, match=f"{name} must be a finite number"):
                config.from_dict(cls, {}, [f"{name}={value}"])


@pytest.mark.parametrize("override, message", [
    ("es.sigma=1e308", "es.sigma must be > 0 and <= 10"),
    ("es.lr=1e9", "es.lr must be > 0 and <= 100"),
    ("generation.temperature=1e6", "generation.temperature must be in [0, 100]"),
    ("eval.temperature=1e6", "eval.temperature must be in [0, 100]"),
    ("probe.temperature=1e6", "probe.temperature must be > 0 and <= 100"),
    ("run.seed=-1", "run.seed must be an integer in [0, 2^63)"),
    ("es.noise_table_size=1000000000000", "es.noise_table_size must be in [0, 2^33]"),
])
def test_absurd_values_are_refused(override, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")
                       .replace("^", r"\^")):
        config.from_dict(config.ESJob, {}, [override])


def test_config_resolve_refuses_inf_in_one_line(tmp_path, capsys):
    (tmp_path / "c.toml").write_text("[es]\nlr = inf\n")
    assert main(["config", "es", "--resolve", str(tmp_path / "c.toml")]) == 2
    assert capsys.readouterr().err.strip() == "evolm: error: es.lr must be a finite number (got inf)"
    assert main(["config", "grpo", "--resolve", str(tmp_path / "c.toml"), "--set", "grpo.lr=2.0"]) == 2


# -- item 8: strict JSON -----------------------------------------------------------------------------

def _strict(text: str):
    def refuse(name):
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def test_logs_are_strict_json_with_null_for_failed_members(tmp_path, tokenizer):
    class Broken(type(make_vowel_task())):
        def reward(self, completion, example):
            return float("nan")

    run, _ = _run_es(tmp_path, tokenizer, Broken(), iterations=1)
    for name in ("metrics.jsonl", "seed_log.jsonl", "config_history.jsonl"):
        for line in (run.path / name).read_text().splitlines():
            _strict(line)
    _strict((run.path / "run.json").read_text())
    record = run.train_records()[0]
    assert record["fitness"] == [None] * 4 and record["reward_mean"] is None and record["update_status"] == "skipped"


def test_old_logs_with_bare_nan_still_read(tmp_path):
    (tmp_path / "m.jsonl").write_text('{"step": 1, "fitness": [NaN, 0.5], "reward_mean": Infinity}\n{"step": 2, "tor')
    records = read_jsonl(tmp_path / "m.jsonl")
    assert len(records) == 1 and math.isnan(records[0]["fitness"][0])


def test_to_json_turns_every_non_finite_number_into_null():
    from evolm.runs import to_json

    value = {"a": float("nan"), "b": [np.float32("inf"), np.float64(1.5)], "c": torch.tensor([1.0, float("-inf")]),
             "d": np.array([np.nan, 2.0]), "e": (3, "x")}
    assert _strict(to_json(value)) == {"a": None, "b": [None, 1.5], "c": [1.0, None], "d": [None, 2.0], "e": [3, "x"]}


def test_a_torn_last_line_is_ended_not_glued_onto(tmp_path):
    from evolm.runs import append_jsonl

    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, "rew')
    append_jsonl(path, {"step": 3})
    assert [r["step"] for r in read_jsonl(path)] == [1, 3]


# -- items 6 and 7: run directories --------------------------------------------------------------------

def test_resume_cleans_temporaries_and_puts_a_swapped_final_back(tmp_path):
    run = RunDir.create(tmp_path, "r", "", kind="es")
    (run.path / "checkpoints" / ".step_000002.ab3_x9zq").mkdir(parents=True)
    (run.path / "checkpoints" / ".step_000002.ab3_x9zq" / "model.safetensors").write_bytes(b"0" * 100)
    (run.path / "checkpoints" / ".LATEST.k2j4h5g6").write_text("step_")
    (run.path / ".run.json.zz11yy22").write_text("{")
    (run.path / ".final.old").mkdir()
    (run.path / ".final.old" / "config.json").write_text("{}")
    (run.path / ".final.qwertyui").mkdir()
    (run.path / ".gitignore").write_text("*\n")  # not ours: kept
    done = run.clean_temporaries()
    assert sorted(done) == sorted(["removed checkpoints/.LATEST.k2j4h5g6", "removed checkpoints/.step_000002.ab3_x9zq",
                                   "removed .final.qwertyui", "put back final/ from .final.old",
                                   "removed .run.json.zz11yy22"])
    assert (run.path / "final" / "config.json").exists() and (run.path / ".gitignore").exists()
    assert sorted(p.name for p in run.path.rglob(".*")) == [".gitignore"]


def test_a_run_that_failed_before_computing_anything_can_be_created_again(tmp_path):
    from evolm.jobs import marking_failures

    run = RunDir.create(tmp_path, "r", "a = 1\n", kind="es")
    with pytest.raises(RuntimeError), marking_failures(run):
        raise RuntimeError("late error")
    assert run.info()["status"] == "failed" and run.info()["stopped_at_step"] == 0
    again = RunDir.create(tmp_path, "r", "a = 2\n", kind="es")
    assert again.config_path.read_text() == "a = 2\n" and again.info()["status"] == "running"
    again.log_metrics({"step": 0, "kind": "eval", "label": "before"})  # computed: never replaced silently
    again.update_info(status="failed")
    with pytest.raises(UserError, match="already exists; pass --resume"):
        RunDir.create(tmp_path, "r", "", kind="es")


@pytest.mark.parametrize("verb", ["es", "grpo"])
def test_an_existing_run_directory_is_refused_before_the_model_loads(verb, tmp_path):
    """issue 44.5: "run directory already exists" came after the model, task and data were built (~10 s); it
    comes right after the config is read now, before the model spec is even looked at (here it names nothing)."""
    RunDir.create(tmp_path, "existing", "a = 1\n", kind=verb)
    repo = Path(__file__).resolve().parents[1]
    code = ("from evolm.commands import main; "
            f"rc = main(['{verb}', '--config', '{repo}/configs/{verb}-arithmetic.toml', '--set', "
            f"\"model.spec='{tmp_path}/no-such-model'\", '--set', \"run.out_dir='{tmp_path}'\", '--set', "
            "\"run.name='existing'\"]); print(rc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(repo / "src")})
    assert "already exists; pass --resume" in out.stderr and out.stderr.count("\n") == 1, out.stderr
    assert out.stdout.split()[0] == "2"


def test_late_errors_leave_no_run_directory(tmp_path, tokenizer, capsys):
    tiny = tmp_path / "tiny"
    make_tiny_model(tokenizer).save_pretrained(tiny)
    tokenizer.save_pretrained(tiny)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[run]\nout_dir = "{tmp_path / "runs"}"\nname = "r"\nprogress = false\n[model]\nspec = "{tiny}"\n'
                   '[es]\niterations = 1\npopulation = 2\nprompts_per_iteration = 2\n[generation]\nmax_new_tokens = 2\n')
    for override, message in [("eval.task=gpqa", "gated GPQA data"),
                              ("es.param_regex=nothing_matches_this", "selects no parameters"),
                              ("task.name=gpqa", "task 'gpqa' has splits")]:
        assert main(["es", "--config", str(cfg), "--set", override]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
        assert not (tmp_path / "runs" / "r").exists(), override
    probe = ["--set", "probe.every=1", "--set", "probe.task=gpqa"]
    assert main(["es", "--config", str(cfg), *probe]) == 2 and not (tmp_path / "runs" / "r").exists()


def test_run_json_says_failed_even_when_the_disk_is_full(tmp_path, monkeypatch):
    """A fake full-disk writer: every atomic write (a new temporary file) fails with ENOSPC."""
    from evolm import runs
    from evolm.jobs import marking_failures

    run = RunDir.create(tmp_path, "r", "", kind="es")
    run.log_metrics({"step": 1, "kind": "train"})

    def full(path, text):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    monkeypatch.setattr(runs, "atomic_write_text", full)
    with pytest.raises(OSError), marking_failures(run):
        full(run.path / "checkpoints", "")
    info = json.loads((run.path / "run.json").read_text())
    assert info["status"] == "failed" and info["stopped_at_step"] == 1 and "No space left" in info["error"]


def test_save_refuses_non_finite_weights(tmp_path, tiny_model):
    from evolm.runs import save_model_dir

    with torch.no_grad():
        next(tiny_model.parameters()).view(-1)[3] = float("nan")
    with pytest.raises(RuntimeError, match="refusing to save non-finite weights"):
        save_model_dir(tmp_path / "final", tiny_model, None, extra={})
    assert not (tmp_path / "final").exists() and list(tmp_path.iterdir()) == []


# -- item 5: unreadable files are one line ---------------------------------------------------------------

@pytest.fixture(scope="module")
def broken_models(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("broken")
    good = root / "good"
    make_tiny_model(tokenizer).save_pretrained(good)
    tokenizer.save_pretrained(good)
    out = {"good": good}
    for name, damage in [("truncated", lambda d: os.truncate(d / "model.safetensors", 1_000_000)),
                         ("bad_header", lambda d: os.truncate(d / "model.safetensors", 100)),
                         ("bad_config", lambda d: (d / "config.json").write_text('{"model_type": "llama", '))]:
        shutil.copytree(good, root / name)
        damage(root / name)
        out[name] = root / name
    from evolm import models

    with open(models.resolve(models.DEFAULT_MODEL).location, "rb") as f:  # the embedded GGUF, cut short
        (root / "cut.gguf").write_bytes(f.read(30_000_000))
    out["gguf"] = root / "cut.gguf"
    (root / "rows.parquet").write_bytes(b"PAR1 this is not a parquet file")
    out["parquet"] = root / "rows.parquet"
    return out


@pytest.mark.parametrize("name, message", [("truncated", "incomplete metadata"), ("bad_header", "invalid header"),
                                           ("bad_config", "not a valid JSON file"), ("gguf", "cannot reshape")])
def test_unreadable_models_are_one_line_errors(broken_models, name, message, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("EVOLM_CACHE", str(tmp_path / "cache"))
    spec = str(broken_models[name])
    assert main(["eval", "--model", spec, "--tasks", "arithmetic", "--n", "1", "--k", "1", "--limit", "1",
                 "--no-progress", "--out", str(tmp_path / "e")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    opening = f"cannot read GGUF file {spec}" if name == "gguf" else f"cannot load model '{spec}'"
    assert err[-1].startswith(f"evolm: error: {opening}") and message in err[-1], err
    if name != "gguf":
        assert main(["analyze", "drift", "--base", spec, "--trained", str(broken_models["good"]),
                     "--out", str(tmp_path / "d")]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("evolm: error: cannot load model") and "\n" not in err, err


def test_a_corrupt_parquet_data_file_is_one_line(broken_models, tmp_path, capsys):
    assert main(["eval", "--model", str(broken_models["good"]), "--tasks", "gpqa", "--task-param",
                 f"gpqa.path={broken_models['parquet']}", "--n", "1", "--k", "1", "--no-progress",
                 "--out", str(tmp_path / "e")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("evolm: error: cannot read") and "as parquet" in err and "\n" not in err, err


def test_a_read_only_out_dir_is_one_line(tmp_path, broken_models, capsys):
    out = tmp_path / "ro"
    out.mkdir()
    mounted = False
    if os.geteuid() == 0:  # root writes through permission bits: use a read-only file system
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(out)],
                                 capture_output=True).returncode == 0
        if not mounted:
            pytest.skip("root, and no read-only mount possible")
    else:
        out.chmod(0o555)
    try:
        cfg = tmp_path / "c.toml"
        cfg.write_text(f'[run]\nout_dir = "{out}"\nname = "r"\n[model]\nspec = "{broken_models["good"]}"\n'
                       '[es]\niterations = 1\npopulation = 2\nprompts_per_iteration = 2\n[eval]\nbefore_after = false\n')
        assert main(["es", "--config", str(cfg)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"evolm: error: cannot create the run directory {out / 'r'}") and "\n" not in err, err
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(out)], capture_output=True)
        else:
            out.chmod(0o755)


# -- resume of a finished run (issue 13) ---------------------------------------------------------------

def test_resume_of_a_finished_run_without_checkpoints_extends_from_final(tmp_path, tokenizer, vowel_task):
    from evolm.jobs import run_es

    run, model = _run_es(tmp_path / "a", tokenizer, vowel_task, iterations=2, prompts_per_iteration=2)
    first = run.train_records()
    assert not run.checkpoints()
    cfg = config.load(config.ESJob, run.config_path, ["es.iterations=3"])
    from evolm.backends.hf import HFGenerator

    fresh = make_tiny_model(tokenizer)  # the base weights: final/ must replace them
    run_es(cfg, resume=run, model=fresh, tokenizer=tokenizer, task=vowel_task, generator=HFGenerator(fresh, tokenizer, 16),
           quiet=True)
    assert run.train_records()[:2] == first, "updates 1-2 were kept, not recomputed"
    assert [r["step"] for r in run.train_records()] == [1, 2, 3]
    assert run.config_history()[-1]["resumed_from"] == "update 2 (final/)"
    _, whole = _run_es(tmp_path / "b", tokenizer, vowel_task, iterations=3, prompts_per_iteration=2)
    for (n, p), (_, q) in zip(whole.named_parameters(), fresh.named_parameters()):
        assert torch.equal(p, q), n


def test_extending_a_run_retires_its_old_eval_after(tmp_path, tokenizer, vowel_task, capsys):
    # eval_after.json must describe the final weights: an extension that stops early must not show the old one
    from evolm.backends.hf import HFGenerator
    from evolm.jobs import run_es

    run, _ = _run_es(tmp_path, tokenizer, vowel_task, iterations=2, prompts_per_iteration=2)
    old = {"label": "after", "step": 2, "summary": {"pass@1": 0.25}, "problems": []}
    (run.path / "eval_after.json").write_text(json.dumps(old))
    cfg = config.load(config.ESJob, run.config_path, ["es.iterations=3"])
    model = make_tiny_model(tokenizer)
    run_es(cfg, resume=run, model=model, tokenizer=tokenizer, task=vowel_task, generator=HFGenerator(model, tokenizer, 16))
    assert not (run.path / "eval_after.json").exists()  # this run measures none (eval.before_after = false)
    assert json.loads((run.path / "eval_after_step2.json").read_text()) == old  # kept, under the update it measured
    assert "eval_after_step2.json: the held-out evaluation of the weights before this resume" in capsys.readouterr().out
    # a resume with nothing to do changes no file
    (run.path / "eval_after.json").write_text(json.dumps({**old, "step": 3}))
    run_es(cfg, resume=run, model=model, tokenizer=tokenizer, task=vowel_task, generator=HFGenerator(model, tokenizer, 16),
           quiet=True)
    assert json.loads((run.path / "eval_after.json").read_text())["step"] == 3


def test_bfloat16_runs_extend_from_final_with_exact_masters(tmp_path, tokenizer, vowel_task):
    from evolm.backends.hf import HFGenerator
    from evolm.jobs import run_es

    def bf16():
        return make_tiny_model(tokenizer).to(torch.bfloat16)

    run, _ = _run_es(tmp_path / "a", tokenizer, vowel_task, model=bf16(), iterations=1, prompts_per_iteration=2)
    cfg = config.load(config.ESJob, run.config_path, ["es.iterations=2"])
    resumed = bf16()
    run_es(cfg, resume=run, model=resumed, tokenizer=tokenizer, task=vowel_task,
           generator=HFGenerator(resumed, tokenizer, 16), quiet=True)
    whole_run, _ = _run_es(tmp_path / "b", tokenizer, vowel_task, model=bf16(), iterations=2, prompts_per_iteration=2)
    from safetensors.torch import load_file

    a, b = load_file(str(run.path / "final" / "model.safetensors")), load_file(str(whole_run.path / "final" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_grpo_budget_may_not_change_under_a_schedule():
    from evolm.grpo import GRPOJob, check_resumable
    from evolm.jobs import Start

    cfg = config.from_dict(GRPOJob, {"grpo": {"steps": 4, "lr_scheduler": "linear"}})
    with pytest.raises(UserError, match="grpo.steps cannot change on resume with grpo.lr_scheduler = 'linear'"):
        check_resumable(Start(), {"grpo": {"steps": 3}}, cfg)
    check_resumable(Start(), {"grpo": {"steps": 4}}, cfg)
    check_resumable(Start(), {"grpo": {"steps": 3}}, config.from_dict(GRPOJob, {"grpo": {"steps": 4}}))


def test_config_changes_compare_field_by_field_with_defaults_for_missing_ones():
    cfg = config.from_dict(config.ESJob, {}, ["es.sigma=0.002", "task.params.digits=3"])
    old = {"es": {"sigma": 0.001}, "task": {"params": {}}}  # an old config.toml lacking most fields
    assert config.config_changes(old, cfg) == {"es.sigma": {"old": 0.001, "new": 0.002},
                                               "task.params.digits": {"old": None, "new": 3},
                                               # es.noise became "auto" (counter); a config.toml without it ran the table
                                               "es.noise": {"old": "table", "new": "counter"},
                                               # generation.cpu_matmul became "auto" (oneDNN here); without it: torch's
                                               "generation.cpu_matmul": {"old": "torch", "new": cfg.generation.cpu_matmul}}
    assert cfg.generation.cpu_matmul in ("onednn", "torch")
    assert config.config_changes(config.to_dict(cfg), cfg) == {}


# -- item 2 and issue 13 item 4: the kernel build --------------------------------------------------------

def test_kernel_build_folder_is_keyed_by_torch_python_and_compiler():
    from evolm.es import fused

    key = fused.build_key()
    assert set(key) == {"torch", "torch_path", "python", "compiler", "source"} and key["torch"] == torch.__version__
    assert key["torch_path"] == os.path.dirname(torch.__file__)  # two venvs never share (and rebuild) one folder
    dirs = {fused.build_dir(key)} | {fused.build_dir({**key, field: "other"}) for field in key}
    assert len(dirs) == 6 and all(d.name.startswith(fused.NAME + "-") for d in dirs)


def _kernel_in_child(env_extra: dict, code: str, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, **env_extra}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)


def test_a_stale_build_lock_never_hangs_a_process(tmp_path):
    """A process killed inside torch's build leaves ``lock`` behind; torch would wait for it forever
    (a resume 5 s after such a kill sat at 0% CPU for minutes). The next process must load the kernel."""
    from evolm.es import fused

    if fused.kernel() is None:
        pytest.skip("no C++ toolchain for the fused kernel")
    build = fused.build_dir()
    with fused.build_lock(build):  # no live build in progress while the stale lock is planted
        (build / "lock").write_text("")  # just now: younger than any age-based timeout
    code = "from evolm.es import fused; print('kernel' if fused.kernel() is not None else 'none')"
    try:
        child = _kernel_in_child({}, code, timeout=240)
    except subprocess.TimeoutExpired:
        pytest.fail("kernel() hung on a stale torch build lock")
    assert child.returncode == 0 and child.stdout.strip() == "kernel", child.stderr
    # another evolm process (the other pytest worker) may be loading the kernel right now, with torch's
    # own lock file inside; holding the OS lock, as the kernel does, excludes that (CI hit the race)
    with fused.build_lock(build):
        assert not (build / "lock").exists()


def test_a_live_build_elsewhere_is_waited_for_then_given_up_with_a_message(tmp_path):
    from evolm.es import fused

    if fused.kernel() is None:
        pytest.skip("no C++ toolchain for the fused kernel")
    code = "from evolm.es import fused; fused.BUILD_WAIT_S = 1.5; print('kernel' if fused.kernel() is not None else 'none')"
    t0 = time.monotonic()
    with fused.build_lock(fused.build_dir()):  # this process "is building"
        child = _kernel_in_child({}, code, timeout=240)
    assert child.returncode == 0 and child.stdout.strip() == "none", child.stderr
    assert f"waiting for process {os.getpid()} to finish building" in child.stderr
    assert "using the torch ops" in child.stderr and time.monotonic() - t0 < 200


def test_the_kernel_is_built_before_the_timed_loop_also_on_resume(tmp_path, tokenizer, vowel_task, monkeypatch):
    """A slow build (here: loading the real kernel after a 3 s pause, standing in for compilation) must
    not land in an update's perturb time, also when a resumed process builds it (the seed-log header,
    which asks for the kernel on a fresh run, already exists then)."""
    import torch.utils.cpp_extension as cpp

    from evolm.backends.hf import HFGenerator
    from evolm.es import fused
    from evolm.jobs import run_es

    if fused.kernel() is None:
        pytest.skip("no C++ toolchain for the fused kernel")
    run, model = _run_es(tmp_path, tokenizer, vowel_task, iterations=1)
    real = cpp.load_inline

    def slow_load_inline(**kw):
        time.sleep(3)
        return real(**kw)

    monkeypatch.setattr(cpp, "load_inline", slow_load_inline)
    fused.kernel.cache_clear()
    try:
        cfg = config.load(config.ESJob, run.config_path, ["es.iterations=2"])
        run_es(cfg, resume=run, model=model, tokenizer=tokenizer, task=vowel_task,
               generator=HFGenerator(model, tokenizer, 16), quiet=True)
    finally:
        fused.kernel.cache_clear()
    records = run.train_records()
    assert [r["step"] for r in records] == [1, 2] and run.seed_log()[0]["perturb"]["path"] == "kernel"
    assert all(r["seconds_perturb"] < 3 for r in records), [r["seconds_perturb"] for r in records]


@pytest.mark.parametrize("save, save_dtype", [("final", "bfloat16"), ("none", "float32")])
def test_a_finished_run_without_float32_final_weights_is_not_extended(tmp_path, tokenizer, vowel_task, save, save_dtype):
    """Extending needs the trained float32 weights: a bf16-cast final/ or no final/ at all would
    restart from rounded or base weights and rewrite the past; refused in one line, no file changed."""
    from evolm.backends.hf import HFGenerator
    from evolm.errors import UserError
    from evolm.jobs import run_es

    cfg = config.ESJob()
    cfg.run.out_dir, cfg.run.name, cfg.run.progress, cfg.run.checkpoint_every = str(tmp_path), "run", False, 0
    cfg.run.save, cfg.run.save_dtype = save, save_dtype
    cfg.eval.before_after = False
    cfg.generation.max_new_tokens = 6
    cfg.es.population, cfg.es.prompts_per_iteration, cfg.es.iterations, cfg.es.sigma, cfg.es.lr = 4, 2, 1, 0.05, 0.01
    model = make_tiny_model(tokenizer)
    run = run_es(cfg, model=model, tokenizer=tokenizer, task=vowel_task, generator=HFGenerator(model, tokenizer, 16),
                 quiet=True)
    before = {p.name: p.read_bytes() for p in run.path.iterdir() if p.is_file()}
    longer = config.load(config.ESJob, run.config_path, ["es.iterations=2"])
    fresh = make_tiny_model(tokenizer)
    with pytest.raises(UserError, match=r"without float32 final weights .*evolm replay") as e:
        run_es(longer, resume=run, model=fresh, tokenizer=tokenizer, task=vowel_task,
               generator=HFGenerator(fresh, tokenizer, 16), quiet=True)
    assert "\n" not in str(e.value)
    assert {p.name: p.read_bytes() for p in run.path.iterdir() if p.is_file()} == before


def test_a_run_whose_matched_budget_is_spent_has_nothing_to_resume(tmp_path, tokenizer, vowel_task):
    """run.match = sequences: the run stops when the budget is spent, before the update cap; a plain
    resume then has nothing to do (it must not train one more update)."""
    from evolm.backends.hf import HFGenerator
    from evolm.jobs import run_es

    cfg = config.ESJob()
    cfg.run.out_dir, cfg.run.name, cfg.run.progress, cfg.run.checkpoint_every = str(tmp_path), "run", False, 0
    cfg.run.match, cfg.run.budget = "sequences", 8  # 4 members x 2 prompts = 8 sequences: one update
    cfg.eval.before_after = False
    cfg.generation.max_new_tokens = 6
    cfg.es.population, cfg.es.prompts_per_iteration, cfg.es.iterations, cfg.es.sigma, cfg.es.lr = 4, 2, 5, 0.05, 0.01
    model = make_tiny_model(tokenizer)
    run = run_es(cfg, model=model, tokenizer=tokenizer, task=vowel_task, generator=HFGenerator(model, tokenizer, 16),
                 quiet=True)
    assert [r["step"] for r in run.train_records()] == [1]
    before = {p.name: p.read_bytes() for p in run.path.iterdir() if p.is_file()}
    fresh = make_tiny_model(tokenizer)
    run_es(config.load(config.ESJob, run.config_path), resume=run, model=fresh, tokenizer=tokenizer, task=vowel_task,
           generator=HFGenerator(fresh, tokenizer, 16), quiet=True)
    assert [r["step"] for r in run.train_records()] == [1]
    assert {p.name: p.read_bytes() for p in run.path.iterdir() if p.is_file()} == before


def test_config_and_resume_together_is_a_one_line_error(tmp_path, capsys):
    """A resume reads the run's own config.toml: a --config beside it would be ignored, so it is refused."""
    cfg = tmp_path / "c.toml"
    cfg.write_text("[es]\niterations = 30\n")
    assert main(["es", "--config", str(cfg), "--resume", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("evolm: error: --config and --resume together") and "--set es.iterations=N" in err
    assert "\n" not in err
