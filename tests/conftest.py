"""Shared fixtures: the real tokenizer of the default model and tiny randomly initialised llama models.

Fast tests never load the 135M model: they build a 2-layer llama in code (seconds) and borrow only
the tokenizer of the cached default model (converted from the embedded GGUF once per machine).

``make test`` runs the suite on two pytest-xdist workers (``-n 2 --dist loadfile``): one worker runs a
whole test file, in its own order, so module fixtures are built once (see ``LONG_FILES``).
"""

from __future__ import annotations

import contextlib
import copy
import os

# Every test process (each pytest-xdist worker, and the CLI subprocesses tests start, which inherit it) uses
# one core: the "auto" defaults (model.threads, distributed.workers) read it as the usable cores
# (evolm.machine.usable_cores), so a default config runs one thread in one process and never starts Ray.
# Tests of the resolution itself set the cores they need (tests/test_auto.py).
os.environ["OMP_NUM_THREADS"] = "1"
# Likewise model.dtype = "auto" means bfloat16 for ES on a CPU with AMX (evolm.machine.cpu_bf16_native):
# the suite reads every CPU as one without, so a default config is float32 on every CI machine.
os.environ["EVOLM_CPU_BF16"] = "0"

import pytest  # noqa: E402
import torch  # noqa: E402

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(1)


# -- two pytest-xdist workers (make test) ---------------------------------------------------------------
# Each test file runs on one worker, start to end in its own order (--dist loadfile). The workers take the
# files in collection order, so the files that take minutes are put first: the short ones then fill in
# at the end instead of one long file running alone. A scheduling hint only; a file not listed keeps
# its place after these.
LONG_FILES = ("test_ray_population.py", "test_ray_cluster.py", "test_custom_tasks.py", "test_examples.py", "test_lowrank.py",
              "test_embedded_real.py", "test_real_model.py", "test_trainer.py", "test_study.py", "test_pipeline.py",
              "test_es.py", "test_faults.py", "test_reliability.py", "test_trackers.py", "test_validity.py",
              "test_report.py", "test_sweep.py")
# The code sandbox sizes a program's process budget (RLIMIT_NPROC) from the tasks uid nobody has
# machine-wide when it starts, so a fork bomb in one worker could starve a program started in the
# other: the tests of these files take a lock shared by the workers, one test at a time.
SANDBOX_FILES = ("test_sandbox.py", "test_code_tasks.py")


def pytest_collection_modifyitems(config, items):
    if hasattr(config, "workerinput"):  # an xdist worker; every worker reorders alike
        rank = {name: i for i, name in enumerate(LONG_FILES)}
        items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: file order kept otherwise


@pytest.fixture(autouse=True)
def _one_sandbox_test_at_a_time(request):
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None or request.node.path.name not in SANDBOX_FILES:
        yield
        return
    import fcntl
    import tempfile

    with open(os.path.join(tempfile.gettempdir(), f"evolm-tests-{run}-sandbox.lock"), "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        yield


class Kill(Exception):
    """What ``kill_at`` raises: a run stopped from a callback, as a kill between two updates would."""


def kill_at(step: int):
    """An ES callback (``cb(step, record)``) that raises ``Kill`` once update ``step`` is logged."""

    def callback(at, record):
        if at == step:
            raise Kill

    return callback


@contextlib.contextmanager
def cache_lock():
    """Exclusive use of the evolm cache while converting (on a fresh machine both xdist workers would
    otherwise dequantise the embedded GGUF at once; the conversion itself is atomic either way)."""
    import fcntl

    from evolm.resources import cache_dir

    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".tests.lock", "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def tokenizer():
    from transformers import AutoTokenizer

    from evolm import models

    with cache_lock():
        path = models.local_dir(models.DEFAULT_MODEL)
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


_TINY_MODELS: dict[tuple, tuple] = {}


def make_tiny_model(tokenizer, seed: int = 0, hidden: int = 64, layers: int = 2):
    """A randomly initialised llama with the real tokenizer's vocabulary (about 3.3M parameters).

    The suite asks for a few hundred of these; each distinct one is built once per process and then
    handed out as a deep copy, with the global torch RNG left in the state the build leaves it in:
    a caller gets exactly what a fresh build would give it (weights, config, RNG state), in ~10 ms."""
    from transformers import LlamaConfig, LlamaForCausalLM

    key = (len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id, seed, hidden, layers)
    if key not in _TINY_MODELS:
        torch.manual_seed(seed)
        cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                          num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                          max_position_embeddings=512, tie_word_embeddings=True,
                          bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                          pad_token_id=tokenizer.pad_token_id)
        model = LlamaForCausalLM(cfg).eval()
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        _TINY_MODELS[key] = (model, torch.get_rng_state())
    model, rng_state = _TINY_MODELS[key]
    torch.set_rng_state(rng_state)
    return copy.deepcopy(model)


