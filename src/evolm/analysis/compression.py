"""Compression robustness: fake-quantise or magnitude-prune base, ES and GRPO weights and re-evaluate.

An untested worry raised about "Understanding Evolution Strategies for LLM Reasoning" (arXiv
2608.27351): if ES's gains live in a few large-magnitude coordinates, compression
that treats magnitude as importance might keep them, while uniform quantisation or pruning might
not. This module provides the weight transforms and a runner that evaluates every (model, method)
pair with any ``evaluate(state) -> metrics`` callable.

Design decisions:

- ``fake_quantize(w, bits, axis)`` is symmetric round-to-nearest with one scale per output channel:
  for a row r (``axis=0``, the output dimension of ``nn.Linear`` weights ``[out, in]``)
  ``scale_r = max|w_r| / (2^(bits−1) − 1)`` and ``q(w) = clamp(round(w / scale_r), −qmax, qmax) · scale_r``.
  Since ``|w / scale_r| ≤ qmax`` nothing is clipped, so the error bound is
  ``|w − q(w)| ≤ scale_r / 2`` per channel (up to float32 rounding of the division and product).
  All-zero rows stay zero. ``axis=None`` uses one scale for the whole tensor. (GPT-2's ``Conv1D``
  stores ``[in, out]``, so ``axis=0`` is per *input* channel there; the bound holds either way.)
- ``fake_quantize_groups(w, bits, group)`` is the same with one scale per ``group`` consecutive input
  entries of each output row (the group-wise layout of GPTQ / AWQ int4 checkpoints, group size 128 by
  convention): a row of 576 splits into 128, 128, 128, 128, 64 (a short last group is its own group,
  not padded into a neighbour), so one large coordinate inflates the step of its own group only. The
  bound is ``|w − q(w)| ≤ scale_group / 2``. Round-to-nearest, no calibration data: it measures what the
  layout does to the weights, not what GPTQ's error-correcting rounding would recover.
- Which tensors are compressed is explicit: by default the 2-D weight matrices of the attention and
  MLP blocks (what weight-only int8/int4 and magnitude pruning usually touch); norms, biases,
  embeddings and the LM head stay in float32 unless ``categories`` says otherwise. Where a run's
  largest updates land is for ``evolm analyze localisation`` to measure (the paper reports norm
  weights for its ES runs), so the report records the categories touched.
- ``magnitude_prune(state, sparsity, scope="global")`` zeroes the ``sparsity`` fraction of the selected
  coordinates with the smallest |w|, ranked across all selected tensors together (``"global"``) or
  within each tensor (``"per_tensor"``). The exact count is pruned (ties at the threshold broken by
  position), and the achieved fraction of zeros is reported.
- Methods are short strings: ``none``, ``int8``, ``int4`` (any ``int<b>`` with 2 ≤ b ≤ 16),
  ``int4g128`` (group-wise, any ``int<b>g<size>``), ``prune:0.5`` (global) and ``prune-tensor:0.5`` (per tensor).
- Besides the task metrics, each (model, method) row reports the relative weight error
  ``||C(θ) − θ|| / ||θ||`` over the compressed tensors and, for a trained model, how large that
  error is next to the training update in the same tensors (``error_to_update = ||C(θ) − θ|| / ||θ − θ0||``):
  above 1, compression moves those weights further than training did.
- When ``evaluate`` returns per-problem results (``metrics["problems"]``, as ``TaskEvaluator`` does), they
  leave the table (``compression.json`` stays one number per metric) and go to ``row["problems"]``;
  ``evolm analyze compression`` writes each row's as an evaluation file (``compression/<model>_<method>.json``)
  so that a robustness comparison (say ES int4 against ES uncompressed) gets a paired interval over problems.
- The report section (``report_section``) lives here, next to the computation: every (model, method)
  row's metric, weight error, error / update and zero fraction, beside ``plots.plot_compression``.
"""

from __future__ import annotations

import math
import re

from evolm.analysis import plots, sparsity  # modules, not names: see evolm.report on the import cycle
from evolm.categories import param_category
from evolm.errors import UserError
from evolm.document import Canvas, Section, Table

DEFAULT_CATEGORIES = ("attention", "mlp")
DEFAULT_METHODS = ("none", "int8", "int4", "prune:0.25", "prune:0.5")


def fake_quantize(tensor, bits: int, axis: int | None = 0):
    """Symmetric round-to-nearest quantise-dequantise; one scale per slice along ``axis`` (None: per tensor).

    Error bound: ``|w − q(w)| ≤ scale / 2`` elementwise with ``scale = max|w_slice| / (2^(bits−1) − 1)``.
    """
    import torch  # local: torch is slow to import, and `evolm --help` imports this module

    if not 2 <= bits <= 16:
        raise ValueError(f"bits must be in [2, 16] (got {bits})")
    w = tensor.to(torch.float32)
    qmax = 2 ** (bits - 1) - 1
    scale = quantization_scale(w, bits, axis)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.clamp(torch.round(w / safe), -qmax, qmax) * safe
    return torch.where(scale > 0, q, torch.zeros_like(q)).to(tensor.dtype)


