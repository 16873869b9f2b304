"""What a run keeps on disk: ``run.save`` (all / final / none), ``run.save_dtype``, ``evolm replay``
(an ES run's weights at any update, rebuilt from its seed log, bit-identical to its checkpoints), and
ordinary file permissions (0644 files, 0755 directories under umask 022)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import make_tiny_model
from evolm import config, runs
from evolm.commands import main
from evolm.errors import ConfigError, UserError
from evolm.jobs import replay_run, run_es
from evolm.runs import RunDir


@pytest.fixture
def base_dir(tmp_path, tokenizer) -> Path:
    base = tmp_path / "base"
    make_tiny_model(tokenizer).save_pretrained(base)
    tokenizer.save_pretrained(base)
    return base


def _cfg(tmp_path, base: Path, name: str, **run_fields) -> config.ESJob:
    cfg = config.ESJob()
    cfg.run.out_dir, cfg.run.name, cfg.run.progress, cfg.run.checkpoint_every, cfg.run.keep_checkpoints = \
        str(tmp_path), name, False, 2, 5
    for k, v in run_fields.items():
        setattr(cfg.run, k, v)
    cfg.model.spec = str(base)
    cfg.eval.before_after = False
    cfg.generation.max_new_tokens, cfg.generation.batch_size = 8, 16
    cfg.es.population, cfg.es.prompts_per_iteration, cfg.es.iterations, cfg.es.sigma, cfg.es.lr = 4, 4, 4, 0.02, 0.01
    return cfg


def _weights(directory: Path) -> dict:
    return load_file(str(directory / "model.safetensors"))


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_replay_rebuilds_every_step_bit_for_bit_and_save_none_keeps_no_weights(tmp_path, base_dir, vowel_task, capsys):
    run = run_es(_cfg(tmp_path, base_dir, "all"), task=vowel_task, quiet=True)
    applied = [r["status"] for r in run.seed_log() if r.get("kind") != "header"]
    assert applied.count("applied") >= 2, "the toy task gives a fitness signal, so the weights move"
    assert [p.name for p in run.checkpoints()] == ["step_000002"]

    replayed = replay_run(run.path, step=2, say=lambda *a: None)
    assert replayed == run.path / "replay" / "step_000002"
    assert _same(_weights(replayed), _weights(run.path / "checkpoints" / "step_000002"))
    assert not _same(_weights(replayed), _weights(base_dir)) and not _same(_weights(replayed), _weights(run.path / "final"))
    assert main(["replay", str(run.path), "--step", "4", "--out", str(tmp_path / "r4")]) == 0
    assert _same(_weights(tmp_path / "r4"), _weights(run.path / "final"))
    assert main(["replay", str(run.path), "--step", "0", "--out", str(tmp_path / "r0")]) == 0
    assert _same(_weights(tmp_path / "r0"), _weights(base_dir))
    assert json.loads((tmp_path / "r4" / "state.json").read_text())["step"] == 4

    none = run_es(_cfg(tmp_path, base_dir, "none", save="none"), task=vowel_task, quiet=True)
    assert not (none.path / "final").exists() and not (none.path / "checkpoints").exists()
    assert none.state() == "finished" and none.info()["weights"] == "none"
    assert _same(_weights(replay_run(none.path, say=lambda *a: None)), _weights(run.path / "final")), \
        "a run that kept no weights gets them back from its seed log"
    capsys.readouterr()
    assert main(["eval", "--like", str(none.path)]) == 2
    assert "evolm replay" in capsys.readouterr().err

    final = run_es(_cfg(tmp_path, base_dir, "final", save="final"), task=vowel_task, quiet=True)
    assert not (final.path / "checkpoints").exists() and _same(_weights(final.path / "final"), _weights(run.path / "final"))


def test_bfloat16_final_weights_are_the_float32_ones_rounded_and_load(tmp_path, base_dir, vowel_task):
    from evolm import models

    cfg = _cfg(tmp_path, base_dir, "bf16", save_dtype="bfloat16", checkpoint_every=0)
    cfg.es.iterations = 2
    run = run_es(cfg, task=vowel_task, quiet=True)
    stored = _weights(run.path / "final")
    assert {t.dtype for t in stored.values()} == {torch.bfloat16}
    full = _weights(replay_run(run.path, say=lambda *a: None))
    assert _same(stored, {k: v.to(torch.bfloat16) for k, v in full.items()})
    assert json.loads((run.path / "final" / "config.json").read_text())["dtype"] == "bfloat16"
    assert (run.path / "final" / "model.safetensors").stat().st_size < 0.6 * (base_dir / "model.safetensors").stat().st_size
    model, _ = models.load(str(run.path), dtype="float32", threads=1)
    assert next(model.parameters()).dtype == torch.float32


def test_run_files_are_0644_and_directories_0755_under_umask_022(tmp_path, base_dir, vowel_task, monkeypatch):
    old = os.umask(0o022)
    monkeypatch.setattr(runs, "_UMASK", 0o022)
    try:
        cfg = _cfg(tmp_path, base_dir, "perm")
        cfg.es.iterations, cfg.run.checkpoint_every = 3, 1
        run = run_es(cfg, task=vowel_task, quiet=True)
    finally:
        os.umask(old)
    checked = {"dirs": 0, "files": 0}
    for path in [run.path, *run.path.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        if path.is_dir():
            assert mode == 0o755, f"{path} is {oct(mode)}"
            checked["dirs"] += 1
        else:
            assert mode == 0o644, f"{path} is {oct(mode)}"
            checked["files"] += 1
    assert (run.path / "checkpoints" / "step_000002").is_dir() and (run.path / "final" / "model.safetensors").exists()
    assert checked["dirs"] >= 5 and checked["files"] >= 15


def test_save_modes_are_validated_and_replay_refuses_what_it_cannot_rebuild(tmp_path):
    with pytest.raises(ConfigError, match=r"run.save must be one of \['all', 'final', 'none'\]"):
        config.from_dict(config.ESJob, {}, ["run.save='some'"])
    from evolm.pipeline import PipelineJob

    with pytest.raises(ConfigError, match="not available for pipelines"):
        config.from_dict(PipelineJob, {}, ["run.save='none'"])
    grpo = RunDir.create(tmp_path, "g", config.to_toml(config.ESJob()), kind="grpo")
    with pytest.raises(UserError, match="only ES runs"):
        replay_run(grpo.path)
    es = RunDir.create(tmp_path, "e", config.to_toml(config.ESJob()), kind="es")
    with pytest.raises(UserError, match="no seed-log header"):
        replay_run(es.path)
    es.log_seed({"kind": "header"})
    with pytest.raises(UserError, match=r"outside the run's logged updates 0..0"):
        replay_run(es.path, step=3)