def tiny_es_cfg(tmp_path, *, population: int = 8, prompts: int = 8, iterations: int = 15, max_new_tokens: int = 8,
                model_dtype: str | None = None, **es):
    """The ES job the loop tests run on a tiny model: run dir ``tmp_path/run``, no progress bar, no checkpoints,
    no held-out evaluation, table noise, sigma 0.02 and lr 0.01 (a random 2-layer model learns the vowel task in a few
    updates); ``es.*`` fields as keywords, ``model_dtype`` for a bf16 model."""
    from evolm import config

    cfg = config.ESJob()
    cfg.run.out_dir, cfg.run.name, cfg.run.progress, cfg.run.checkpoint_every = str(tmp_path), "run", False, 0
    cfg.eval.before_after = False
    cfg.generation.max_new_tokens = max_new_tokens
    cfg.es.population, cfg.es.prompts_per_iteration, cfg.es.iterations = population, prompts, iterations
    cfg.es.sigma, cfg.es.lr = 0.02, 0.01
    cfg.es.noise = "table"  # what these loop tests were calibrated on (es.noise's default became "auto": counter)
    if model_dtype:
        cfg.model.dtype = model_dtype
    for k, v in es.items():
        setattr(cfg.es, k, v)
    return cfg


def run_tiny_es(cfg, tokenizer, task, model=None, *, batch_size: int = 16, **kw):
    """``run_es`` of ``cfg`` on ``model`` (a fresh ``make_tiny_model`` in ``cfg.model.dtype`` when None) through
    the HF generator, quietly; returns (run directory, the trained model). ``kw``: run_es's (resume, callbacks)."""
    from evolm.backends.hf import HFGenerator
    from evolm.jobs import run_es

    if model is None:
        model = make_tiny_model(tokenizer)
        if cfg.model.dtype == "bfloat16":
            model = model.to(torch.bfloat16)
    return run_es(cfg, model=model, tokenizer=tokenizer, task=task, generator=HFGenerator(model, tokenizer, batch_size),
                  quiet=True, **kw), model


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory, tokenizer):
    """A tiny random llama (``make_tiny_model``) saved with the real tokenizer as a model directory: the spec
    CLI runs, Ray actors and the Python API load. Read-only: tests that change weights write elsewhere."""
    path = tmp_path_factory.mktemp("tiny") / "model"
    make_tiny_model(tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def tiny_model(tokenizer):
    return make_tiny_model(tokenizer)


def make_vowel_task(threshold: float = 0.5):
    """A toy verifiable task for tiny random models: reward = share of vowels among the completion's
    non-space characters. A random 2-layer model starts near 0.1 and ES raises it within seconds.
    A completion is correct when the share is at least ``threshold``: a random model never reaches
    the default 0.5; 1/3 (task name "vowels-third") gives success probabilities between 0 and 1."""
    from evolm.rewards import Verdict
    from evolm.tasks.base import Example, Task

    class Vowels(Task):
        name = "vowels" if threshold == 0.5 else "vowels-third" if threshold == 1 / 3 else f"vowels-{threshold:g}"
        instruction = ""

        def examples(self, split, count, seed=0):
            import random

            rng = random.Random(f"{split}-{seed}")
            return [Example(f"{split}-{seed}-{i}", f"Write {rng.randint(0, 99)}", None) for i in range(count or 8)]

        def extract_answer(self, completion):
            return completion

        def check(self, completion, example):
            s = completion.replace(" ", "")
            share = sum(ch in "aeiou" for ch in s) / max(1, len(s))
            return Verdict(format_ok=bool(s), correct=share >= threshold, answer=completion)

        def reward(self, completion, example):
            s = completion.replace(" ", "")
            return sum(ch in "aeiou" for ch in s) / max(1, len(s))

    return Vowels()


@pytest.fixture
def vowel_task():
    return make_vowel_task()