def quantization_scale(tensor, bits: int, axis: int | None = 0):
    """``max|w| / (2^(bits−1) − 1)`` per slice along ``axis`` (keepdim, broadcastable), or per tensor."""
    import torch  # local: torch is slow to import, and `evolm --help` imports this module

    w = tensor.to(torch.float32).abs()
    qmax = 2 ** (bits - 1) - 1
    if axis is None or w.dim() < 2:
        return (w.max() if w.numel() else torch.zeros(())).reshape([1] * w.dim()) / qmax
    reduce = [d for d in range(w.dim()) if d != axis % w.dim()]
    return w.amax(dim=reduce, keepdim=True) / qmax


def fake_quantize_groups(tensor, bits: int, group: int):
    """Symmetric round-to-nearest with one scale per ``group`` consecutive entries of each row (last dim).

    A tensor of fewer than 2 dims is one row. Error bound: ``|w − q(w)| ≤ scale_group / 2``.
    """
    import torch  # local: torch is slow to import, and `evolm --help` imports this module

    if group < 1:
        raise ValueError(f"group must be >= 1 (got {group})")
    w = tensor.to(torch.float32)
    rows = w.reshape(-1, w.shape[-1]) if w.dim() >= 1 else w.reshape(1, 1)
    parts = [fake_quantize(rows[:, i:i + group], bits, axis=0) for i in range(0, rows.shape[1], group)]
    return torch.cat(parts, dim=1).reshape(tensor.shape).to(tensor.dtype)


def selected_names(state: dict, categories=DEFAULT_CATEGORIES, matrices_only: bool = True) -> list[str]:
    """Names of the tensors a compression method touches: given categories, 2-D or larger when ``matrices_only``."""
    return [n for n in sorted(state) if param_category(n) in categories and (state[n].dim() >= 2 or not matrices_only)]


def quantize_state(state: dict, bits: int, categories=DEFAULT_CATEGORIES, matrices_only: bool = True,
                   group: int | None = None) -> dict:
    """A new state dict with the selected tensors fake-quantised per output channel, or per ``group`` (others shared)."""
    names = set(selected_names(state, categories, matrices_only))
    if group:
        return {n: fake_quantize_groups(t, bits, group) if n in names else t for n, t in state.items()}
    return {n: fake_quantize(t, bits, axis=0) if n in names else t for n, t in state.items()}


def magnitude_prune(state: dict, sparsity: float, scope: str = "global", categories=DEFAULT_CATEGORIES,
                    matrices_only: bool = True) -> dict:
    """A new state dict whose selected tensors have their smallest-|w| ``sparsity`` fraction set to zero."""
    if not 0.0 <= sparsity <= 1.0:
        raise UserError(f"pruning sparsity must be in [0, 1] (got {sparsity})")
    if scope not in ("global", "per_tensor"):
        raise UserError(f"pruning scope must be 'global' or 'per_tensor' (got '{scope}')")
    names = selected_names(state, categories, matrices_only)
    out = dict(state)
    if not names or sparsity == 0:
        return out
    if scope == "per_tensor":
        for n in names:
            out[n] = _prune_flat([state[n]], sparsity)[0]
        return out
    pruned = _prune_flat([state[n] for n in names], sparsity)
    out.update(zip(names, pruned))
    return out


def _prune_flat(tensors, sparsity: float):
    """Zero the ``round(sparsity · total)`` smallest-|w| entries across ``tensors``.

    The threshold is the k-th smallest |w|; entries equal to it are pruned in position order until the
    count is exact, so ties cannot make the achieved sparsity drift from the requested one.
    """
    import torch  # local: torch is slow to import, and `evolm --help` imports this module

    flat = torch.cat([t.detach().flatten().to(torch.float32).abs() for t in tensors])
    count = int(round(sparsity * flat.numel()))
    if count == 0:
        return list(tensors)
    threshold = torch.kthvalue(flat, count).values
    prune = flat < threshold
    ties = torch.nonzero(flat == threshold).flatten()[:count - int(prune.sum())]
    prune[ties] = True
    out, start = [], 0
    for t in tensors:
        m = prune[start:start + t.numel()].view(t.shape)
        out.append(torch.where(m, torch.zeros_like(t), t))
        start += t.numel()
    return out


_METHOD = re.compile(r"^(none|int(\d+)(?:g(\d+))?|prune(-tensor)?:([0-9.]+))$")


