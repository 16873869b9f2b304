"""``evolm analyze KIND``: drift, sparsity, localisation, compression and diversity, each writing
``<out>/<kind>.json`` and ``<out>/<kind>.png``.

Design decisions:

- ``--trained`` is repeatable and takes an optional label (``--trained es=runs/es --trained
  grpo=runs/grpo``), so ES and GRPO are analysed side by side against one ``--base``. Without a
  label the directory or spec name is used.
- When a trained model is an evolm run directory, its ``config.toml`` supplies the defaults: the base
  model (``[model] spec``), the target task (``[task]``) and the generation length; its
  ``seed_log.jsonl`` supplies the single-ES-update scale of the sparsity thresholds.
- Weights are read as float32 safetensors without building a model; a model is loaded only for
  the analyses that re-evaluate (sparsity curve, compression), once, and every variant is copied
  into it.
- This module imports nothing heavy at top level, so ``evolm --help`` stays fast.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from evolm.errors import UserError

KINDS = ("drift", "sparsity", "localisation", "compression", "diversity")


# -- argument helpers ---------------------------------------------------------------------------------

def _split_label(text: str) -> tuple[str, str]:
    m = re.match(r"^([A-Za-z0-9_.\-]+)=(.+)$", text)
    if m and "/" not in m.group(1):
        return m.group(1), m.group(2)
    name = Path(text.rstrip("/")).name or text
    return name, text


def _trained(args) -> dict[str, str]:
    if not args.trained:
        raise UserError(f"evolm analyze {args.kind} needs --trained RUN_OR_SPEC (repeatable, optionally LABEL=RUN_OR_SPEC)")
    out: dict[str, str] = {}
    for text in args.trained:
        label, spec = _split_label(text)
        if label in out:
            raise UserError(f"two --trained models are labelled '{label}'; give them labels, e.g. --trained es={spec}")
        out[label] = spec
    return out


def _run_config(spec: str) -> dict:
    path = Path(spec) / "config.toml"
    if not path.exists():
        return {}
    from evolm.config import read_toml

    return read_toml(path)


def _base_spec(args, trained: dict[str, str]) -> str:
    if args.base:
        return args.base
    for spec in trained.values():
        base = _run_config(spec).get("model", {}).get("spec")
        if base:
            return base
    raise UserError("pass --base SPEC (the model the trained ones started from); it is only inferred from run directories")


def _floats(text: str, what: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"{what} must be comma-separated numbers (got '{text}')") from None


def _toml_value(text: str):
    """A TOML literal (``3``, ``true``, ``[1, 2]``); anything else is taken as a bare string."""
    import tomllib

    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _write(out_dir: str, kind: str, result: dict) -> tuple[Path, Path]:
    from evolm.analysis import plots
    from evolm.runs import atomic_write_json

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / f"{kind}.json"
    atomic_write_json(json_path, result)
    png = getattr(plots, f"plot_{kind}")(result, out / f"{kind}.png")
    return json_path, png


def _load_models(args):
    """``(base_spec, base_state, base_info, {label: (spec, state, info)})``, float32, tied weights once."""
    import torch

    from evolm.analysis.weights import load_state_info

    torch.set_num_threads(max(1, args.threads))
    trained = _trained(args)
    base_spec = _base_spec(args, trained)
    base_state, base_info = load_state_info(base_spec)
    loaded = {}
    for label, spec in trained.items():
        state, info = load_state_info(spec)
        if info.tied_embeddings != base_info.tied_embeddings:
            raise UserError(f"'{label}' and the base disagree on tied embeddings; compare checkpoints of the same architecture")
        loaded[label] = (spec, state, info)
    return base_spec, base_state, base_info, loaded


def _header(kind: str, base_info, loaded) -> dict:
    infos = [base_info] + [info for _, _, info in loaded.values()]
    low = sorted({d for i in infos for d in i.stored_dtypes if d in ("bfloat16", "float16")})
    if low:
        print(f"evolm: warning: some weights are stored in {'/'.join(low)}; updates below half their spacing were "
              "rounded away before this analysis saw them (save float32 checkpoints)", file=sys.stderr)
    return {"kind": kind, "base": base_info.to_dict(),
            "trained": {label: info.to_dict() for label, (_, _, info) in loaded.items()},
            "tied_embeddings": base_info.tied_embeddings,
            "low_precision_storage": low,
            "note": ("tied embeddings: the LM head is the embedding matrix and is counted once, as 'embedding'"
                     if base_info.tied_embeddings else "untied embeddings: 'embedding' and 'lm_head' are separate tensors")}


# -- kinds ------------------------------------------------------------------------------------------

def _cmd_drift(args) -> int:
    from evolm.analysis.drift import drift

    base_spec, base, base_info, loaded = _load_models(args)
    result = _header("drift", base_info, loaded)
    result["models"] = {}
    for label, (_, state, _) in loaded.items():
        d = drift(base, state)
        if not args.per_tensor:
            d.pop("by_tensor")
        result["models"][label] = d
        shares = ", ".join(f"{c} {v['share_of_squared_distance']:.0%}" for c, v in d["by_category"].items())
        print(f"{label}: relative distance {d['relative_distance']:.4g} (||Δ||² share: {shares})")
    _report(*_write(args.out, "drift", result))
    return 0


def _cmd_localisation(args) -> int:
    from evolm.analysis.localisation import top_k_localisations

    ks = args.k or [100]
    base_spec, base, base_info, loaded = _load_models(args)
    result = _header("localisation", base_info, loaded)
    result["models"] = {}
    for label, (_, state, _) in loaded.items():
        result["models"][label] = {}
        for k, loc in top_k_localisations(base, state, ks).items():
            result["models"][label][str(k)] = loc
            counts = ", ".join(f"{c} {n}" for c, n in loc["by_category"].items() if n)
            print(f"{label} top-{k}: {counts} (max |Δ| {loc['max_abs_delta']:.3g})")
    _report(*_write(args.out, "localisation", result))
    return 0


def _tau_scale(args, loaded) -> tuple[float, str]:
    from evolm.analysis.sparsity import single_update_rms
    from evolm.runs import read_jsonl

    if args.tau_scale is not None:
        return float(args.tau_scale), "--tau-scale"
    for label, (spec, _, _) in loaded.items():
        log = Path(spec) / "seed_log.jsonl"
        if log.exists():
            return single_update_rms(read_jsonl(log)), f"median single-update RMS from {log}"
    raise UserError("no ES seed log found among --trained run directories; pass --tau-scale (e.g. an ES run's single-update RMS)")


def _build_evaluator(args, base_spec: str, loaded):
    """A ``TaskEvaluator`` for the target task: ``--task`` or the first trained run's ``[task]``."""
    from evolm import models
    from evolm.analysis.evaluator import TaskEvaluator
    from evolm.tasks import make_task

    run_cfg = next((c for c in (_run_config(spec) for spec, _, _ in loaded.values()) if c), {})
    task_cfg = dict(run_cfg.get("task", {}))
    if args.task and args.task != task_cfg.get("name"):
        task_cfg = {"name": args.task}  # a different task than the run's: none of its task settings apply
    if not task_cfg.get("name"):
        raise UserError("pass --task NAME for re-evaluation (or --no-eval); it is only inferred from run directories")
    params = dict(task_cfg.get("params", {}))
    for assignment in args.task_param:
        if "=" not in assignment:
            raise UserError(f"--task-param expects KEY=VALUE (got '{assignment}')")
        key, value = assignment.split("=", 1)
        params[key.strip()] = _toml_value(value.strip())
    task = make_task(task_cfg["name"], reward=task_cfg.get("reward", "qiu"), system_prompt=task_cfg.get("system_prompt"), **params)
    examples = task.examples(args.split, args.limit, args.seed)
    if not examples:
        raise UserError(f"task '{task_cfg['name']}' has no '{args.split}' examples")
    max_new = args.max_new_tokens or run_cfg.get("generation", {}).get("max_new_tokens") or 32
    model, tokenizer = models.load(base_spec, dtype="float32", threads=args.threads)
    ks = args.pass_k or ([1] if args.n else [])
    evaluator = TaskEvaluator(model, tokenizer, task, examples, n=args.n, ks=ks, temperature=args.temperature,
                              max_new_tokens=int(max_new), batch_size=args.batch_size, seed=args.seed)
    known = ["greedy_pass@1"] + [f"pass@{k}" for k in ks]
    if args.metric not in known:
        raise UserError(f"--metric {args.metric} is not measured; choose one of {known} (pass@k needs --n >= k and --pass-k k)")
    setup = {"task": task_cfg["name"], "task_params": params, "split": args.split, "num_examples": len(examples),
             "max_new_tokens": int(max_new), "n": args.n, "pass_k": ks, "temperature": args.temperature, "seed": args.seed}
    return _Progress(evaluator, args.metric), setup


