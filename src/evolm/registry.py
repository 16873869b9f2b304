"""The job kinds evolm runs: name -> config class and runner. The CLI, sweeps and ``evolm config``
look jobs up here, so a new kind of job is one entry.

A runner is ``run(cfg, resume=None, **options) -> RunDir``; every runner accepts ``eval_before`` (a
before-evaluation report measured elsewhere on the same starting weights, which sweeps share).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from evolm.config import ESJob
from evolm.errors import UserError
from evolm.grpo import GRPOJob
from evolm.jobs import ES_RESUME, GRPO_RESUME, Resumable, run_es, run_grpo
from evolm.pipeline import RESUME as PIPELINE_RESUME
from evolm.pipeline import PipelineJob, run_pipeline


@dataclass(frozen=True)
class JobKind:
    name: str
    config_class: type
    run: Callable
    """``run(cfg, resume=None, **options) -> RunDir``."""
    resume: Resumable
    """What a resume of this kind may change (its budget field, ``jobs.resume_point``)."""


JOBS: dict[str, JobKind] = {
    "es": JobKind("es", ESJob, run_es, ES_RESUME),
    "grpo": JobKind("grpo", GRPOJob, run_grpo, GRPO_RESUME),
    "pipeline": JobKind("pipeline", PipelineJob, run_pipeline, PIPELINE_RESUME),
}


def job_kind(name: str) -> JobKind:
    """The job kind called ``name``; a one-line error listing the kinds otherwise."""
    if name not in JOBS:
        raise UserError(f"unknown job kind '{name}'; choose one of {', '.join(JOBS)}")
    return JOBS[name]
