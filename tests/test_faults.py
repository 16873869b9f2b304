"""Kill -9 and resume, end to end: ES, GRPO and pipelines stopped at chosen moments, resumed, and
compared bit for bit with uninterrupted runs; SIGINT and SIGTERM; a full disk; what a resume may change.

Every run is the real ``evolm`` CLI in a forked child process (``tests/faults.py``) on a tiny random
llama saved as a model directory, with the toy vowel task (a random model gets mixed rewards, so
updates really move the weights). To keep the suite cheap, each method's kill points form one chain:
the run is killed at the first point, resumed, the resume killed at the next point, and so on, and
only the last resume runs to the end; its final weights, metrics and seed log must equal those of
one uninterrupted run. Each kill is checked to have happened where intended (the child died of
SIGKILL, the half-written file it was writing is there).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import make_tiny_model, make_vowel_task
from faults import KILLED, both, kill_mid_append, kill_on_call, kill_on_replace, run_cli
from evolm.commands import main
from evolm.runs import TEMPORARY, RunDir
from evolm.tasks import register

register(type(make_vowel_task()))  # the CLI builds its task by name; forked children inherit the registry

TIMING = ("seconds", "rss", "time", "started", "finished")


def comparable(records: list[dict]) -> list[dict]:
    """Records without the fields that measure this process (durations, memory)."""
    return [{k: v for k, v in r.items() if not any(t in k for t in TIMING)} for r in records]


def weights(directory: Path) -> dict:
    return load_file(str(Path(directory) / "model.safetensors"))


def assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), f"{k} differs between {a} and {b}"


def temporaries(run: Path) -> list[str]:
    return [str(p.relative_to(run)) for p in run.rglob("*") if TEMPORARY.match(p.name)]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, tokenizer) -> Path:
    path = tmp_path_factory.mktemp("model") / "tiny"
    make_tiny_model(tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def write_config(kind: str, path: Path, tiny: Path, out: Path, name: str, **sections) -> Path:
    """A config file for a job of ``kind`` on the tiny model, writing ``out/name``."""
    base = {
        "run": {"out_dir": str(out), "name": name, "checkpoint_every": 2, "keep_checkpoints": 2, "progress": False,
                "seed": 3},
        "model": {"spec": str(tiny)},
        "task": {"name": "vowels"},
        "generation": {"max_new_tokens": 4, "batch_size": 16},
        "es": {"iterations": 4, "population": 4, "prompts_per_iteration": 4, "sigma": 0.02, "lr": 0.01},
        "grpo": {"steps": 3, "num_generations": 4, "prompts_per_step": 2, "max_completion_length": 4, "lr": 1e-3},
        "eval": {"count": 2, "n_samples": 2, "k": [1, 2], "max_new_tokens": 4},
        "probe": {"every": 2, "count": 2, "n_samples": 2, "k": [1, 2], "max_new_tokens": 4},
    }
    for section, values in sections.items():
        base[section] = {**base.get(section, {}), **values}
    if kind != "pipeline":  # an ES or a GRPO job has only its own method's section
        base.pop("grpo" if kind == "es" else "es")
    import tomli_w

    path.write_text(tomli_w.dumps(base))
    return path


def train_steps(run: Path) -> list[int]:
    return [r["step"] for r in RunDir(run).train_records()]


# -- ES: one chain of kills --------------------------------------------------------------------------

def test_es_survives_kills_at_every_stage_and_extends_bit_identically(tmp_path, tiny_dir, capsys):
    from evolm.backends.hf import HFGenerator

    ref_cfg = write_config("es", tmp_path / "ref.toml", tiny_dir, tmp_path, "ref", es={"iterations": 6})
    done = run_cli(["es", "--config", str(ref_cfg)], tmp_path / "ref.log")
    assert done.rc == 0, done.log
    ref = tmp_path / "ref"

    cfg = write_config("es", tmp_path / "es.toml", tiny_dir, tmp_path, "es")
    run = tmp_path / "es"
    resume = ["es", "--resume", str(run)]
    info = lambda: RunDir(run).info()  # noqa: E731
    mine = lambda pid: lambda: info().get("pid") == pid  # noqa: E731

    # Ctrl-C after update 1: a clean stop, marked interrupted (it used to stay "running" for ES)
    out = run_cli(["es", "--config", str(cfg)], tmp_path / "1.log",
                  signal_when=(lambda: 1 in train_steps(run) if (run / "metrics.jsonl").exists() else False, signal.SIGINT))
    assert out.rc == 130 and "interrupted" in out.log, out.log
    assert info()["status"] == "interrupted" and info()["stopped_at_step"] >= 1

    # SIGTERM (a scheduler) once the resume (no checkpoint yet: update 1 rebuilt from the seed log) is running
    def resumed_update():
        try:
            return info().get("resumed_from_step") == 1 and info()["status"] == "running" and 1 in train_steps(run)
        except (OSError, ValueError):
            return False

    out = run_cli(resume, tmp_path / "2.log", signal_when=(resumed_update, signal.SIGTERM))
    assert out.rc == 143 and "terminated (SIGTERM)" in out.log, out.log
    assert info()["status"] == "interrupted"

    # kill -9 with checkpoint step_000002 written to its temporary directory, not yet renamed
    out = run_cli(resume, tmp_path / "3.log", prepare=kill_on_replace(r"checkpoints/step_000002$"))
    assert out.rc == KILLED and any(p.startswith("checkpoints/.step_000002.") for p in temporaries(run))
    assert info()["status"] == "running"

    # no checkpoint survives, so the resume rebuilds update 2 from the seed log; with a checkpoint every update
    # now (a field a resume may change), kill -9 with checkpoints/LATEST of update 3 written to its temporary
    # file, not yet renamed
    out = run_cli([*resume, "--set", "run.checkpoint_every=1"], tmp_path / "4.log",
                  prepare=kill_on_replace(r"checkpoints/LATEST$"))
    assert out.rc == KILLED and "removed checkpoints/.step_000002." in out.log, out.log
    assert "from update 2 (its seed log replayed: no checkpoint)" in out.log, out.log
    assert (run / "checkpoints" / "step_000003").is_dir() and not (run / "checkpoints" / "LATEST").exists()

    # kill -9 in the middle of update 4's generation (the resume starts from step_000003 found without LATEST)
    out = run_cli(resume, tmp_path / "5.log", prepare=kill_on_call(HFGenerator, "generate", 2))
    assert out.rc == KILLED and "from update 3 (checkpoint step_000003)" in out.log, out.log

    # kill -9 halfway through writing update 4's metrics line (a torn record)
    out = run_cli(resume, tmp_path / "6.log", prepare=kill_mid_append("metrics.jsonl", 1))
    assert out.rc == KILLED and not (run / "metrics.jsonl").read_text().endswith("\n")

    # kill -9 with final/ complete in its temporary directory, not yet renamed
    out = run_cli(resume, tmp_path / "7.log", prepare=kill_on_replace(r"/final$"))
    assert out.rc == KILLED and not (run / "final").exists() and any(p.startswith(".final.") for p in temporaries(run))

    # kill -9 just after final/ was renamed into place, before run.json says finished
    out = run_cli(resume, tmp_path / "8.log", prepare=kill_on_replace(r"/final$", when="after"))
    assert out.rc == KILLED and (run / "final").is_dir() and info()["status"] == "running"

    out = run_cli(resume, tmp_path / "9.log")  # continues from final/ (update 4): nothing left to train
    assert out.rc == 0 and "from update 4 (final/)" in out.log, out.log
    assert info()["status"] == "finished" and temporaries(run) == []
    assert_same_weights(run / "final", ref / "checkpoints" / "step_000004")

    # a finished run: a plain resume has nothing to do and rewrites nothing
    before = {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()}
    assert main(resume) == 0
    assert {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()} == before

    # extend to 6 updates, killed between the two renames that swap the old final/ for the new one
    out = run_cli([*resume, "--set", "es.iterations=6", "--set", "run.checkpoint_every=2"], tmp_path / "10.log",
                  prepare=kill_on_replace(r"/\.final\.old$", src=r"/final$", when="after"))
    assert out.rc == KILLED and not (run / "final").exists() and (run / ".final.old").is_dir()
    out = run_cli(resume, tmp_path / "11.log")  # puts the old final/ back, continues from it (update 4)
    assert out.rc == 0 and "put back final/ from .final.old" in out.log and "from update 4 (final/)" in out.log, out.log

    # bit-identical to the uninterrupted 6-update run: weights, seed log, metrics (plus the after-evaluation
    # taken when the run first finished at update 4)
    assert_same_weights(run / "final", ref / "final")
    r, a = RunDir(run), RunDir(ref)
    assert r.seed_log() == a.seed_log()
    extra = [m for m in r.metrics() if m.get("kind") == "eval" and m.get("label") == "after" and m["step"] == 4]
    assert len(extra) == 1
    assert comparable([m for m in r.metrics() if m not in extra]) == comparable(a.metrics())
    assert json.loads((run / "eval_after.json").read_text())["step"] == 6
    assert r.info()["status"] == "finished" and r.info()["steps"] == 6 and temporaries(run) == []
    history = r.config_history()
    assert [h["event"] for h in history] == ["create"] + ["resume"] * 10
    assert [h["changes"] for h in history if h["changes"]] == [{"run.checkpoint_every": {"old": 2, "new": 1}},
                                                                {"es.iterations": {"old": 4, "new": 6},
                                                                 "run.checkpoint_every": {"old": 1, "new": 2}}]
    assert r.config()["es"]["iterations"] == 6

    # what a resume refuses, before it changes anything
    before = {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()}
    capsys.readouterr()
    for override, message in [("es.iterations=5", "has made 6 updates; es.iterations = 5 would discard updates 6-6"),
                              ("es.sigma=0.5", "es.sigma = 0.5 (the run's: 0.02)"),
                              ("run.seed=4", "run.seed = 4 (the run's: 3)"),
                              ("task.params.digits=3", "task.params.digits = 3 (the run's: (unset))")]:
        assert main([*resume, "--set", override]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("evolm: error: ") and message in err and "\n" not in err, err
    assert {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()} == before


def test_resume_refusals_are_one_line(tmp_path, tiny_dir, capsys):
    """The refusals' wording, on a run directory made by hand (no training needed)."""
    from evolm import config

    cfg = config.load(config.ESJob, write_config("es", tmp_path / "c.toml", tiny_dir, tmp_path, "r"))
    run = RunDir.create(tmp_path, "r", config.to_toml(cfg), kind="es")
    run.log_metrics({"step": 3, "kind": "train", "method": "es"})
    run.update_info(status="interrupted")
    for override, message in [("es.iterations=2", "has made 3 updates; es.iterations = 2 would discard updates 3-3"),
                              ("es.lr=0.5", "es.lr = 0.5 (the run's: 0.01)"),
                              ("generation.temperature=1.0", "generation.temperature = 1.0 (the run's: 0.0)")]:
        assert main(["es", "--resume", str(run.path), "--set", override]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("evolm: error: ") and message in err and "\n" not in err, err
    # a run another live process is still writing (here a sleeping child, recorded as the run's writer)
    from evolm.runs import _process_start

    child = subprocess.Popen(["sleep", "60"])
    try:
        run.update_info(status="running", pid=child.pid, pid_start=_process_start(child.pid))
        assert main(["es", "--resume", str(run.path)]) == 2
        assert f"being written by process {child.pid} on this host" in capsys.readouterr().err
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("kind, where, resumed", [
    ("es", "evolm.jobs.record_plugins", False),  # after open_run wrote "running", before the job's body
    ("es", "evolm.jobs.restore_base_dir", True),  # inside open_run, just after a resume wrote "running"
    ("grpo", "evolm.jobs.record_plugins", False),
    ("pipeline", "evolm.pipeline.make_probe", False),
])
def test_a_signal_as_the_run_opens_is_recorded(tmp_path, tiny_dir, monkeypatch, capsys, kind, where, resumed):
    """SIGTERM (or Ctrl-C) landing after run.json says "running" but before the job's outcome was being
    recorded left the run "running" (CI caught it: a SIGTERM sent the moment a resume wrote "running")."""
    from evolm import config
    from evolm.errors import Terminated

    cfg_path = write_config(kind, tmp_path / "c.toml", tiny_dir, tmp_path, "r")
    run = tmp_path / "r"
    if resumed:  # a run stopped before its first update
        cfg = config.load(config.ESJob, cfg_path)
        RunDir.create(tmp_path, "r", config.to_toml(cfg), kind="es").update_info(status="interrupted")

    def terminated(*args, **kwargs):
        assert RunDir(run).info()["status"] == "running"
        raise Terminated("signal 15")

    monkeypatch.setattr(where, terminated)
    argv = [kind, "--resume", str(run)] if resumed else [kind, "--config", str(cfg_path)]
    assert main(argv) == 143
    assert "terminated (SIGTERM)" in capsys.readouterr().err
    assert RunDir(run).info()["status"] == "interrupted"


# -- GRPO ----------------------------------------------------------------------------------------------

def test_grpo_survives_kills_mid_checkpoint_and_mid_update(tmp_path, tiny_dir):
    pytest.importorskip("trl")
    from transformers import Trainer

    grpo = {"run": {"checkpoint_every": 1, "keep_checkpoints": 3}, "eval": {"before_after": False},
            "probe": {"every": 0}}
    ref_cfg = write_config("grpo", tmp_path / "ref.toml", tiny_dir, tmp_path, "ref", **grpo)
    assert run_cli(["grpo", "--config", str(ref_cfg)], tmp_path / "ref.log").rc == 0
    cfg = write_config("grpo", tmp_path / "g.toml", tiny_dir, tmp_path, "g", **grpo)
    run = tmp_path / "g"

    # kill -9 while checkpoint 2's optimizer and RNG files are being written into its temporary directory
    out = run_cli(["grpo", "--config", str(cfg)], tmp_path / "1.log", prepare=kill_on_call(Trainer, "_save_rng_state", 2))
    assert out.rc == KILLED and any(p.startswith("checkpoints/.step_000002.") for p in temporaries(run)), out.log
    # kill -9 in the middle of update 3 (its 4th reward call of 8; the resume redid update 2 first)
    from evolm.tasks import TASKS

    out = run_cli(["grpo", "--resume", str(run)], tmp_path / "2.log", prepare=kill_on_call(TASKS["vowels"], "reward", 12))
    assert out.rc == KILLED and "from update 1 (checkpoint step_000001)" in out.log, out.log
    out = run_cli(["grpo", "--resume", str(run)], tmp_path / "3.log")
    assert out.rc == 0 and "from update 2 (checkpoint step_000002)" in out.log, out.log

    assert_same_weights(run / "final", tmp_path / "ref" / "final")
    assert comparable(RunDir(run).metrics()) == comparable(RunDir(tmp_path / "ref").metrics())
    assert RunDir(run).info()["status"] == "finished" and temporaries(run) == []

    # extending needs the optimizer state of the last update: refused once that checkpoint is gone
    import shutil

    shutil.rmtree(run / "checkpoints" / "step_000003")
    (run / "checkpoints" / "LATEST").write_text("step_000002\n")
    assert main(["grpo", "--resume", str(run), "--set", "grpo.steps=4"]) == 2


# -- pipelines -----------------------------------------------------------------------------------------

def test_pipeline_survives_kills_between_and_inside_stages(tmp_path, tiny_dir):
    pytest.importorskip("trl")
    from evolm import models
    from evolm.backends.hf import HFGenerator

    sections = {"run": {"checkpoint_every": 1, "keep_checkpoints": 3}, "eval": {"before_after": False},
                "probe": {"every": 0}, "pipeline": {"budget": 3, "stages": ["grpo:1", "es:2"]}}
    ref_cfg = write_config("pipeline", tmp_path / "ref.toml", tiny_dir, tmp_path, "ref", **sections)
    assert run_cli(["pipeline", "--config", str(ref_cfg)], tmp_path / "ref.log").rc == 0
    cfg = write_config("pipeline", tmp_path / "p.toml", tiny_dir, tmp_path, "p", **sections)
    run = tmp_path / "p"

    # kill -9 between the stages: the GRPO stage has finished, the ES stage not begun
    out = run_cli(["pipeline", "--config", str(cfg)], tmp_path / "1.log",
                  prepare=kill_on_call(models, "fingerprint", 3))
    assert out.rc == KILLED and RunDir(run / "stages" / "00-grpo").state() == "finished", out.log
    assert not (run / "stages" / "01-es").exists()
    # kill -9 inside the ES stage's second update
    out = run_cli(["pipeline", "--resume", str(run)], tmp_path / "2.log", prepare=kill_on_call(HFGenerator, "generate", 6))
    assert out.rc == KILLED and "stage 00-grpo: finished earlier, skipped" in out.log, out.log
    out = run_cli(["pipeline", "--resume", str(run)], tmp_path / "3.log")
    assert out.rc == 0 and "stage 01-es: es for 2 updates" in out.log and "resuming" in out.log, out.log

    assert_same_weights(run / "final", tmp_path / "ref" / "final")
    assert comparable(RunDir(run).metrics()) == comparable(RunDir(tmp_path / "ref").metrics())
    assert RunDir(run).info()["status"] == "finished" and temporaries(run) == []


# -- a full disk ---------------------------------------------------------------------------------------

@pytest.fixture
def small_tmpfs(tmp_path):
    """A 20 MiB tmpfs (root only): room for one checkpoint of the tiny model, not two."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(mount)],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs root to mount a small tmpfs")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_a_full_disk_stops_cleanly_and_the_run_resumes_bit_identically(tmp_path, tiny_dir, small_tmpfs):
    sections = {"run": {"checkpoint_every": 1, "keep_checkpoints": 1}, "eval": {"before_after": False},
                "probe": {"every": 0}}
    ref_cfg = write_config("es", tmp_path / "ref.toml", tiny_dir, tmp_path, "ref", **sections)
    assert run_cli(["es", "--config", str(ref_cfg)], tmp_path / "ref.log").rc == 0

    cfg = write_config("es", tmp_path / "d.toml", tiny_dir, small_tmpfs, "d", **sections)
    run = small_tmpfs / "d"
    out = run_cli(["es", "--config", str(cfg)], tmp_path / "1.log")
    errors = [line for line in out.log.splitlines() if line.startswith("evolm: error:")]
    assert out.rc == 2 and len(errors) == 1 and "No space left on device" in errors[0], out.log
    assert "Traceback" not in out.log
    info = RunDir(run).info()
    assert info["status"] == "failed" and "No space left" in info["error"] and info["stopped_at_step"] >= 1
    assert RunDir(run).latest_checkpoint()[1]["step"] == 1, "the earlier checkpoint stays intact"
    assert temporaries(run) == []

    subprocess.run(["mount", "-o", "remount,size=200m", str(small_tmpfs)], check=True)
    out = run_cli(["es", "--resume", str(run)], tmp_path / "2.log")
    assert out.rc == 0, out.log
    assert_same_weights(run / "final", tmp_path / "ref" / "final")
    assert comparable(RunDir(run).metrics()) == comparable(RunDir(tmp_path / "ref").metrics())