class _Progress:
    """Prints one line per evaluation (each is a full generation pass over the examples)."""

    def __init__(self, evaluate, metric: str):
        self.evaluate, self.metric, self.count = evaluate, metric, 0

    def __call__(self, state: dict) -> dict:
        import time

        start = time.perf_counter()
        metrics = self.evaluate(state)
        self.count += 1
        print(f"  evaluation {self.count}: {self.metric} {metrics.get(self.metric)} ({time.perf_counter() - start:.0f} s)", flush=True)
        return metrics


def _cmd_sparsity(args) -> int:
    from evolm.analysis.sparsity import sparsity_curve, tau_grid, update_sparsity

    base_spec, base, base_info, loaded = _load_models(args)
    scale, source = _tau_scale(args, loaded)
    multipliers = _floats(args.multipliers, "--multipliers")
    taus = tau_grid(scale, multipliers)
    result = _header("sparsity", base_info, loaded)
    result.update({"tau_scale": scale, "tau_scale_source": source, "multipliers": multipliers, "metric": args.metric, "models": {}})
    evaluator = None
    if not args.no_eval:
        evaluator, result["evaluation"] = _build_evaluator(args, base_spec, loaded)
        base_metrics = evaluator(base)
    for label, (_, state, _) in loaded.items():
        if evaluator is None:
            r = update_sparsity(base, state, taus)
        else:
            r = sparsity_curve(base, state, taus, evaluator, multipliers=multipliers, base_metrics=base_metrics)
        result["models"][label] = r
        line = ", ".join(f"τ={t:.2g}: {f:.1%} below" for t, f in zip(r["taus"], r["fraction_below"]))
        print(f"{label}: {line}")
        for p in r.get("points", []):
            print(f"  τ={p['tau']:.3g} keeps {p['kept_fraction']:.2%} of coordinates: {args.metric} {p['metrics'].get(args.metric)}")
    _report(*_write(args.out, "sparsity", result))
    return 0


