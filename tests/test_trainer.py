"""The Python API: ESTrainer / GRPOTrainer in TRL's shape write the CLI's run directory, and AskTell is the
engine's ES for a user's own loop (its seed log replays with the engine's replay)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from evolm import AskTell, ESConfig, ESTrainer, GRPOConfig, GRPOTrainer
from evolm.errors import UserError

REPO = Path(__file__).resolve().parents[1]

REWARD_PY = '''
def vowels(prompts, completions, answer, **columns):
    out = []
    for c in completions:
        letters = [ch for ch in c.lower() if ch.isalpha()]
        out.append(sum(ch in "aeiou" for ch in letters) / len(letters) if letters else 0.0)
    return out
'''

ROWS = [{"prompt": f"Write a word like 'aqua' #{i}.", "answer": "aqua"} for i in range(24)]


@pytest.fixture(scope="module")
def reward_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("user") / "user_reward.py"
    path.write_text(REWARD_PY)
    return path


def _weights(directory: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(directory / "model.safetensors"))


def _changed(a: dict, b: dict) -> bool:
    return any(not torch.equal(a[k], b[k]) for k in a if k in b)


SMALL = dict(iterations=2, population=4, prompts_per_iteration=4, max_new_tokens=6, sigma=0.02, learning_rate=0.01,
             temperature=1.0, before_after=False, progress=False, overrides=["run.checkpoint_every=0", "probe.every=0"])


@pytest.mark.slow  # `make test-all`; the tiny-model twin runs in `make test`
def test_es_trainer_on_the_embedded_model_equals_the_cli_run(reward_file, tmp_path):
    """The done-when of the API: same settings from Python and from the CLI -> the same weights, seed log and
    fitnesses; the run directory is read by evolm report and evolm replay."""
    from evolm.tasks.base import Example  # noqa: F401  (the public names import)

    small = dict(SMALL, iterations=2, population=3, prompts_per_iteration=2, max_new_tokens=6, sigma=5e-3,
                 learning_rate=5e-4, temperature=0.0)
    trainer = ESTrainer(model="smollm2-135m", reward_funcs=[f"{reward_file}:vowels"],
                        args=ESConfig(output_dir=str(tmp_path / "runs" / "api"), **small), train_dataset=ROWS)
    out = trainer.train()
    assert out.run_dir == tmp_path / "runs" / "api" and out.steps == 2

    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    sets = ["run.name='cli'", f"run.out_dir='{tmp_path / 'runs'}'", "task.name='dataset'",
            f"task.params={{ train = '{rows}' }}", f"task.reward=['{reward_file}:vowels']", "es.iterations=2",
            "es.population=3", "es.prompts_per_iteration=2", "generation.max_new_tokens=6", "es.sigma=0.005", "eval.before_after=false",
            "run.progress=false", "run.checkpoint_every=0", "probe.every=0", "task.params.prompt='prompt'"]
    cli = subprocess.run([sys.executable, "-m", "evolm", "es", "--config", str(REPO / "configs" / "es-arithmetic.toml"),
                          *[a for s in sets for a in ("--set", s)]], capture_output=True, text=True, timeout=900)
    assert cli.returncode == 0, cli.stderr[-2000:]
    api_dir, cli_dir = out.run_dir, tmp_path / "runs" / "cli"
    api, cli_w = _weights(api_dir / "final"), _weights(cli_dir / "final")
    assert all(torch.equal(api[k], cli_w[k]) for k in api)
    logs = {d: [json.loads(x) for x in (d / "seed_log.jsonl").read_text().splitlines()][1:] for d in (api_dir, cli_dir)}
    assert [r["fitness"] for r in logs[api_dir]] == [r["fitness"] for r in logs[cli_dir]]
    assert any(r["status"] == "applied" for r in logs[api_dir])  # training changed the weights

    rep = subprocess.run([sys.executable, "-m", "evolm", "report", str(api_dir), "--out", str(tmp_path / "report")],
                         capture_output=True, text=True, timeout=600)
    assert rep.returncode == 0, rep.stderr[-2000:]
    assert (tmp_path / "report" / "report.md").exists()
    replay = subprocess.run([sys.executable, "-m", "evolm", "replay", str(api_dir), "--step", "2", "--out",
                             str(tmp_path / "replayed")], capture_output=True, text=True, timeout=600)
    assert replay.returncode == 0, replay.stderr[-2000:]
    replayed = _weights(tmp_path / "replayed")
    assert all(torch.equal(replayed[k], api[k]) for k in api)


def test_a_loaded_model_trains_resumes_and_switching_to_grpo_is_one_line(tiny_dir, reward_file, tmp_path, tokenizer):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    args = ESConfig(output_dir=str(tmp_path / "es"), **SMALL)
    out = ESTrainer(model, [f"{reward_file}:vowels"], args, train_dataset=ROWS, processing_class=tokenizer).train()
    base = _weights(next((tmp_path / ".models").iterdir()))
    first = _weights(out.run_dir / "final")
    assert _changed(first, base)
    seeds = [json.loads(x) for x in (out.run_dir / "seed_log.jsonl").read_text().splitlines()]
    assert any(r.get("status") == "applied" for r in seeds)

    longer = ESConfig(output_dir=str(tmp_path / "es"), **dict(SMALL, iterations=3))
    resumed = ESTrainer(model, [f"{reward_file}:vowels"], longer, train_dataset=ROWS, processing_class=tokenizer).train(resume=True)
    assert resumed.steps == 3 and _changed(_weights(out.run_dir / "final"), first)

    grpo = GRPOTrainer(str(tiny_dir), [f"{reward_file}:vowels"],
                       GRPOConfig(output_dir=str(tmp_path / "grpo"), max_steps=1, num_generations=4, prompts_per_step=2,
                                  learning_rate=1e-3, max_new_tokens=6, before_after=False, progress=False,
                                  overrides=["run.checkpoint_every=0", "probe.every=0"]),
                       train_dataset=ROWS).train()
    assert _changed(_weights(grpo.run_dir / "final"), _weights(tiny_dir))


def test_a_reward_no_other_process_can_find_is_refused_in_one_line(tmp_path):
    with pytest.raises(UserError, match="lambda or defined inside a function; define it at module level"):
        ESTrainer("smollm2-135m", [lambda prompts, completions, **kw: [0.0] * len(completions)],
                  ESConfig(output_dir=str(tmp_path / "x")), train_dataset=ROWS)
    with pytest.raises(UserError, match="takes args=ESConfig"):
        ESTrainer("smollm2-135m", None, GRPOConfig(output_dir=str(tmp_path / "y")), train_dataset=ROWS)


def test_ask_tell_is_the_engines_es(tiny_model, tokenizer):
    """Members perturb and restore bit for bit; the seed log replays with the engine's replay."""
    from conftest import make_tiny_model

    from evolm.es.engine import replay

    before = {k: v.clone() for k, v in tiny_model.state_dict().items()}
    es = AskTell(tiny_model, population=4, sigma=0.02, lr=0.01, seed=3)
    for _ in range(2):
        fitness = []
        for member in es.ask():
            with member:
                w = tiny_model.model.norm.weight
                fitness.append(float(w.detach().sum()))  # any score of the perturbed model
                assert not torch.equal(w, before["model.norm.weight"])
            assert torch.equal(tiny_model.model.norm.weight, es.float32_model().model.norm.weight)
        update = es.tell(fitness)
        assert update.status == "applied"
    after = tiny_model.state_dict()
    assert _changed(after, before)
    fresh = make_tiny_model(tokenizer)
    rebuilt = replay(fresh, es.seed_log, es.job)
    assert rebuilt is not None
    assert all(torch.equal(fresh.state_dict()[k], after[k]) for k in after)
    with pytest.raises(UserError, match="one fitness per member"):
        es.ask()
        es.tell([1.0])


