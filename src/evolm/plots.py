"""Training plots drawn from a run directory's ``metrics.jsonl`` (matplotlib, Agg backend).

Plots read only files in the run directory (through ``RunDir``'s read side: one record per step), so
they can be redrawn at any time (``evolm report``).
"""

from __future__ import annotations

from pathlib import Path


def _pyplot():
    import matplotlib  # heavy to import, and needed only when a run finishes

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_training(run) -> list[Path]:
    """``plots/reward.png`` (population reward per update) and, when probes were logged,
    ``plots/probe.png`` (held-out entropy and pass@k per update). Returns the files written."""
    train = [r for r in run.train_records() if r.get("reward_mean") is not None]
    probes = run.probes()
    out_dir = Path(run.path) / "plots"
    out_dir.mkdir(parents=True, exist_ok=True)
    plt = _pyplot()
    written = []
    if train:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        steps = [r["step"] for r in train]
        ax.plot(steps, [r["reward_mean"] for r in train], label="population mean")
        if all("reward_max" in r for r in train):
            ax.fill_between(steps, [r.get("reward_min", r["reward_mean"]) for r in train],
                            [r.get("reward_max", r["reward_mean"]) for r in train], alpha=0.2, label="min-max")
        centre = [(r["step"], r["center_reward"]) for r in train if r.get("center_reward") is not None]
        if centre:
            ax.plot(*zip(*centre), "o-", label="centre")
        ax.set_xlabel("update")
        ax.set_ylabel("training reward")
        ax.set_title(f"{Path(run.path).name}: training reward")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out_dir / "reward.png", dpi=110)
        plt.close(fig)
        written.append(out_dir / "reward.png")
    if probes:
        keys = sorted({k for r in probes for k in r if k.startswith("pass@")}, key=lambda k: int(k.split("@")[1]))
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.5))
        steps = [r["step"] for r in probes]
        if any(r.get("entropy") is not None for r in probes):
            ax1.plot(steps, [r.get("entropy") for r in probes], "o-")
        ax1.set_xlabel("update")
        ax1.set_ylabel("held-out token entropy (nats)")
        for k in keys:
            ax2.plot(steps, [r.get(k) for r in probes], "o-", label=k)
        ax2.set_xlabel("update")
        ax2.set_ylabel("held-out pass@k")
        if keys:
            ax2.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out_dir / "probe.png", dpi=110)
        plt.close(fig)
        written.append(out_dir / "probe.png")
    return written
