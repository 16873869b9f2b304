"""examples/ runs as a user runs it, on the embedded model at a tiny budget (what docs/custom-tasks.md shows)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.ci]


def _run(args, tmp_path) -> str:
    out = subprocess.run([sys.executable, *map(str, args)], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


@pytest.mark.parametrize("method", ["es", "grpo"])
def test_own_reward_from_python(method, tmp_path):
    stdout = _run([REPO / "examples" / "own_reward.py", "--tiny", "--method", method, "--out", tmp_path / "own"], tmp_path)
    run = tmp_path / f"own-{method}"
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "finished" and "held-out after" in stdout
    assert info["plugins"]["rewards"][0]["ref"].endswith("examples/own_reward.py:ends_with_answer")


def test_own_data_and_rewards_from_the_command_line(tmp_path):
    sets = [f"run.out_dir='{tmp_path}'", "run.name='cli'", "es.iterations=2", "es.population=2",
            "es.prompts_per_iteration=2", "generation.max_new_tokens=8", "eval.count=4", "eval.n_samples=2", "eval.k=[1, 2]",
            "run.progress=false"]
    _run(["-m", "evolm", "es", "--config", "examples/dataset_task.toml", *[a for s in sets for a in ("--set", s)]], tmp_path)
    info = json.loads((tmp_path / "cli" / "run.json").read_text())
    assert info["status"] == "finished" and len(info["plugins"]["rewards"]) == 2
    after = json.loads((tmp_path / "cli" / "eval_after.json").read_text())
    assert after["task"] == "dataset" and len(after["problems"]) == 4


def test_ask_tell_in_your_own_loop(tmp_path):
    stdout = _run([REPO / "examples" / "ask_tell.py", "--tiny"], tmp_path)
    assert "update 2:" in stdout and "seed log: 3 records" in stdout