def _cmd_compression(args) -> int:
    from evolm.analysis.categories import CATEGORIES
    from evolm.analysis.compression import compression_table, parse_method

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    for m in methods:
        parse_method(m)
    categories = [c.strip() for c in args.params.split(",") if c.strip()]
    bad = [c for c in categories if c not in CATEGORIES]
    if bad or not categories:
        raise UserError(f"--params must be a comma-separated subset of {', '.join(CATEGORIES)} (got '{args.params}')")
    base_spec, base, base_info, loaded = _load_models(args)
    if "base" in loaded:
        raise UserError("the label 'base' is reserved for --base in the compression table; label the trained model differently")
    result = _header("compression", base_info, loaded)
    evaluator, result["evaluation"] = _build_evaluator(args, base_spec, loaded)
    states = {"base": base, **{label: state for label, (_, state, _) in loaded.items()}}
    table = compression_table(states, methods, evaluator, base=base, categories=categories,
                              matrices_only=not args.include_vectors)
    result.update(table)
    result["metric"] = args.metric
    for row in table["rows"]:
        extra = f", error/update {row['error_to_update']:.3g}" if row.get("error_to_update") is not None else ""
        print(f"{row['model']:>10} {row['method']:>14}: {args.metric} {row['metrics'].get(args.metric)} "
              f"(weight error {row['relative_error']:.3g}{extra})")
    _report(*_write(args.out, "compression", result))
    return 0