UNGUARDED_SCRIPT = '''
from evolm import ESConfig, ESTrainer


def reward(prompts, completions, **columns):
    return [float(len(c) % 3) for c in completions]


# no `if __name__ == "__main__":`: replay imports this file again to find `reward`
ESTrainer(model={model!r}, reward_funcs=[reward],
          args=ESConfig(output_dir={out!r}, iterations=1, population=2, prompts_per_iteration=2, max_new_tokens=4,
                        before_after=False, progress=False, workers=0, threads=1,
                        overrides=["run.checkpoint_every=0", "probe.every=0"]),
          train_dataset={rows!r}).train()
print("trained")
'''


def test_a_script_that_trains_when_imported_is_refused_in_one_line_by_replay(tiny_dir, tmp_path):
    """issue 44.2: replay imported the unguarded script to find its reward, which trained again, recursively
    (71 nested runs, a RecursionError). Now: one line naming the fix, exit 2."""
    import os

    script = tmp_path / "train_mine.py"
    run = tmp_path / "runs" / "mine"
    script.write_text(UNGUARDED_SCRIPT.format(model=str(tiny_dir), out=str(run), rows=ROWS[:6]))
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    first = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, env=env,
                           cwd=tmp_path)
    assert first.returncode == 0 and "trained" in first.stdout, first.stderr[-2000:]
    info = json.loads((run / "run.json").read_text())
    assert len(info["plugins"]["rewards"][0]["sha256"]) == 64  # issue 44.5: a __main__ script's reward is hashed
    replay = subprocess.run([sys.executable, "-m", "evolm", "replay", str(run), "--out", str(tmp_path / "r")],
                            capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert replay.returncode == 2, (replay.stdout[-1000:], replay.stderr[-3000:])
    lines = [x for x in replay.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and 'put the training call under if __name__ == "__main__":' in lines[0], lines[:5]
    assert "train_mine.py" in lines[0] and "trained" not in replay.stdout


def test_trl_field_names_in_the_configs_are_aliases_or_one_line(tmp_path):
    """issue 44.4: GRPOConfig(max_completion_length=...) / (per_device_train_batch_size=...) were raw TypeErrors."""
    assert GRPOConfig(max_completion_length=12).max_new_tokens == 12  # TRL's name for the same knob
    assert ESConfig(max_completion_length=12).max_new_tokens == 12
    with pytest.raises(UserError, match=r"per_device_train_batch_size is TRL's.*set prompts_per_step"):
        GRPOConfig(per_device_train_batch_size=8)
    with pytest.raises(UserError, match=r"both max_completion_length .* and max_new_tokens"):
        GRPOConfig(max_completion_length=12, max_new_tokens=8)
    with pytest.raises(UserError, match=r"GRPOConfig has no field 'num_iteration' \(did you mean 'max_steps'|num_generations"):
        GRPOConfig(num_iteration=3)


def test_an_es_config_given_to_grpo_is_one_line():
    from evolm import config
    from evolm.grpo import GRPOJob

    with pytest.raises(UserError, match=r"\[es\] is a section of an ES config \(evolm es\); evolm grpo reads \[grpo\]"):
        config.load(GRPOJob, REPO / "configs" / "es-arithmetic.toml")
    with pytest.raises(UserError, match=r"\[grpo\] is a section of a GRPO config \(evolm grpo\); evolm es reads \[es\]"):
        config.load(config.ESJob, REPO / "configs" / "grpo-arithmetic.toml")


def test_a_model_saved_under_dot_models_is_readable_by_others(tiny_model, tokenizer, tmp_path):
    """issue 44.5: runs/.models/ files were created 0600 (safetensors, mkdtemp); now the umask's usual modes."""
    import stat

    from evolm.runs import _UMASK
    from evolm.trainer import save_model

    path = save_model(tiny_model, tokenizer, tmp_path)
    files = [p for p in path.rglob("*") if p.is_file()]
    assert files and {stat.S_IMODE(p.stat().st_mode) for p in files} == {0o666 & ~_UMASK}
    assert stat.S_IMODE(path.stat().st_mode) == 0o777 & ~_UMASK
