"""``evolm export``: a finished run as a hub-ready model folder (evolm.export), ``model.revision`` and
``model.trust_remote_code`` reaching ``from_pretrained``, and the exported folder in lm-eval-harness.

The runs are tiny ES runs of a 2-layer random llama saved as a model directory (its ``model.spec``), so
``evolm replay`` can rebuild them from their seed logs; each takes a few seconds.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import yaml
from conftest import make_tiny_model, make_vowel_task
from safetensors import safe_open
from safetensors.torch import load_file

from evolm import config, export, models
from evolm.commands import main
from evolm.runs import RunDir


def _tiny_run(root, spec, name: str, save: str = "all"):
    from evolm.jobs import run_es

    cfg = config.ESJob()
    cfg.run.out_dir, cfg.run.name, cfg.run.progress, cfg.run.checkpoint_every = str(root), name, False, 0
    cfg.run.save = save
    cfg.model.spec = str(spec)
    cfg.eval.count, cfg.eval.n_samples, cfg.eval.k = 4, 2, [1, 2]
    cfg.generation.max_new_tokens = 8
    cfg.es.population, cfg.es.prompts_per_iteration, cfg.es.iterations = 4, 4, 2
    cfg.es.sigma, cfg.es.lr = 0.02, 0.01
    return run_es(cfg, task=make_vowel_task(), quiet=True)


@pytest.fixture(scope="module")
def spec(tmp_path_factory, tokenizer):
    path = tmp_path_factory.mktemp("spec") / "tiny"
    make_tiny_model(tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def es_run(tmp_path_factory, spec) -> RunDir:
    """A finished tiny ES run with final/ and before/after evaluations."""
    return _tiny_run(tmp_path_factory.mktemp("runs"), spec, "es")


def _weights(directory) -> dict:
    out = {}
    for f in sorted(directory.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _front_matter(readme: str) -> dict:
    assert readme.startswith("---\n")
    return yaml.safe_load(readme[4:readme.index("\n---", 4)])


def test_export_writes_a_hub_ready_folder_that_loads(tmp_path, es_run, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "export"
    assert main(["export", str(es_run.path), "--to", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    names = {p.name for p in out.iterdir()}
    assert {"README.md", "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json", "evolm_run"} <= names
    assert "state.json" not in names  # evolm's bookkeeping stays in the run directory
    final = _weights(es_run.path / "final")
    exported = _weights(out)
    assert exported.keys() == final.keys() and all(torch.equal(exported[k], final[k]) for k in final)
    assert (out / "model.safetensors").read_bytes() == (es_run.path / "final" / "model.safetensors").read_bytes()
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    AutoTokenizer.from_pretrained(out)
    state = model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in final.items())

    run_files = out / "evolm_run"
    assert (run_files / "seed_log.jsonl").read_text() == es_run.seed_log_path.read_text()
    assert (run_files / "config.toml").read_text() == es_run.config_path.read_text()
    info = json.loads((run_files / "run.json").read_text())
    assert info["base"] == es_run.info()["base"] and not {"host", "pid", "pid_start"} & set(info)

    card = (out / "README.md").read_text()
    meta = _front_matter(card)
    assert meta["library_name"] == "transformers" and meta["tags"] == ["evolm", "evolution-strategies"]
    assert "base_model" not in meta  # a local directory without a card of its own names no hub model
    assert es_run.info()["base"]["fingerprint"] in card and str(es_run.config()["model"]["spec"]) in card
    assert "```toml\n" + es_run.config_path.read_text() in card
    summary_after = es_run.evaluation("after")["summary"]
    assert "| metric | before | after | change |" in card and "| pass@2 |" in card and "| token entropy (nats) |" in card
    assert f"| {summary_after['problems']}" not in card  # problems are stated in the text, not as a row
    totals = es_run.info()
    assert f"| 2 | {totals['gen_sequences_total']} | {totals['gen_tokens_total']} |" in card
    assert "Evolution Strategies at Scale: LLM Fine-Tuning Beyond Reinforcement Learning" in card
    assert "Understanding Evolution Strategies for LLM Reasoning" in card
    assert "evolm_run/seed_log.jsonl" in card and "evolm replay evolm_run" in card


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_lower_precision_export_is_the_float32_weights_rounded(tmp_path, es_run, dtype):
    from transformers import AutoModelForCausalLM

    out = tmp_path / dtype
    assert main(["export", str(es_run.path), "--to", str(out), "--dtype", dtype]) == 0
    target = getattr(torch, dtype)
    final = _weights(es_run.path / "final")
    assert all(t.dtype == torch.float32 for t in final.values())
    exported = _weights(out)
    assert exported.keys() == final.keys()
    for name, t in final.items():
        assert exported[name].dtype == target and torch.equal(exported[name], t.to(target)), name
    assert json.loads((out / "config.json").read_text())["dtype"] == dtype
    model = AutoModelForCausalLM.from_pretrained(out, dtype="auto")  # loads as stored
    assert {p.dtype for p in model.parameters()} == {target}
    state = model.state_dict()
    assert all(torch.equal(state[k], t.to(target)) for k, t in final.items())
    assert f"safetensors, {dtype}" in (out / "README.md").read_text()


def test_an_es_run_saved_without_weights_is_rebuilt_from_its_seed_log(tmp_path, es_run, spec):
    from evolm.jobs import replay_run

    bare = _tiny_run(tmp_path, spec, "bare", save="none")  # the same run, no weights saved
    assert not (bare.path / "final").exists() and bare.state() == "finished"
    assert "applied" in [r.get("status") for r in bare.seed_log()]  # the toy task moves the weights
    out = tmp_path / "export"
    assert main(["export", str(bare.path), "--to", str(out)]) == 0
    final = _weights(es_run.path / "final")
    exported = _weights(out)
    assert all(torch.equal(exported[k], final[k]) for k in final)  # bit-identical to the run that saved final/
    assert not all(torch.equal(exported[k], v) for k, v in _weights(spec).items())  # and not the base: ES moved it
    assert not any(p.name.startswith(".") for p in out.rglob("*"))  # the rebuild's staging files are gone
    assert not (bare.path / "replay").exists()  # nothing written into the run directory

    # the export's evolm_run/ is itself a run directory the seed log rebuilds the weights from
    rebuilt = replay_run(out / "evolm_run", None, tmp_path / "rebuilt", say=lambda *a: None)
    again = _weights(rebuilt)
    assert all(torch.equal(again[k], exported[k]) for k in exported)


def _one_line_error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("evolm: error: ") and "\n" not in err and "Traceback" not in err
    return err


def test_bad_input_is_one_line_and_nothing_is_overwritten(tmp_path, es_run, spec, capsys):
    assert "not an evolm run directory" in _one_line_error(capsys, ["export", str(spec), "--to", str(tmp_path / "a")])

    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("mine")
    assert "not empty" in _one_line_error(capsys, ["export", str(es_run.path), "--to", str(busy)])
    assert [p.name for p in busy.iterdir()] == ["keep.txt"] and (busy / "keep.txt").read_text() == "mine"
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert "not empty" in _one_line_error(capsys, ["export", str(es_run.path), "--to", str(a_file)])

    running = tmp_path / "running"
    shutil.copytree(es_run.path, running)
    RunDir(running).update_info(status="running")
    assert "has not finished" in _one_line_error(capsys, ["export", str(running), "--to", str(tmp_path / "b")])

    grpo = tmp_path / "grpo-none"  # a GRPO run saved without weights: nothing can rebuild them
    shutil.copytree(es_run.path, grpo)
    shutil.rmtree(grpo / "final")
    RunDir(grpo).update_info(kind="grpo", weights="none")
    assert "only an ES run's weights can be rebuilt" in _one_line_error(capsys, ["export", str(grpo), "--to",
                                                                                 str(tmp_path / "c")])
    gone = tmp_path / "no-final"  # says it saved weights, but final/ is missing
    shutil.copytree(es_run.path, gone)
    shutil.rmtree(gone / "final")
    RunDir(gone).update_info(weights="all", status="finished")
    assert "not finished" in _one_line_error(capsys, ["export", str(gone), "--to", str(tmp_path / "d")])
    assert "--private applies to --push-to-hub" in _one_line_error(capsys, ["export", str(es_run.path), "--to",
                                                                            str(tmp_path / "e"), "--private"])
    for name in "abcde":
        assert not (tmp_path / name).exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging directory left behind


def test_an_empty_target_directory_is_used(tmp_path, es_run):
    out = tmp_path / "empty"
    out.mkdir()
    assert main(["export", str(es_run.path), "--to", str(out)]) == 0
    assert (out / "model.safetensors").exists()


def test_push_to_hub_offline_is_one_line_before_anything_is_written(tmp_path, es_run, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    err = _one_line_error(capsys, ["export", str(es_run.path), "--to", str(tmp_path / "x"), "--push-to-hub", "me/tiny"])
    assert "cannot reach the hub" in err
    assert not (tmp_path / "x").exists()


def test_push_to_hub_creates_the_repository_and_uploads_the_folder(tmp_path, es_run, capsys, monkeypatch):
    import huggingface_hub

    calls = []

    class FakeApi:
        def create_repo(self, repo_id, **kw):
            calls.append(("create_repo", repo_id, kw))

        def upload_folder(self, **kw):
            calls.append(("upload_folder", kw["repo_id"], kw))
            assert (tmp_path / "x" / "README.md").exists()  # uploaded after the folder is complete

    monkeypatch.setattr(models, "hub_reachable", lambda *a, **k: True)
    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    assert main(["export", str(es_run.path), "--to", str(tmp_path / "x"), "--push-to-hub", "me/tiny-es", "--private"]) == 0
    assert "pushed to https://huggingface.co/me/tiny-es" in capsys.readouterr().out
    (create, _, kw), (upload, repo, up) = calls
    assert create == "create_repo" and kw["private"] is True and kw["exist_ok"] is True and kw["repo_type"] == "model"
    assert upload == "upload_folder" and repo == "me/tiny-es" and up["folder_path"] == str(tmp_path / "x")
    assert "\n# tiny-es\n" in (tmp_path / "x" / "README.md").read_text()  # titled by the repository

    class Refusing(FakeApi):
        def create_repo(self, repo_id, **kw):
            raise RuntimeError("401 Client Error: Unauthorized\nmore lines")

    monkeypatch.setattr(huggingface_hub, "HfApi", Refusing)
    err = _one_line_error(capsys, ["export", str(es_run.path), "--to", str(tmp_path / "y"), "--push-to-hub", "me/z"])
    assert "the hub refused the push" in err and "401" in err and (tmp_path / "y" / "README.md").exists()


# -- the card's pure pieces --------------------------------------------------------------------------

def test_hub_base_names_embedded_models_hub_ids_and_runs_they_started_from(tmp_path, es_run, spec):
    assert export.hub_base("smollm2-135m") == ("HuggingFaceTB/SmolLM2-135M-Instruct", "apache-2.0")
    assert export.hub_base("gemma3-270m") == ("google/gemma-3-270m", "gemma")
    assert export.hub_base("some-org/some-model") == ("some-org/some-model", None)
    assert export.hub_base(str(spec)) == (None, None)
    carded = tmp_path / "carded"
    carded.mkdir()
    (carded / "config.json").write_text("{}")
    (carded / "README.md").write_text("---\nbase_model: org/base\nlicense: mit\n---\n# a model\n")
    assert export.hub_base(str(carded)) == ("org/base", "mit")
    chained = tmp_path / "chained"  # a run whose model.spec is an embedded model, as a later run's spec
    shutil.copytree(es_run.path, chained)
    toml = (chained / "config.toml").read_text().replace(f'spec = "{spec}"', 'spec = "smollm2-135m"')
    (chained / "config.toml").write_text(toml)
    assert export.hub_base(str(chained)) == ("HuggingFaceTB/SmolLM2-135M-Instruct", "apache-2.0")


def _facts(es_run, **changes):
    facts = export.card_facts(es_run)
    for k, v in changes.items():
        setattr(facts, k, v)
    return facts


def test_card_tags_and_method_follow_the_run_kind(es_run):
    grpo = _facts(es_run, method="grpo", methods=["grpo"],
                  config={**es_run.config(), "grpo": {"lr": 1e-5, "beta": 0.0, "num_generations": 8, "prompts_per_step": 4}})
    card = export.render_card(grpo, base_model="HuggingFaceTB/SmolLM2-135M-Instruct", license="apache-2.0",
                              dtype="float32", files=["model.safetensors"])
    meta = _front_matter(card)
    assert meta == {"base_model": "HuggingFaceTB/SmolLM2-135M-Instruct", "library_name": "transformers",
                    "license": "apache-2.0", "pipeline_tag": "text-generation", "tags": ["evolm", "grpo"]}
    assert "GRPO runs have no seed log" in card and "**GRPO** (TRL's `GRPOTrainer`)" in card
    pipe = _facts(es_run, method="pipeline", methods=["grpo", "es"],
                  plan=[{"method": "grpo", "updates": 1}, {"method": "es", "updates": 1}])
    card = export.render_card(pipe, base_model=None, license=None, dtype="float32", files=[])
    assert _front_matter(card)["tags"] == ["evolm", "grpo", "evolution-strategies"]
    assert "post-trained with GRPO then Evolution Strategies" in card and "stages/*/seed_log.jsonl" in card


def test_card_evaluation_section_shows_what_the_run_measured(es_run):
    none = export.evaluation_section(None, None)
    assert "took no held-out evaluation" in none and "|" not in none
    before = es_run.evaluation("before")
    only_before = export.evaluation_section(before, None)
    assert "| metric | before |" in only_before and "after |" not in only_before
    after = json.loads(json.dumps(before))
    after["summary"]["pass@1"] = before["summary"]["pass@1"] + 0.25
    both = export.evaluation_section(before, after)
    assert "| pass@1 | " in both and "| +0.25 |" in both
    rows = [line.split("|")[1].strip() for line in both.splitlines() if line.startswith("| ")][1:]
    assert rows[:3] == ["greedy accuracy", "pass@1", "pass@2"]


# -- model.revision and model.trust_remote_code ------------------------------------------------------

def test_revision_and_trust_remote_code_reach_from_pretrained_for_hub_ids(monkeypatch):
    import transformers

    seen = []

    class FakeModel:
        def to(self, device):
            return self

        def eval(self):
            return self

    class FakeTokenizer:
        pad_token, eos_token, padding_side = None, "</s>", "right"

    def recorder(result):
        def from_pretrained(location, **kw):
            seen.append((location, kw))
            return result
        return from_pretrained

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", recorder(FakeModel()))
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", recorder(FakeTokenizer()))
    model, tok = models.load("some-org/some-model", revision="abc1234", trust_remote_code=True)
    assert [loc for loc, _ in seen] == ["some-org/some-model"] * 2
    for _, kw in seen:
        assert kw["revision"] == "abc1234" and kw["trust_remote_code"] is True and kw["local_files_only"] is True
    assert tok.pad_token == "</s>" and tok.padding_side == "left"
    seen.clear()
    models.load("some-org/some-model")  # unset: transformers' defaults (the main branch, no remote code)
    assert all("revision" not in kw and "trust_remote_code" not in kw for _, kw in seen)


def test_a_local_directory_still_loads_with_revision_and_trust_remote_code(spec):
    model, _ = models.load(str(spec), revision="v1.0", trust_remote_code=True)
    plain, _ = models.load(str(spec))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), plain.state_dict().values()))


def test_the_config_fields_reach_models_load_and_the_run(monkeypatch, tiny_model):
    from evolm import jobs

    cfg = config.ESJob()
    cfg.model.spec, cfg.model.revision, cfg.model.trust_remote_code = "some-org/some-model", "abc1234", True
    config.validate(cfg)
    toml = config.to_toml(cfg)
    assert 'revision = "abc1234"' in toml and "trust_remote_code = true" in toml
    back = config.from_dict(config.ESJob, __import__("tomllib").loads(toml))
    assert back.model.revision == "abc1234" and back.model.trust_remote_code is True
    assert config.ModelConfig().revision == "" and config.ModelConfig().trust_remote_code is False

    class Loaded(Exception):
        pass

    def load(spec, **kw):
        raise Loaded(spec, kw)

    monkeypatch.setattr(models, "load", load)
    with pytest.raises(Loaded) as e:
        jobs.build_components(cfg, task=make_vowel_task(), with_generator=False)
    assert e.value.args[0] == "some-org/some-model"
    assert e.value.args[1]["revision"] == "abc1234" and e.value.args[1]["trust_remote_code"] is True
    assert jobs.base_record(cfg, tiny_model, injected=True)["revision"] == "abc1234"
    assert jobs.base_record(config.ESJob(), tiny_model, injected=True)["revision"] is None


# -- lm-eval-harness ------------------------------------------------------------------------------------

def test_the_exported_folder_runs_in_lm_eval_offline(tmp_path, es_run, monkeypatch):
    """lm-eval-harness's ``hf`` model on the exported folder, a local generate_until task (a YAML file and a
    JSONL file written here), fully offline: the targets are the exported model's own greedy continuations
    for three rows and a wrong answer for the fourth, so exact_match is 0.75 exactly when lm_eval ran these
    weights with this tokenizer."""
    pytest.importorskip("lm_eval")
    for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(var, "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # nothing cached from elsewhere is needed
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "export"
    assert main(["export", str(es_run.path), "--to", str(out)]) == 0
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    rows = []
    for i in range(4):
        question = f"Write {i * 7} in words"
        ids = tok(question, add_special_tokens=False, return_tensors="pt").input_ids
        with torch.no_grad():
            cont = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False)
        answer = tok.decode(cont[0, ids.shape[1]:], skip_special_tokens=True)
        rows.append({"question": question, "answer": answer if i < 3 else answer + " (not this)"})
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "evolm_echo.yaml").write_text(yaml.safe_dump({
        "task": "evolm_echo", "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(data)}},
        "test_split": "test", "output_type": "generate_until", "doc_to_text": "{{question}}",
        "doc_to_target": "{{answer}}",
        "generation_kwargs": {"until": ["<never-generated>"], "max_gen_toks": 4, "do_sample": False},
        "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}]}))

    import lm_eval
    from lm_eval.tasks import TaskManager

    results = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={out},dtype=float32", tasks=["evolm_echo"],
                                      task_manager=TaskManager(include_path=str(tasks), include_defaults=False),
                                      device="cpu", batch_size=4)
    assert results["results"]["evolm_echo"]["exact_match,none"] == pytest.approx(0.75)


def test_card_names_a_plugin_reward_by_where_it_came_from(es_run):
    """issue 44.5: the card called a plugin's reward function 'docs/rewards.md of evolm'."""
    cfg = es_run.config()
    plugin = _facts(es_run, config={**cfg, "task": {**cfg["task"], "reward": ["vowel_share"]}},
                    plugins={"rewards": [{"ref": "vowel_share", "module": "evolm_example_plugin.rewards",
                                          "distribution": "evolm-example-plugin", "version": "0.1.0"}]})
    card = export.render_card(plugin, base_model=None, license=None, dtype="float32", files=[])
    assert ("- **reward**: `vowel_share` from evolm-example-plugin 0.1.0 (module evolm_example_plugin.rewards), "
            "a reward function in TRL's convention") in card
    assert "docs/rewards.md of evolm" not in card
    own = export.render_card(_facts(es_run), base_model=None, license=None, dtype="float32", files=[])
    assert "(docs/rewards.md of evolm)" in own  # a convention is evolm's
