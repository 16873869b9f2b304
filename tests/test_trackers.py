"""Experiment trackers (``run.report_to``): what ES, GRPO, pipeline and sweep runs stream to TensorBoard
and wandb, checked by reading back the files the trackers wrote (TensorBoard event files through
TensorBoard's own ``EventAccumulator``; wandb's offline ``run-*.wandb`` log through wandb's record
protobuf), never by mocking them. Every record of ``metrics.jsonl`` must be there, once, at its step."""

from __future__ import annotations

import glob
import json
import re
import struct
from pathlib import Path

import pytest

from conftest import make_tiny_model
from evolm import config
from evolm.errors import ConfigError, UserError
from evolm.runs import RunDir
from evolm.trackers import scalars

pytest.importorskip("tensorboard")
pytest.importorskip("wandb")


# -- reading back what the trackers wrote ----------------------------------------------------------------

def tensorboard_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """``{tag: [(step, value), ...]}`` from the run's TensorBoard event files (purged steps dropped)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def tensorboard_text(run_dir: Path, tag: str) -> str:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"tensors": 0})
    acc.Reload()
    tensor = acc.Tensors(f"{tag}/text_summary")[0].tensor_proto
    return tensor_util.make_ndarray(tensor).item().decode()


def wandb_records(path: str) -> list:
    """The protobuf records of a wandb ``run-*.wandb`` file: its LevelDB-style log (7-byte file header
    ``:W&B``, 32 KiB blocks of records with a 7-byte header: checksum, length, type full/first/middle/last)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    ident, magic, _ = struct.unpack("<4sHB", data[:7])
    assert ident == b":W&B" and magic == 0xBEE1
    block, pos, chunks, pending = 32768, 7, [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:
            pos += left
            continue
        body = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 1:
            chunks.append(body)
        elif kind == 2:
            pending = body
        elif kind == 3:
            pending += body
        else:
            chunks.append(pending + body)
    records = []
    for chunk in chunks:
        r = pb.Record()
        r.ParseFromString(chunk)
        records.append(r)
    return records


def _attempt_order(path: str) -> tuple[str, int]:
    """Sort key of an offline run file: its directory's start second, then wandb's "-1", "-2" suffix for a run
    directory started in the same second as an earlier one (a resume right after a kill). Sorting the paths as
    text put "offline-run-T-ID-1/" before "offline-run-T-ID/" ("-" < "/"): the resumed attempt's rows first."""
    m = re.fullmatch(r"offline-run-(\d{8}_\d{6})-[^-]+(?:-(\d+))?", Path(path).parent.name)
    assert m, f"unexpected wandb offline run directory {Path(path).parent.name}"
    return m.group(1), int(m.group(2) or 0)


def wandb_run(run_dir: Path) -> dict:
    """The offline wandb run(s) under ``RUN_DIR/wandb``: name, group, config and history rows."""
    files = sorted(glob.glob(str(run_dir / "wandb" / "offline-run-*" / "run-*.wandb")), key=_attempt_order)
    assert files, f"no wandb offline run under {run_dir}"
    out = {"files": files, "history": [], "config": {}, "exit": []}
    for f in files:
        for r in wandb_records(f):
            kind = r.WhichOneof("record_type")
            if kind == "run":
                out.update(id=r.run.run_id, name=r.run.display_name, group=r.run.run_group, project=r.run.project,
                           job_type=r.run.job_type)
                out["config"].update({u.key: json.loads(u.value_json) for u in r.run.config.update})
            elif kind == "history":
                out["history"].append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item})
            elif kind == "exit":
                out["exit"].append(r.exit.exit_code)
    return out


def expected(run: RunDir, records=None) -> dict[str, list[tuple[int, float]]]:
    """What every tracker must hold: each record's scalars at its step, in order."""
    out: dict[str, list[tuple[int, float]]] = {}
    for r in records if records is not None else run.metrics():
        for tag, value in scalars(r).items():
            out.setdefault(tag, []).append((int(r["step"]), value))
    return out


def assert_tensorboard_holds(run: RunDir, records=None) -> None:
    got = tensorboard_scalars(run.path)
    want = expected(run, records)
    assert set(got) == set(want)
    for tag, points in want.items():
        assert [s for s, _ in got[tag]] == [s for s, _ in points], tag
        assert [v for _, v in got[tag]] == pytest.approx([v for _, v in points], rel=1e-6, abs=1e-30), tag


def assert_wandb_holds(run: RunDir, records=None) -> dict:
    w = wandb_run(run.path)
    want = expected(run, records)
    for tag, points in want.items():
        rows = [(h["update"], h[tag]) for h in w["history"] if tag in h]
        assert [s for s, _ in rows] == [s for s, _ in points], tag
        assert [v for _, v in rows] == pytest.approx([v for _, v in points], rel=1e-12), tag
    return w