def _cmd_diversity(args) -> int:
    import json

    from evolm.analysis.diversity import diversity_report

    if not args.from_file:
        raise UserError("evolm analyze diversity needs --from FILE (measured correctness; see --help for the format)")
    path = Path(args.from_file)
    if not path.exists():
        raise UserError(f"{path} does not exist")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{path} is not valid JSON: {e}") from None
    result = {"kind": "diversity", "source": str(path), **diversity_report(data)}
    print(f"coverage: population {result['population']:.3f} vs centre {result['center']:.3f} "
          f"(gap {result['gap']:+.3f}); verifier-projected JSD {result['js_divergence']:.4f} nats")
    _report(*_write(args.out, "diversity", result))
    return 0


def _report(json_path: Path, png: Path) -> None:
    print(f"wrote {json_path} and {png}")


# -- parser -----------------------------------------------------------------------------------------

def _add_models(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base", metavar="SPEC", help="the starting model: embedded name, model dir, run dir or .gguf "
                   "(default: the [model] spec of the first --trained run directory)")
    p.add_argument("--trained", action="append", default=[], metavar="[LABEL=]RUN_OR_SPEC",
                   help="a trained model (run directory or any model spec); repeat for side by side, e.g. "
                        "--trained es=runs/es --trained grpo=runs/grpo")
    p.add_argument("--out", default="analysis", metavar="DIR", help="output directory for <kind>.json and <kind>.png (default: analysis)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: 1)")


