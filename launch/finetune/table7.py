"""The paper's Table 7 as a sweep: `bertpipe sweep --tasks conll2003 --grid table7`.

"Which layer should we use?": CoNLL-2003 NER from the frozen activations of six layer choices, each
fed to a randomly initialised two-layer BiLSTM and a classifier (`finetune --feature-based`), next
to fine-tuning the whole model, N seeds per row. The activations of each layer are computed once
and shared by every row and seed (`launch/finetune/feature_cache.py`).

This module holds the rows (with the paper's BERT-Base dev F1), the trial points and the report:
OUT/results.md (the table, the paper's column beside ours, mean ± std over seeds, dev F1 and test F1
when the data has a test file), OUT/results.json and OUT/sweep.png (a bar chart). Pure functions over
trial records (`{"point", "metrics", "error"}`), like `report.py`.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from launch.finetune.tasks import get_task
from pipeline.atomic_write import write_text_atomic

NAME = "table7"


@dataclass(frozen=True)
class Row:
    label: str  # as the paper prints it
    layers: str | None  # the --layers choice; None: the fine-tuning row
    paper_dev_f1: float  # BERT-Base, dev F1 x100 (the paper's Table 7)


ROWS = (
    Row("Embeddings", "embeddings", 91.0),
    Row("Second-to-Last Hidden", "second-to-last", 95.6),
    Row("Last Hidden", "last", 94.9),
    Row("Weighted Sum Last Four Hidden", "last4-weighted", 95.9),
    Row("Concat Last Four Hidden", "last4-concat", 96.1),
    Row("Weighted Sum All 12 Layers", "all-weighted", 95.5),
    Row("Fine-tuning", None, 96.4),
)
# Trial order: fine-tuning (the longest) starts at once beside the feature rows; all-weighted first
# among those, so that one encoder pass caches layers 1..L for every later row but Embeddings.
RUN_ORDER = (None, "all-weighted", "embeddings", "second-to-last", "last", "last4-weighted", "last4-concat")
GRID = {"rows": [r.layers or "fine-tuning" for r in ROWS]}  # what sweep_config.json records


def is_table7(grid: Any) -> bool:
    return isinstance(grid, (str, Path)) and str(grid) == NAME


def points(tasks: Sequence[str], seeds: Sequence[int]) -> list[dict[str, Any]]:
    """Every (row, seed) as a trial point: FinetuneConfig fields plus `seed` and a stable `index`."""
    if len(tasks) != 1 or get_task(tasks[0]).model_kind != "token":
        raise ValueError(f"--grid table7 is the paper's NER comparison: give one token task (--tasks conll2003, "
                         f"or tag for your own data), not {','.join(tasks)}")
    task = get_task(tasks[0]).name
    out: list[dict[str, Any]] = []
    for seed in seeds:
        for layers in RUN_ORDER:
            setting = {"feature_based": False} if layers is None else {"feature_based": True, "layers": layers}
            out.append({"task": task, **setting, "seed": seed, "index": len(out)})
    return out


def _row_of(point: dict[str, Any]) -> Row:
    layers = point.get("layers") if point.get("feature_based") else None
    return next(r for r in ROWS if r.layers == layers)


def _stats(values: list[float]) -> dict[str, Any] | None:
    if not values:
        return None
    return {"mean": 100 * statistics.fmean(values), "std": 100 * statistics.pstdev(values) if len(values) > 1 else 0.0,
            "runs": [100 * v for v in values]}


def summarize(trials: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per row (paper label): the paper's dev F1, ours on dev and test (x100, mean/std over seeds), failures."""
    summary: dict[str, dict[str, Any]] = {}
    for row in ROWS:
        runs = [t for t in trials if _row_of(t["point"]) == row]
        done = [t["metrics"] for t in runs if t.get("metrics") and t["metrics"].get("f1") is not None]
        summary[row.label] = {
            "layers": row.layers, "paper_dev_f1": row.paper_dev_f1,
            "dev_f1": _stats([m["f1"] for m in done]),
            "test_f1": _stats([m["test_f1"] for m in done if m.get("test_f1") is not None]),
            "seeds": [t["point"]["seed"] for t in runs if t.get("metrics")],
            "failed": [t["point"]["index"] for t in runs if t.get("error")],
        }
    return summary


