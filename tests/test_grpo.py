"""GRPO through TRL on a tiny random llama (real SmolLM2 tokenizer) and a toy task defined here.

The toy task ("write a word containing the letter c") gives a tiny random model mixed rewards within a
group, so advantages are non-zero and weights really move; everything else is the real code path:
TRL's GRPOTrainer, the run directory, checkpoints with optimizer state, resume, and the probe hook.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from transformers import TrainerCallback

from evolm import config
from evolm.errors import ConfigError
from evolm.rewards import Verdict
from evolm.runs import RunDir
from evolm.tasks import register
from evolm.tasks.base import Example, Task

pytest.importorskip("trl")

from evolm import grpo  # noqa: E402
from evolm.grpo import GRPOJob  # noqa: E402
from evolm.jobs import run_grpo  # noqa: E402


@register
class LetterTask(Task):
    """Toy task: a completion is correct when it contains the asked-for letter."""

    name = "toy_letter"
    instruction = "Reply with one word."
    letters = "bcdfgkmpwy"

    def examples(self, split, count, seed=0):
        rng = random.Random(f"{split}-{seed}")
        return [Example(id=f"{split}-{i}", question=f"Write a word containing the letter {c}.", answer=c)
                for i, c in enumerate(rng.choice(self.letters) for _ in range(count or 16))]

    def extract_answer(self, completion):
        return completion.strip() or None

    def check(self, completion, example):
        answer = self.extract_answer(completion)
        return Verdict(format_ok=answer is not None, correct=answer is not None and example.answer in answer.lower(),
                       answer=answer)


def tiny_cfg(tmp_path, name="g", probe_every=1, **grpo_fields) -> GRPOJob:
    section = {"steps": 2, "num_generations": 4, "prompts_per_step": 2, "max_completion_length": 8, "lr": 1e-3,
               **grpo_fields}
    return config.from_dict(GRPOJob, {
        "run": {"out_dir": str(tmp_path), "name": name, "checkpoint_every": 1, "keep_checkpoints": 5, "progress": False},
        "task": {"name": "toy_letter"}, "grpo": section, "probe": {"every": probe_every}, "eval": {"before_after": False}})


def toy_probe(model, step):
    """A stand-in for the held-out probe: a deterministic function of the weights, plus RNG use that
    must not leak into training."""
    torch.rand(100)
    random.random()
    return {"weight_sum": float(sum(p.double().sum() for p in model.parameters())), "pass@1": 0.0}


def weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# -- config --------------------------------------------------------------------------------------------

def test_config_defaults_and_describe():
    job = GRPOJob()
    assert job.grpo.loss_type == "grpo" and job.grpo.scale_rewards == "group" and job.grpo.beta == 0.0
    assert job.run.name == "grpo-run"
    lines = "\n".join(config.describe(GRPOJob))
    for key in ("grpo.loss_type", "grpo.scale_rewards", "grpo.beta", "grpo.num_generations", "grpo.prompts_per_step",
                "grpo.temperature", "grpo.max_completion_length", "grpo.lr", "grpo.steps"):
        assert key in lines
    docs = config.field_docs(grpo.GRPOSection)
    assert all(docs.get(f) for f in grpo.GRPOSection.__dataclass_fields__), "every GRPO field has a docstring"


@pytest.mark.parametrize("override, field", [
    ("grpo.num_generations=1", "grpo.num_generations"),
    ("grpo.steps=0", "grpo.steps"),
    ("grpo.loss_type='ppo'", "grpo.loss_type"),
    ("grpo.gradient_accumulation_steps=3", "grpo.gradient_accumulation_steps"),
    ("grpo.temperature=0", "grpo.temperature"),
    ("grpo.scale_rewards='std'", "grpo.scale_rewards"),
    ("model.device='cuda:1'", "model.device"),
    ("generation.backend='vllm'", "generation.backend"),
    ("grpo.vllm_gpu_memory_utilization=1.5", "grpo.vllm_gpu_memory_utilization"),
])
def test_config_errors_name_the_field(override, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        config.from_dict(GRPOJob, {"task": {"name": "toy_letter"}}, [override])


def test_trl_args_are_explicit_and_accepted_by_trl(tmp_path):
    from trl import GRPOConfig

    cfg = tiny_cfg(tmp_path, prompts_per_step=3, num_generations=4, gradient_accumulation_steps=2, beta=0.04,
                   scale_rewards="none", loss_type="dr_grpo")
    kw = grpo.trl_args(cfg, str(tmp_path / "trl"))
    assert kw["per_device_train_batch_size"] * kw["gradient_accumulation_steps"] == 12
    assert (kw["loss_type"], kw["scale_rewards"], kw["beta"]) == ("dr_grpo", "none", 0.04)
    assert kw["use_cpu"] and not kw["bf16"] and not kw["use_vllm"]
    assert kw["report_to"] == "none" and kw["save_strategy"] == "no" and kw["logging_steps"] == 1
    args = GRPOConfig(**kw)
    assert args.generation_batch_size == 12 and args.steps_per_generation == 2 and args.max_steps == 2


def test_trl_vllm_options_pass_through(tmp_path):
    from trl import GRPOConfig

    cfg = tiny_cfg(tmp_path)
    cfg.grpo.use_vllm, cfg.grpo.vllm_mode, cfg.grpo.vllm_gpu_memory_utilization = True, "colocate", 0.25
    kw = grpo.trl_args(cfg, str(tmp_path / "trl"))
    assert (kw["use_vllm"], kw["vllm_mode"], kw["vllm_gpu_memory_utilization"]) == (True, "colocate", 0.25)
    args = GRPOConfig(**kw)
    assert args.use_vllm and args.vllm_mode == "colocate" and args.vllm_gpu_memory_utilization == 0.25


# -- data and reward -----------------------------------------------------------------------------------

def test_prompts_match_es_rendering(tokenizer):
    """TRL renders chat prompts with apply_chat_template(tokenize=True); the tokens equal the prompt ES feeds."""
    task = LetterTask()
    examples = task.examples("train", 3)
    rows = grpo.training_rows(task, examples, tokenizer)
    assert rows["example_index"] == [0, 1, 2]
    for messages, ex in zip(rows["prompt"], examples):
        trl_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                return_dict=True)["input_ids"]
        es_ids = tokenizer(task.render_prompt(ex, tokenizer), add_special_tokens=False)["input_ids"]
        assert list(trl_ids) == es_ids


def test_reward_fn_is_the_task_reward_and_meters_cost(tokenizer):
    task = LetterTask()
    examples = [Example("a", "q", "k"), Example("b", "q", "z")]
    meter = grpo.RolloutMeter()
    fn = grpo.make_reward_fn(task, examples, tokenizer, meter)
    texts = ["kite", "sun", "zoo"]
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for t in texts]
    rewards = fn(prompts=[None] * 3, completions=[None] * 3, completion_ids=ids, example_index=[0, 0, 1])
    assert rewards == [task.reward("kite", examples[0]), task.reward("sun", examples[0]), task.reward("zoo", examples[1])]
    assert rewards == pytest.approx([1.1, 0.1, 1.1])
    taken = meter.take()
    assert taken.correct == [True, False, True] and taken.tokens == [len(i) for i in ids]
    assert meter.take().rewards == []


def test_step_record_fields():
    rollouts = grpo.RolloutMeter([0.0, 1.1, 0.1, 1.1], [False, True, False, True], [3, 4, 5, 6])
    rec = grpo.step_record(7, rollouts, {"loss": 0.5, "learning_rate": 1e-5, "entropy": 2.0, "grad_norm": 0.3},
                           seconds=1.5, totals={"seconds_total": 9.0, "gen_sequences_total": 40, "gen_tokens_total": 99})
    assert rec["step"] == 7 and rec["method"] == "grpo" and rec["kind"] == "train"
    assert rec["reward_mean"] == pytest.approx(0.575) and rec["reward_min"] == 0.0 and rec["reward_max"] == 1.1
    assert rec["accuracy"] == 0.5 and rec["gen_sequences"] == 4 and rec["gen_tokens"] == 18
    assert rec["lr"] == 1e-5 and rec["loss"] == 0.5 and "kl" not in rec
    assert rec["peak_rss_mb"] > 0


# -- training ------------------------------------------------------------------------------------------

def test_two_steps_write_an_es_compatible_run_dir(tmp_path, tokenizer):
    from conftest import make_tiny_model
    from transformers import AutoModelForCausalLM

    model = make_tiny_model(tokenizer)
    before = weights(model)
    cfg = tiny_cfg(tmp_path)
    run = run_grpo(cfg, model=model, tokenizer=tokenizer, probe=toy_probe)

    assert run.info()["kind"] == "grpo" and run.info()["status"] == "finished"
    assert config.load(GRPOJob, run.config_path).grpo == cfg.grpo
    records = run.metrics()
    train = [r for r in records if r["kind"] == "train"]
    probes = [r for r in records if r["kind"] == "probe"]
    assert [r["step"] for r in train] == [1, 2]
    assert [r["step"] for r in probes] == [0, 1, 2]
    for r in train:
        assert r["method"] == "grpo"
        assert r["gen_sequences"] == 8 and 8 <= r["gen_tokens"] <= 64
        for key in ("reward_mean", "reward_std", "reward_min", "reward_max", "accuracy", "seconds", "seconds_total",
                    "peak_rss_mb", "loss", "lr", "entropy", "grad_norm", "gen_tokens_total"):
            assert isinstance(r[key], float | int), key
    assert train[1]["gen_sequences_total"] == 16
    assert train[1]["seconds_total"] == pytest.approx(train[0]["seconds"] + train[1]["seconds"])
    assert any(r["reward_std"] > 0 for r in train), "toy task should give mixed rewards"
    assert {"step", "method", "kind", "weight_sum", "pass@1", "probe_seconds"} <= set(probes[0])
    assert probes[0]["weight_sum"] != probes[-1]["weight_sum"]

    ckpts = run.checkpoints()
    assert [c.name for c in ckpts] == ["step_000001", "step_000002"]
    for f in ("model.safetensors", "config.json", "state.json", *grpo.TRAINER_FILES):
        assert (ckpts[-1] / f).exists(), f
    assert json.loads((ckpts[-1] / "state.json").read_text())["gen_sequences_total"] == 16

    final = AutoModelForCausalLM.from_pretrained(run.path / "final")
    after = weights(model)
    assert any(not torch.equal(before[k], after[k]) for k in before), "training changed the weights"
    assert all(torch.equal(final.state_dict()[k], after[k]) for k in after)
    assert not model.training and "forward" not in model.__dict__, "the caller gets a plain model back"
    assert model.config.use_cache and not model.is_activation_checkpointing


class StopAfter(TrainerCallback):
    """Simulates a kill: raises once ``step`` updates are done (after their checkpoint is written)."""

    def __init__(self, step):
        self.step = step

    def on_step_begin(self, args, state, control, **kw):
        if state.global_step == self.step:
            raise KeyboardInterrupt(f"killed after step {self.step}")


def _comparable(records):
    drop = {"seconds", "seconds_total", "peak_rss_mb", "peak_gpu_mb", "probe_seconds"}  # cost of this process
    return [{k: v for k, v in r.items() if k not in drop} for r in records]


def test_resume_is_bit_identical(tmp_path, tokenizer):
    from conftest import make_tiny_model

    cfg = tiny_cfg(tmp_path, steps=3)
    whole = make_tiny_model(tokenizer)
    run_a = run_grpo(cfg, model=whole, tokenizer=tokenizer, run_dir=tmp_path / "a", probe=toy_probe)

    killed = make_tiny_model(tokenizer)
    with pytest.raises(KeyboardInterrupt):
        run_grpo(cfg, model=killed, tokenizer=tokenizer, run_dir=tmp_path / "b", probe=toy_probe,
                 callbacks=[StopAfter(2)])
    run_b = RunDir.open(tmp_path / "b")
    assert run_b.info()["status"] == "interrupted" and run_b.info()["stopped_at_step"] == 2
    run_b.log_metrics({"step": 3, "method": "grpo", "kind": "train", "torn": True})  # a record past the checkpoint
    resumed = make_tiny_model(tokenizer)
    run_grpo(cfg, model=resumed, tokenizer=tokenizer, resume=run_b, probe=toy_probe)

    a, b = weights(whole), weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a), "resumed weights differ from the uninterrupted run"
    assert _comparable(run_a.metrics()) == _comparable(run_b.metrics())
    assert run_b.info()["resumed_from_step"] == 2 and run_b.info()["status"] == "finished"


def test_probe_does_not_change_training(tmp_path, tokenizer):
    from conftest import make_tiny_model

    with_probe, without = make_tiny_model(tokenizer), make_tiny_model(tokenizer)
    # (also covers training without gradient checkpointing)
    run_grpo(tiny_cfg(tmp_path, name="p", gradient_checkpointing=False), model=with_probe, tokenizer=tokenizer,
             probe=toy_probe)
    run = run_grpo(tiny_cfg(tmp_path, name="n", probe_every=0, gradient_checkpointing=False), model=without,
                   tokenizer=tokenizer)
    a, b = weights(with_probe), weights(without)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not [r for r in run.metrics() if r["kind"] == "probe"]


def test_init_state_dict_and_kl_reference(tmp_path, tokenizer):
    """Pipelines start GRPO from given weights; with beta > 0 the KL anchor is those weights."""
    from conftest import make_tiny_model

    start = make_tiny_model(tokenizer, seed=1).state_dict()
    model = make_tiny_model(tokenizer, seed=0)
    run = run_grpo(tiny_cfg(tmp_path, steps=1, beta=0.1, probe_every=0), model=model, tokenizer=tokenizer, init_state_dict=start)
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(run.path / "reference")
    assert all(torch.equal(ref.state_dict()[k], start[k]) for k in start)
    assert "kl" in run.metrics()[-1]


# -- command line --------------------------------------------------------------------------------------

def test_cli_help_and_errors():
    from evolm.commands import main

    with pytest.raises(SystemExit) as e:
        main(["grpo", "--help"])
    assert e.value.code == 0
    assert main(["grpo"]) == 2
    assert main(["config", "grpo"]) == 0


def test_cli_rejects_resuming_a_non_grpo_run(tmp_path, capsys):
    from evolm.commands import main

    RunDir.create(tmp_path, "es1", config.to_toml(GRPOJob()), kind="es")
    assert main(["grpo", "--resume", str(tmp_path / "es1"), "--set", "task.name='toy_letter'"]) == 2
    assert "not a GRPO run" in capsys.readouterr().err


def test_cli_trains_then_extends_the_budget_on_resume(tmp_path, tokenizer, capsys):
    """`evolm grpo --config` on a model directory, then `--resume --set grpo.steps=3` continues to step 3."""
    from conftest import make_tiny_model

    from evolm.commands import main

    make_tiny_model(tokenizer).save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    cfg_file = tmp_path / "g.toml"
    cfg_file.write_text(f"""
[run]
out_dir = "{tmp_path}"
name = "cli"
checkpoint_every = 1
progress = false
[model]
spec = "{tmp_path / 'tiny'}"
[task]
name = "toy_letter"
[grpo]
steps = 2
num_generations = 4
prompts_per_step = 2
max_completion_length = 8
lr = 1e-3
[eval]
before_after = false
""")
    assert main(["grpo", "--config", str(cfg_file)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == f"[evolm] run directory: {tmp_path / 'cli'}", "the run directory is the first line"
    assert lines[-1].startswith("no before/after table: the run has no held-out evaluation")
    out = str(tmp_path / "cli")
    assert main(["grpo", "--resume", out, "--set", "grpo.steps=3"]) == 0
    run = RunDir.open(out)
    assert [r["step"] for r in run.metrics()] == [1, 2, 3]
    assert run.info()["resumed_from_step"] == 2 and config.load(GRPOJob, run.config_path).grpo.steps == 3
    assert json.loads((run.path / "final" / "state.json").read_text())["step"] == 3