def _add_eval(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("re-evaluation (target task)")
    g.add_argument("--task", help="task name (default: the [task] of the first --trained run directory)")
    g.add_argument("--task-param", action="append", default=[], metavar="KEY=VALUE", help="task parameter (repeatable)")
    g.add_argument("--split", default="test", help="example split (default: test)")
    g.add_argument("--limit", type=int, default=64, help="number of examples (default: 64)")
    g.add_argument("--n", type=int, default=0, help="samples per example for pass@k (default: 0 = greedy pass@1 only)")
    g.add_argument("--pass-k", type=int, action="append", default=[], metavar="K", help="k of pass@k, repeatable (default: 1 when --n > 0)")
    g.add_argument("--temperature", type=float, default=1.0, help="sampling temperature for pass@k (default: 1.0)")
    g.add_argument("--max-new-tokens", type=int, default=0, help="generation length (default: the run's, else 32)")
    g.add_argument("--batch-size", type=int, default=32, help="generation batch size (default: 32)")
    g.add_argument("--seed", type=int, default=0, help="seed for the example draw and for sampling (default: 0)")
    g.add_argument("--metric", default="greedy_pass@1", help="metric shown in the summary and plot (default: greedy_pass@1; e.g. pass@4)")


def add_cli(subparsers) -> None:
    p = subparsers.add_parser(
        "analyze", help="compare trained weights with their base: drift, sparsity, localisation, compression, diversity",
        description="Analyses of what training did to a model. Each writes <out>/<kind>.json and <out>/<kind>.png. "
                    "Weights are read in float32 (tied embeddings counted once).")
    kinds = p.add_subparsers(dest="kind", metavar="KIND")
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])

    k = kinds.add_parser("drift", help="relative distance ||θ − θ0|| / ||θ0||, whole model and per category/module",
                         description="Relative whole-model distance ||θ − θ0|| / ||θ0|| and its breakdown by category "
                                     "(norm, attention, mlp, embedding, lm_head), subcategory (attention.q.bias, ...) and layer.")
    _add_models(k)
    k.add_argument("--per-tensor", action="store_true", help="also write the per-tensor breakdown to the JSON")
    k.set_defaults(func=_cmd_drift)

    k = kinds.add_parser("localisation", aliases=["localization"], help="top-k largest |Δ| coordinates counted by parameter category",
                         description="The k largest-magnitude coordinates of Δ = θ − θ0, counted by category and subcategory, "
                                     "for each --trained model side by side.")
    _add_models(k)
    k.add_argument("--k", type=int, action="append", metavar="K", help="how many coordinates, repeatable (default: 100; the paper also uses 144)")
    k.set_defaults(func=_cmd_localisation, kind="localisation")

    k = kinds.add_parser("sparsity", help="fraction of updates below τ and pass@1 of θ0 + Δ·1[|Δ| ≥ τ]",
                         description="Thresholds τ = m × s, where s is the RMS of a single ES update (median over the run's "
                                     "seed_log.jsonl: scale · sqrt(Σ c_i²)) or --tau-scale. For each τ: the fraction of nonzero "
                                     "|Δ| below τ, and (unless --no-eval) the target-task metrics of θ0 + Δ·1[|Δ| ≥ τ].")
    _add_models(k)
    k.add_argument("--tau-scale", type=float, help="threshold scale s (default: from the first --trained run's seed log)")
    k.add_argument("--multipliers", default="0.25,0.5,1,2,4,8", help="τ = m × s for these m (default: 0.25,0.5,1,2,4,8)")
    k.add_argument("--no-eval", action="store_true", help="only count coordinates; do not re-evaluate")
    _add_eval(k)
    k.set_defaults(func=_cmd_sparsity)

    k = kinds.add_parser("compression", help="int8/int4 fake-quantisation and magnitude pruning, re-evaluated",
                         description="Apply each compression method to the base and every --trained model and re-evaluate on the "
                                     "target task. Methods: none, int<bits> (per-output-channel symmetric round-to-nearest), "
                                     "prune:<fraction> (global magnitude pruning), prune-tensor:<fraction> (per tensor).")
    _add_models(k)
    k.add_argument("--methods", default="none,int8,int4,prune:0.25,prune:0.5", help="comma-separated methods (default: none,int8,int4,prune:0.25,prune:0.5)")
    k.add_argument("--params", default="attention,mlp", help="categories to compress (default: attention,mlp; also norm, embedding, lm_head, other)")
    k.add_argument("--include-vectors", action="store_true", help="also compress 1-D tensors (norm weights, biases) of those categories")
    _add_eval(k)
    k.set_defaults(func=_cmd_compression)

    k = kinds.add_parser("diversity", help="Lemma 2: population coverage vs centre, and verifier-projected JS divergence",
                         formatter_class=argparse.RawDescriptionHelpFormatter,
                         description="Reads measured correctness of an ES population and its centre and writes coverage of one "
                                     "sample per member vs N centre samples, and the verifier-projected Jensen-Shannon divergence.\n\n"
                                     "FILE (JSON): {\"member_correct\": [member][prompt][sample] 0/1, \"center_correct\": "
                                     "[prompt][sample] 0/1, \"center_samples\": N (optional, default: number of members)}\n"
                                     "or {\"p_members\": [member][prompt] probabilities, \"q_center\": [prompt] probabilities}.")
    k.add_argument("--from", dest="from_file", metavar="FILE", help="measured correctness file (JSON)")
    k.add_argument("--out", default="analysis", metavar="DIR", help="output directory (default: analysis)")
    k.set_defaults(func=_cmd_diversity)


if __name__ == "__main__":  # pragma: no cover
    from evolm.cli import main

    sys.exit(main(["analyze", *sys.argv[1:]]))