# -- runs ----------------------------------------------------------------------------------------------

def _es_cfg(tmp_path, name="run", **run_fields) -> config.ESJob:
    cfg = config.ESJob()
    cfg.run.out_dir, cfg.run.name, cfg.run.progress, cfg.run.checkpoint_every = str(tmp_path), name, False, 0
    for k, v in run_fields.items():
        setattr(cfg.run, k, v)
    cfg.generation.max_new_tokens = 6
    cfg.es.population, cfg.es.prompts_per_iteration, cfg.es.iterations = 4, 4, 3
    cfg.es.sigma, cfg.es.lr = 0.02, 0.01
    cfg.eval.count, cfg.eval.n_samples, cfg.eval.k, cfg.eval.max_new_tokens = 2, 2, [1, 2], 4
    cfg.probe.every, cfg.probe.task, cfg.probe.count, cfg.probe.n_samples, cfg.probe.k = 2, "", 2, 2, [1, 2]
    cfg.probe.max_new_tokens = 4
    return cfg


def _run_es(cfg, tokenizer, task, **kw):
    from evolm.backends.hf import HFGenerator
    from evolm.jobs import run_es

    model = make_tiny_model(tokenizer)
    return run_es(cfg, model=model, tokenizer=tokenizer, task=task, generator=HFGenerator(model, tokenizer, 16),
                  quiet=True, **kw)


def test_an_es_run_streams_every_record_to_tensorboard_and_wandb(tmp_path, tokenizer, vowel_task):
    cfg = _es_cfg(tmp_path, report_to=["tensorboard", "wandb"], tracker_project="evolm-tests")
    run = _run_es(cfg, tokenizer, vowel_task)
    kinds = {r["kind"] for r in run.metrics()}
    assert kinds == {"train", "probe", "eval"}
    assert_tensorboard_holds(run)
    assert "train/reward_mean" in tensorboard_scalars(run.path) and "eval/pass@2" in tensorboard_scalars(run.path)
    text = tensorboard_text(run.path, "config")
    assert "sigma = 0.02" in text and "[es]" in text  # the resolved config, as TOML
    w = assert_wandb_holds(run)
    assert w["name"] == "run" and w["project"] == "evolm-tests" and w["job_type"] == "es" and not w["group"]
    assert w["config"]["es"]["sigma"] == 0.02 and w["config"]["run"]["report_to"] == ["tensorboard", "wandb"]
    assert w["exit"] == [0]
    info = run.info()["trackers"]
    assert info["wandb"]["id"] == w["id"] and Path(info["tensorboard"]["dir"]) == run.path / "tensorboard"


def test_a_resumed_run_replaces_the_lost_updates_in_tensorboard_and_keeps_one_wandb_run(tmp_path, tokenizer,
                                                                                      vowel_task):
    class Kill(Exception):
        pass

    def kill_at_3(step, record):
        if step == 3:
            raise Kill

    cfg = _es_cfg(tmp_path, report_to=["tensorboard", "wandb"], checkpoint_every=2)
    cfg.es.iterations, cfg.eval.before_after, cfg.probe.every = 4, False, 0
    with pytest.raises(Kill):
        _run_es(cfg, tokenizer, vowel_task, callbacks=(kill_at_3,))
    run = RunDir.open(tmp_path / "run")
    assert wandb_run(run.path)["exit"] == [1], "the killed run's tracker run is closed as failed"
    _run_es(cfg, tokenizer, vowel_task, resume=run)
    assert [r["step"] for r in run.train_records()] == [1, 2, 3, 4]
    assert_tensorboard_holds(run)  # step 3 of the killed attempt is purged, not duplicated
    w = wandb_run(run.path)
    assert len({f.split("run-")[-1] for f in w["files"]}) == 1, "the resume continues the same wandb run id"
    assert [h["update"] for h in w["history"]][-2:] == [3, 4] and w["exit"] == [1, 0]


def test_grpo_records_reach_tensorboard_once_with_trls_metrics(tmp_path, tokenizer):
    pytest.importorskip("trl")
    import test_grpo  # registers the toy_letter task

    from evolm.jobs import run_grpo

    cfg = test_grpo.tiny_cfg(tmp_path, probe_every=0)
    cfg.run.report_to = ["tensorboard"]
    run = run_grpo(cfg, model=make_tiny_model(tokenizer), tokenizer=tokenizer, quiet=True)
    assert_tensorboard_holds(run)
    tags = tensorboard_scalars(run.path)
    assert {"train/loss", "train/grad_norm", "train/reward_mean", "train/gen_tokens"} <= set(tags)
    assert [s for s, _ in tags["train/loss"]] == [1, 2]
    assert not (run.path / "runs").exists(), "TRL's own report_to stays off: nothing is logged twice"