def _cell(stats: dict[str, Any] | None, seeds: int) -> str:
    if stats is None:
        return "-"
    n = len(stats["runs"])
    return (f"{stats['mean']:.1f}" + (f" ± {stats['std']:.1f}" if n > 1 else "")
            + (f" (n={n})" if n < seeds else ""))  # some of this row's seeds failed


def _dataset(trials: Sequence[dict[str, Any]]) -> str:
    """What the F1 is measured on: the paper's CoNLL-2003, or the user's own tag data."""
    tasks = {t["point"]["task"] for t in trials}
    return "CoNLL-2003 NER" if tasks <= {"conll2003"} else f"{'/'.join(sorted(tasks))} (your token data)"


def markdown_table(summary: dict[str, dict[str, Any]], *, name: str, dataset: str) -> str:
    has_test = any(info["test_f1"] for info in summary.values())
    seeds = max((len(info["seeds"]) + len(info["failed"]) for info in summary.values()), default=0)  # restarts asked for
    head = f"| System | `--layers` | Paper, BERT-Base: dev F1 | {name}: dev F1 |" + (f" {name}: test F1 |" if has_test else "")
    rule = "|---|---|---|---|" + ("---|" if has_test else "")
    lines = [head, rule, "| *Feature-based approach* | | | |" + (" |" if has_test else "")]
    for label, info in summary.items():
        if info["layers"] is None:
            lines.append("| *Fine-tuning approach* | | | |" + (" |" if has_test else ""))
        cells = [label, f"`{info['layers']}`" if info["layers"] else "-", f"{info['paper_dev_f1']:.1f}",
                 "failed" if info["failed"] and not info["dev_f1"] else _cell(info["dev_f1"], seeds)]
        if has_test:
            cells.append(_cell(info["test_f1"], seeds))
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"{dataset}, entity-level F1 x100 (seqeval), mean ± std (population) over {seeds} seed(s) per row. "
              "`last4-*` and `all-weighted` take the checkpoint's own layers (all 12 of BERT-Base in the paper)."]
    failed = sum(len(info["failed"]) for info in summary.values())
    if failed:
        lines.append(f"Failed trials (after retries): {failed}.")
    return "\n".join(lines) + "\n"


def plot(summary: dict[str, dict[str, Any]], path: Path, *, name: str, dataset: str) -> None:
    """Grouped bars per row: the paper's dev F1, ours on dev (± std), ours on test when there is one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    labels = list(summary)
    x = np.arange(len(labels))
    series = [("paper, BERT-Base (dev)", [summary[r]["paper_dev_f1"] for r in labels], None, "0.6")]
    for key, title, color in (("dev_f1", f"{name} (dev)", "tab:blue"), ("test_f1", f"{name} (test)", "tab:orange")):
        stats = [summary[r][key] for r in labels]
        if any(stats):
            series.append((title, [s["mean"] if s else 0.0 for s in stats], [s["std"] if s else 0.0 for s in stats], color))
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(10, 4.5), dpi=110)
    for k, (title, values, err, color) in enumerate(series):
        bars = ax.bar(x + (k - (len(series) - 1) / 2) * width, values, width, yerr=err, label=title, color=color,
                      capsize=3)
        ax.bar_label(bars, fmt="%.1f", fontsize=7, padding=2)
    lowest = min(v for _, values, _, _ in series for v in values if v > 0)
    ax.set_ylim(max(0.0, lowest - 10), 100)
    ax.set_xticks(x, [label.replace(" Hidden", "").replace("Weighted Sum", "W. sum") for label in labels],
                  rotation=20, ha="right", fontsize=8)
    ax.set_ylabel(f"{dataset.removesuffix(' NER')}: entity F1 (x100)")
    ax.set_title("Table 7: which layers to use as features (BiLSTM on frozen activations) vs fine-tuning")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=len(series), frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def write_results(out: Path, trials: list[dict[str, Any]], *, name: str) -> tuple[dict[str, dict[str, Any]], str]:
    """OUT/results.json, OUT/results.md and OUT/sweep.png; returns (summary, the markdown table)."""
    summary = summarize(trials)
    dataset = _dataset(trials)
    table = markdown_table(summary, name=name, dataset=dataset)
    write_text_atomic(out / "results.json", json.dumps({"grid": NAME, "summary": summary, "trials": trials}, indent=2,
                                                        default=str) + "\n")
    write_text_atomic(out / "results.md", table)
    plot(summary, out / "sweep.png", name=name, dataset=dataset)
    return summary, table
