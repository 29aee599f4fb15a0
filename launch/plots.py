"""Loss curve of a run (`RUN/metrics.jsonl`) as a PNG, for the demo and for quick looks."""

from __future__ import annotations

from pathlib import Path

from launch.pretrain.training_log import read_metrics


def plot_loss(run_dir: str | Path, png_path: str | Path) -> Path:
    """Training loss per step (and held-out MLM accuracy on a second axis when evaluated)."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    records = [r for r in read_metrics(run_dir) if isinstance(r.get("loss"), (int, float))]
    if not records:
        raise ValueError(f"{Path(run_dir) / 'metrics.jsonl'} has no finite losses to plot")
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    ax.plot([r["step"] for r in records], [r["loss"] for r in records], lw=1.2, label="train loss (MLM + NSP)")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    handles = ax.get_lines()
    evals = [r for r in records if r.get("eval_mlm_accuracy") is not None]
    if evals:
        ax2 = ax.twinx()
        handles += ax2.plot([r["step"] for r in evals], [r["eval_mlm_accuracy"] for r in evals], "o-",
                            color="tab:orange", label="held-out MLM accuracy")
        ax2.set_ylabel("held-out MLM accuracy")
    # One legend for both axes, below the plot so it never hides a curve.
    fig.legend(handles=handles, loc="lower center", ncol=2, frameon=False)
    ax.set_title(f"pre-training: {Path(run_dir).name}")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    png = Path(png_path)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png)
    plt.close(fig)
    return png
