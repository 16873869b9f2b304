"""Every config file evolm ships (configs/, experiments/study/, experiments/refnum/, the packaged demo) loads, validates and
uses current names only: a user copying one never starts from a refused or deprecated setting."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from evolm import config
from evolm.grpo import GRPOJob
from evolm.pipeline import PipelineJob
from evolm.rewards import DEPRECATED

ROOT = Path(__file__).resolve().parents[1]
FILES = sorted([*ROOT.glob("configs/*.toml"), *ROOT.glob("experiments/study/*.toml"), *ROOT.glob("experiments/refnum/*.toml"), *ROOT.glob("src/evolm/configs/*.toml")])


STUDY_FILES = ("claims.toml", "revisions.toml")
"""The study's declarations and their dated revisions (read by ``evolm report --study``), not run configs."""


def _job_class(path: Path, data: dict):
    if "pipeline" in data:
        return PipelineJob
    return GRPOJob if "grpo" in data else config.ESJob


@pytest.mark.parametrize("path", [f for f in FILES if f.name not in STUDY_FILES], ids=lambda p: str(p.relative_to(ROOT)))
def test_shipped_config_loads_validates_and_uses_current_names(path):
    data = tomllib.loads(path.read_text())
    cfg = config.load(_job_class(path, data), path)
    config.validate(cfg)
    # --config FILE looks relative paths up beside the file first: none of a shipped config's is there, so it
    # means what it always meant (repo-relative data files, built-in names, hub ids)
    assert config.to_dict(config.load(_job_class(path, data), path, paths_from_file=True)) == config.to_dict(cfg)
    for section in ("task", "eval", "probe"):
        reward = data.get(section, {}).get("reward")
        assert reward not in DEPRECATED, f"{path}: {section}.reward = '{reward}' is deprecated"


def test_there_are_shipped_configs():
    assert len(FILES) >= 8