def test_a_pipeline_is_one_tracker_run_on_the_global_update_axis(tmp_path, tokenizer, vowel_task):
    pytest.importorskip("trl")
    import test_pipeline

    from evolm.pipeline import run_pipeline

    cfg = test_pipeline.tiny_cfg(tmp_path, ["es:1", "grpo:1"], 2, run={"report_to": ["tensorboard", "wandb"]},
                                 eval={"before_after": True, "count": 2, "n_samples": 2, "k": [1, 2],
                                       "max_new_tokens": 4}, probe={"every": 0})
    run = run_pipeline(cfg, model=make_tiny_model(tokenizer), tokenizer=tokenizer, task=vowel_task, quiet=True)
    assert_tensorboard_holds(run)  # every record of the combined stream, each once
    tags = tensorboard_scalars(run.path)
    assert [s for s, _ in tags["train/reward_mean"]] == [1, 2] and [s for s, _ in tags["eval/greedy"]] == [0, 2]
    assert [v for _, v in tags["train/stage"]] == [0, 1]
    w = assert_wandb_holds(run)
    assert w["job_type"] == "pipeline" and w["name"] == "p"
    for stage in ("00-es", "01-grpo"):
        assert not (run.path / "stages" / stage / "tensorboard").exists(), "stages open no trackers of their own"


def test_sweep_points_are_grouped_runs_named_after_the_sweep(tmp_path, tokenizer, vowel_task):
    from evolm.sweep import run_sweep

    base = {"run": {"progress": False, "checkpoint_every": 0, "report_to": ["wandb", "tensorboard"]},
            "generation": {"max_new_tokens": 6}, "eval": {"before_after": False},
            "es": {"population": 4, "prompts_per_iteration": 4, "iterations": 2, "lr": 0.01}}

    def runner(cfg, resume, **kw):
        return _run_es(cfg, tokenizer, vowel_task, resume=resume, **kw)

    sweep = run_sweep(base, {"es.sigma": [0.01, 0.02]}, tmp_path / "sig", runner=runner, config_class=config.ESJob,
                      say=lambda *a: None)
    for point in ("es.sigma=0.01", "es.sigma=0.02"):
        run = RunDir.open(sweep.path / point)
        w = assert_wandb_holds(run)
        assert w["group"] == "sig" and w["name"] == f"sig/{point}"
        assert_tensorboard_holds(run)


def test_report_to_is_validated_and_a_missing_package_fails_before_the_run_directory_exists(tmp_path, tokenizer,
                                                                                          vowel_task, monkeypatch):
    with pytest.raises(ConfigError, match="did you mean 'tensorboard'"):
        config.from_dict(config.ESJob, {}, ["run.report_to=['tensorbord']"])
    with pytest.raises(ConfigError, match="twice"):
        config.from_dict(config.ESJob, {}, ["run.report_to=['wandb','wandb']"])
    from evolm import trackers

    monkeypatch.setitem(trackers.PACKAGES, "tensorboard", "evolm_no_such_package")
    with pytest.raises(UserError, match=r"evolm\[trackers\]"):
        _run_es(_es_cfg(tmp_path, report_to=["tensorboard"]), tokenizer, vowel_task)
    assert not (tmp_path / "run").exists()


def test_a_failing_tracker_is_dropped_with_one_warning_and_the_run_goes_on(tmp_path, tokenizer, vowel_task, capsys):
    from evolm.trackers import Trackers

    class Broken:
        name = "broken"

        def log(self, step, values):
            raise OSError("disk full")

        def close(self, status):
            pass

    trackers = Trackers([Broken()])
    trackers({"step": 1, "kind": "train", "reward_mean": 0.5})
    trackers({"step": 2, "kind": "train", "reward_mean": 0.6})
    err = capsys.readouterr().err
    assert err.count("the broken tracker failed (OSError: disk full)") == 1 and not trackers


def test_scalars_keep_finite_numbers_only():
    record = {"step": 3, "kind": "probe", "pass@1": 0.25, "entropy": float("nan"), "task": "x", "ok": True,
              "fitness": [1, 2], "n": 4, "none": None}
    assert scalars(record) == {"probe/pass@1": 0.25, "probe/n": 4.0}
    assert scalars({"step": 1, "reward_mean": 1}) == {"train/reward_mean": 1.0}


def test_offline_runs_are_read_in_the_order_their_attempts_started():
    # a resume in the same second as the kill gets wandb's "-1" directory, which sorts first as text
    first, second = ("/r/wandb/offline-run-20261204_170741-abc/run-abc.wandb",
                     "/r/wandb/offline-run-20261204_170741-abc-1/run-abc.wandb")
    assert sorted([first, second]) == [second, first]
    assert sorted([second, first], key=_attempt_order) == [first, second]
    assert sorted([first, "/r/wandb/offline-run-20261204_170740-abc-1/run-abc.wandb"], key=_attempt_order)[1] == first