def parse_method(method: str) -> dict:
    """``"int4"`` -> ``{"kind": "quantize", "bits": 4}``, ``"int4g128"`` -> ``{..., "group": 128}``, ``"prune:0.5"`` -> ``{"kind": "prune", "sparsity": 0.5, ...}``."""
    m = _METHOD.match(method.strip())
    if not m:
        raise UserError(f"unknown compression method '{method}'; use none, int8, int4, int4g128, prune:0.5 or prune-tensor:0.5")
    if m.group(1) == "none":
        return {"kind": "none"}
    if m.group(2):
        bits = int(m.group(2))
        if not 2 <= bits <= 16:
            raise UserError(f"compression method '{method}': bits must be between 2 and 16")
        if m.group(3) is None:
            return {"kind": "quantize", "bits": bits}
        group = int(m.group(3))
        if group < 1:
            raise UserError(f"compression method '{method}': the group size must be at least 1, e.g. int4g128")
        return {"kind": "quantize", "bits": bits, "group": group}
    sparsity = float(m.group(5))
    if not 0 <= sparsity <= 1:
        raise UserError(f"compression method '{method}': the pruned fraction must be between 0 and 1")
    return {"kind": "prune", "sparsity": sparsity, "scope": "per_tensor" if m.group(4) else "global"}


def compress(state: dict, method: str, categories=DEFAULT_CATEGORIES, matrices_only: bool = True) -> dict:
    """Apply one compression method string (see ``parse_method``) to the selected tensors of ``state``."""
    spec = parse_method(method)
    if spec["kind"] == "none":
        return dict(state)
    if spec["kind"] == "quantize":
        return quantize_state(state, spec["bits"], categories, matrices_only, spec.get("group"))
    return magnitude_prune(state, spec["sparsity"], spec["scope"], categories, matrices_only)


def weight_error(original: dict, compressed: dict, base: dict | None, names: list[str]) -> dict:
    """``relative_error = ||C(θ) − θ|| / ||θ||`` over ``names``; with ``base``, also ``error_to_update``.

    Also ``zero_fraction``: the fraction of the selected coordinates that are exactly zero after compression.
    """
    import torch  # local: torch is slow to import, and `evolm --help` imports this module

    err = ref = upd = 0.0
    zeros = total = 0
    for n in names:
        o, c = original[n].to(torch.float32), compressed[n].to(torch.float32)
        err += float((c - o).pow(2).sum(dtype=torch.float64))
        ref += float(o.pow(2).sum(dtype=torch.float64))
        zeros += int((c == 0).sum())
        total += c.numel()
        if base is not None:
            upd += float((o - base[n].to(torch.float32)).pow(2).sum(dtype=torch.float64))
    out = {"relative_error": math.sqrt(err / ref) if ref > 0 else 0.0,
           "zero_fraction": zeros / total if total else 0.0}
    if base is not None:
        out["error_to_update"] = math.sqrt(err / upd) if upd > 0 else None
    return out


def compression_table(models: dict, methods, evaluate: sparsity.Evaluate, base: dict | None = None,
                      categories=DEFAULT_CATEGORIES, matrices_only: bool = True) -> dict:
    """Evaluate every ``(label, state)`` in ``models`` under every method; ``base`` enables ``error_to_update``.

    Returns ``methods``, ``categories``, ``compressed_tensors`` (their count and parameter count) and
    ``rows``: one ``{model, method, relative_error, zero_fraction, [error_to_update], metrics, [problems]}`` per pair.
    """
    for m in methods:
        parse_method(m)  # fail before any evaluation
    rows = []
    names: list[str] = []
    for label, state in models.items():
        names = selected_names(state, categories, matrices_only)
        for method in methods:
            compressed = compress(state, method, categories, matrices_only)
            is_base = base is None or state is base
            row = {"model": label, "method": method,
                   **weight_error(state, compressed, None if is_base else base, names)}
            metrics = dict(evaluate(compressed))
            problems = metrics.pop("problems", None)
            row["metrics"] = metrics
            if problems is not None:
                row["problems"] = problems
            rows.append(row)
    any_state = next(iter(models.values()))
    return {"methods": list(methods), "categories": list(categories), "matrices_only": matrices_only,
            "compressed_tensors": len(names), "compressed_params": sum(any_state[n].numel() for n in names),
            "rows": rows}


# -- report --------------------------------------------------------------------------------------------

REPORT_TEXT = "Fake-quantisation and magnitude pruning, re-evaluated on the target task (`evolm analyze compression`)."


def problems_file_name(model: str, method: str) -> str:
    """The evaluation file of one row: ``es_int4.json``, ``grpo_prune-0.5.json`` (``:`` is not portable in names)."""
    return f"{model}_{method.replace(':', '-')}.json"


def report_table(result: dict) -> Table:
    """One row per (model, method): the metric, the relative weight error, error / update and the zero fraction."""
    metric = result.get("metric", "greedy_pass@1")
    rows = [[r["model"], r["method"], r["metrics"].get(metric), r.get("relative_error"), r.get("error_to_update"),
             r.get("zero_fraction")] for r in result["rows"]]
    return Table(["model", "method", metric, "relative weight error", "error / update", "zero fraction"], rows)


def report_section(entries, canvas: Canvas) -> Section:
    """The report section of ``compression.json`` inputs: ``entries`` are ``(label, directory, result)``."""
    return plots.report_section("compression", REPORT_TEXT, entries, canvas, plots.plot_compression, report_table)
