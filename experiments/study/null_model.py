"""A null for an ES model: its base plus an isotropic Gaussian step of the same size in every tensor.

Q2 found ES's model losing more to compression than the base it started from. Compression near a cliff
(per-channel and group-wise int4, 25% magnitude pruning take SmolLM2 close to zero) can amplify any small
weight change, so the comparison needs a model that differs from the base by as much as ES's does, but in
a random direction: for each tensor, ``θ0 + ε · ||θ − θ0|| / ||ε||`` with ``ε`` standard normal (seeded).
If the null falls as far as ES under the same compression, ES's fragility is the size of its step, not
what it learned.

    python experiments/study/null_model.py runs/study/c1c2-es runs/study/analyses/q2-groups-null/model --seed 0

Writes a Hugging Face model directory (the trained run's tokenizer and config) and ``null.json``
(the seed, the per-model relative distances of ES and of the null from the base, which are equal by construction).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from evolm.models import load
from evolm.runs import RunDir


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 4) or (len(argv) == 4 and argv[2] != "--seed"):
        raise SystemExit("usage: python experiments/study/null_model.py RUN OUT_DIR [--seed S]")
    import torch

    run, out = RunDir.open(argv[0]), Path(argv[1])
    seed = int(argv[3]) if len(argv) == 4 else 0
    if (out / "null.json").exists():
        print(f"{out / 'null.json'} exists: nothing to do")
        return 0
    base, _ = load(run.config()["model"]["spec"])
    trained, tokenizer = load(str(run.path / "final"))
    gen = torch.Generator().manual_seed(seed)
    b, t = base.state_dict(), trained.state_dict()
    moved = total = ref = 0.0
    with torch.no_grad():
        for name, p in trained.named_parameters():
            delta = t[name] - b[name]
            size = float(delta.norm())
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            p.copy_(b[name] + noise * (size / float(noise.norm())) if size > 0 else b[name])
            moved += size ** 2
            total += float((p - b[name]).norm()) ** 2
            ref += float(b[name].norm()) ** 2
    out.mkdir(parents=True, exist_ok=True)
    trained.save_pretrained(out)
    tokenizer.save_pretrained(out)
    record = {"run": str(run.path), "seed": seed, "relative_distance_trained": (moved / ref) ** 0.5,
              "relative_distance_null": (total / ref) ** 0.5}
    (out / "null.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {out} ({record})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
