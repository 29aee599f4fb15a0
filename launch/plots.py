"""Loss curve of a run (`RUN/metrics.jsonl`) as a PNG, for the demo and for quick looks."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import yaml

from launch.pretrain.training_log import read_metrics


def smooth(values: Sequence[float], weight: float | None = None) -> list[float]:
    """TensorBoard-style exponential moving average, debiased so the first points are not pulled to 0.
    `weight` None: a window of about a twentieth of the curve (TensorBoard's fixed 0.9 is ten points,
    which on the demo's 60 logged points left the curve 100 steps and 0.45 of loss behind the raw one)."""
    if weight is None:
        weight = max(0.0, 1.0 - 20.0 / max(1, len(values)))
    out, avg = [], 0.0
    for i, v in enumerate(values, start=1):
        avg = weight * avg + (1 - weight) * v
        out.append(avg / (1 - weight**i))
    return out


def describe_run(run_dir: str | Path) -> str:
    """`BERT tiny (L2/H64), 300 steps x 32 sequences`: what was trained, from the run's resolved config."""
    path = Path(run_dir) / "config.yaml"
    try:
        cfg: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return Path(run_dir).name
    from model import BertConfig

    model = cfg.get("model", {})
    try:
        bert = BertConfig.preset(model.get("preset", "base"), **(model.get("fields") or {}))
        shape = f" (L{bert.num_hidden_layers}/H{bert.hidden_size})"
    except (TypeError, ValueError):
        shape = ""
    steps = cfg.get("schedule", {}).get("total_steps", "?")
    batch = cfg.get("data", {}).get("global_batch_size", "?")
    return f"BERT {model.get('preset', '?')}{shape}, {steps} steps x {batch} sequences"


def plot_loss(run_dir: str | Path, png_path: str | Path, title: str | None = None,
              nsp_majority: float | None = None) -> Path:
    """Two panels: the training loss (smoothed, raw faint behind it) and, when the run evaluated,
    held-out MLM accuracy (all targets, and at [MASK] alone when logged) and NSP accuracy on a 0-1 axis
    with NSP's chance level marked.

    title: what was trained on what (default: the model and steps from RUN/config.yaml).
    nsp_majority: NSP's chance level, what always the corpus's commoner label scores on the held-out
    instances (`pipeline.mlm_baseline`); 0.5 where not given, right only for a corpus of balanced pairs.
    """
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    records = [r for r in read_metrics(run_dir) if isinstance(r.get("loss"), (int, float))]
    if not records:
        raise ValueError(f"{Path(run_dir) / 'metrics.jsonl'} has no finite losses to plot")
    evals = [r for r in records if r.get("eval_mlm_accuracy") is not None]
    fig, axes = plt.subplots(2 if evals else 1, 1, figsize=(7, 6 if evals else 4), dpi=120, sharex=True,
                             squeeze=False)
    ax = axes[0][0]
    steps, losses = [r["step"] for r in records], [r["loss"] for r in records]
    ax.plot(steps, losses, lw=0.8, alpha=0.3, color="tab:blue", label="train loss (raw)")
    ax.plot(steps, smooth(losses), lw=1.8, color="tab:blue", label="train loss (smoothed)")
    ax.set_ylabel("loss (MLM + NSP)")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", frameon=False)
    if evals:
        acc = axes[1][0]
        eval_steps = [r["step"] for r in evals]
        acc.plot(eval_steps, [r["eval_mlm_accuracy"] for r in evals], "o-", color="tab:orange",
                 label="held-out MLM accuracy")
        if all(r.get("eval_mlm_accuracy_at_mask") is not None for r in evals):
            acc.plot(eval_steps, [r["eval_mlm_accuracy_at_mask"] for r in evals], "^-", color="tab:red",
                     label="held-out MLM accuracy at [MASK] (context only)")
        if all(r.get("eval_nsp_accuracy") is not None for r in evals):
            acc.plot(eval_steps, [r["eval_nsp_accuracy"] for r in evals], "s-", color="tab:green",
                     label="held-out NSP accuracy")
        if nsp_majority is None:
            acc.axhline(0.5, ls="--", lw=0.8, color="grey", label="NSP chance (0.5)")
        else:
            acc.axhline(nsp_majority, ls="--", lw=0.8, color="grey",
                        label=f"NSP: always the commoner label ({nsp_majority:.2f})")
        # A fixed 0-1 axis: a 0.05 -> 0.06 change must look as small as it is.
        acc.set_ylim(0.0, 1.0)
        acc.set_ylabel("accuracy")
        acc.grid(alpha=0.3)
        acc.legend(loc="upper left", frameon=False, fontsize="small")
    axes[-1][0].set_xlabel("optimizer step")
    ax.set_title(title or f"pre-training: {describe_run(run_dir)}", fontsize="medium")
    fig.tight_layout()
    png = Path(png_path)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png)
    plt.close(fig)
    return png
