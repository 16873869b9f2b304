"""ES's drift over GRPO's at matched budgets and arithmetic (issue 40, item 7): the C4 ratio on a stated basis.

A drift ratio means something only when both sides had the same budget (update seconds or update count) and the same
arithmetic (float32 or bfloat16 weights): GRPO's bf16 updates mostly round away, and ES's drift grows with its update
count. Each row reads two ``evolm analyze drift`` outputs already committed under the study's data directory (the
relative distance ‖θ − θ0‖ / ‖θ0‖ of each trained model from its base) and says what was matched.

Design decisions:

- The rows are declared here, not discovered: a ratio's basis is the point, and a file name cannot say it.
- The paper's drift figures (ES 1.933 and 4.185, GRPO 0.0475 and 0.0954) are read as percentages of ‖θ0‖: as
  plain ratios, 1.933 would mean ES moved the weights about twice their own norm, which at this learning rate
  (5e-4 / sqrt(30) per update per coordinate) would take millions of updates. The assumption is printed beside them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

RATIO_ROWS = (
    ("equal update seconds (~2,440 s each), float32, SmolLM2-135M addition: ES 62 updates vs GRPO 36 steps",
     "analyses/c1c2/drift.json", "models.es.relative_distance", "analyses/c1c2/drift.json", "models.grpo.relative_distance"),
    ("unmatched (the earlier '40x'): ES 240 updates vs GRPO 36 steps, float32",
     "analyses/c4/drift.json", "models.es.relative_distance", "analyses/c4/drift.json", "models.grpo.relative_distance"),
    ("unmatched arithmetic (the earlier '29x'): float32 ES vs bf16 GRPO, 120 updates each",
     "refnum/analyses/smollm2-es-exact-f32/drift.json", "models.exact-f32.relative_distance",
     "refnum/analyses/smollm2-grpo-bf16/drift.json", "models.grpo-bf16.relative_distance"),
    ("both bf16 weights, 120 updates each: ES bf16 generation with float32 masters vs GRPO",
     "refnum/analyses/smollm2-es-exact-bf16/drift.json", "models.exact-bf16.relative_distance",
     "refnum/analyses/smollm2-grpo-bf16/drift.json", "models.grpo-bf16.relative_distance"),
    ("both bf16, 120 updates each: ES in Qiu et al.'s in-place bf16 arithmetic vs GRPO",
     "refnum/analyses/smollm2-es-reference-bf16/drift.json", "models.reference-bf16.relative_distance",
     "refnum/analyses/smollm2-grpo-bf16/drift.json", "models.grpo-bf16.relative_distance"),
)
"""(basis, ES's drift file, its key, GRPO's drift file, its key), relative to the study's data directory."""
PAPER = "the paper: ES 1.933 vs GRPO 0.0475 (~40x, Qwen2.5-1.5B), 4.185 vs 0.0954 (~44x, Llama-3.2-3B)"


@dataclass
class Ratio:
    basis: str
    es: float
    grpo: float
    files: tuple[str, str]

    @property
    def ratio(self) -> float:
        return self.es / self.grpo


def _get(node, path: str):
    for key in path.split("."):
        node = node[key]
    return float(node)


def drift_ratios(data: Path, read) -> list[Ratio]:
    """Every row whose two files exist, read through ``read`` (the page's reader)."""
    out = []
    for basis, es_file, es_key, grpo_file, grpo_key in RATIO_ROWS:
        if (data / es_file).exists() and (data / grpo_file).exists():
            out.append(Ratio(basis, _get(read(data / es_file), es_key), _get(read(data / grpo_file), grpo_key),
                             (es_file, grpo_file)))
    return out


def ratio_section(data: Path, read):
    """The table for the page, with the units stated; None when no row's files exist."""
    from evolm.document import Section, Table
    rows = drift_ratios(data, read)
    if not rows:
        return None
    longest = next((r for r in rows if r.files[0] == "analyses/c4/drift.json"), None)
    table = Table(["basis", "ES ‖Δ‖/‖θ0‖ (%)", "GRPO ‖Δ‖/‖θ0‖ (%)", "ES / GRPO", "files"],
                  [[r.basis, f"{100 * r.es:.3f}", f"{100 * r.grpo:.4f}", f"{r.ratio:.1f}x", f"`{r.files[0]}`, `{r.files[1]}`"]
                   for r in rows])
    return Section("C4's drift ratio at matched budgets and arithmetic", [
        "ES's drift over GRPO's from the committed `evolm analyze drift` outputs (relative distance of each trained "
        "model from its base, shown in percent). Only the first row matches the budget (equal update seconds) and the "
        "arithmetic; the unmatched rows are the bases of the ratios quoted before. " + PAPER + ": read as percentages "
        "of ‖θ0‖ (assumed: as plain ratios ES would have moved the weights about twice their own norm, millions of "
        "updates at this learning rate)" + (f", ES's 1.933% compares with the {100 * longest.es:.2f}% here after 240 updates"
        if longest else "") + ".", table])
