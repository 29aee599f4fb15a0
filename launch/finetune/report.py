"""Sweep results -> the best config per task, a markdown table laid out like the paper's Table 1, a plot.

Pure functions over trial records (`{"point": {...}, "metrics": {...} | None, "error": str | None}`)
so they are tested without Ray and reused by anything that collects trial results.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any, Sequence

from launch.finetune.tasks import PAPER_ORDER, get_task

# Column titles and metric abbreviations as the paper prints them.
TITLES = {"mnli": "MNLI-(m/mm)", "qqp": "QQP", "qnli": "QNLI", "sst2": "SST-2", "cola": "CoLA", "stsb": "STS-B",
          "mrpc": "MRPC", "rte": "RTE", "wnli": "WNLI", "squad": "SQuAD v1.1", "conll2003": "CoNLL-2003", "swag": "SWAG",
          "classify": "classify", "regress": "regress", "tag": "tag"}
METRIC_ABBR = {"accuracy": "Acc", "f1": "F1", "matthews_correlation": "MCC", "spearmanr": "Spearman",
               "pearson": "Pearson", "exact_match": "EM"}
GRID_KEYS = ("batch_size", "lr", "epochs")
NOT_GRID = ("seed", "index", "task")  # what tells trials apart without being a setting


def swept_beyond_lr_batch_epochs(points: Sequence[dict[str, Any]]) -> list[str]:
    """The settings other than the paper's three that take more than one value among `points` (the
    demo's `init`); one that a grid fixes (`max_seq_len: 128`) tells points apart from nothing."""
    keys = {k for p in points for k in p if k not in GRID_KEYS + NOT_GRID}
    return sorted(k for k in keys if len({repr(p.get(k)) for p in points}) > 1)


def point_key(point: dict[str, Any]) -> tuple:
    """A grid point without its seed: trials differing only in seed are restarts of one config."""
    return tuple(sorted((k, v) for k, v in point.items() if k not in NOT_GRID))


def summarize(trials: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per task: the grid point with the best mean dev score over seeds, its runs, and failures."""
    by_task: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for t in trials:
        by_task[t["point"]["task"]].append(t)
    out: dict[str, dict[str, Any]] = {}
    for task, runs in by_task.items():
        metric = get_task(task).metric
        groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
        for r in runs:
            if r.get("metrics") and r["metrics"].get("score") is not None:
                groups[point_key(r["point"])].append(r)
        failed = [r["point"] for r in runs if r.get("error")]
        if not groups:
            out[task] = {"metric": metric, "best": None, "failed": failed, "trials": len(runs)}
            continue
        def mean(rs):
            return statistics.fmean(r["metrics"]["score"] for r in rs)
        # Among the configs with the most seeds finished: a mean over fewer restarts is noisier, and a
        # config whose other seeds failed must not win on its one lucky run.
        most = max(len(rs) for rs in groups.values())
        best_key = max((k for k in groups if len(groups[k]) == most), key=lambda k: mean(groups[k]))
        best = groups[best_key]
        scores = [r["metrics"]["score"] for r in best]
        config = {k: v for k, v in best[0]["point"].items() if k not in NOT_GRID}
        extra = {}
        if task == "mnli":
            mm = [r["metrics"].get("mismatched_accuracy") for r in best]
            if all(v is not None for v in mm):
                extra["mismatched"] = statistics.fmean(mm)
        out[task] = {
            "metric": metric,
            "best": {"config": config, "score": statistics.fmean(scores),
                     "std": statistics.pstdev(scores) if len(scores) > 1 else 0.0,
                     "seeds": [r["point"]["seed"] for r in best], "scores": scores, **extra},
            # The paper's choice: the single best dev run over every config and restart.
            "best_run": _best_run(groups),
            "grid": [{"config": dict(k), "score": mean(rs), "seeds": len(rs)} for k, rs in groups.items()],
            "failed": failed,
            "trials": len(runs),
            "seeds": len({r["point"]["seed"] for r in runs}),
        }
    return out


def _best_run(groups: dict[Any, list[dict[str, Any]]]) -> dict[str, Any]:
    run = max((r for rs in groups.values() for r in rs), key=lambda r: r["metrics"]["score"])
    return {"config": {k: v for k, v in run["point"].items() if k not in NOT_GRID}, "seed": run["point"]["seed"],
            "score": run["metrics"]["score"]}


def ordered(tasks: Sequence[str]) -> list[str]:
    rank = {name: i for i, name in enumerate(PAPER_ORDER)}
    return sorted(tasks, key=lambda t: (rank.get(t, len(rank)), t))


def _cell(task: str, info: dict[str, Any]) -> str:
    best = info.get("best")
    if best is None:
        return "failed"
    text = f"{100 * best['score']:.1f}" if task not in ("squad",) else f"{best['score']:.1f}"
    if task == "mnli" and "mismatched" in best:
        text += f"/{100 * best['mismatched']:.1f}"
    if len(best["scores"]) > 1:
        text += f" ±{(100 if task != 'squad' else 1) * best['std']:.1f}"
    if len(best["scores"]) < info.get("seeds", len(best["scores"])):
        text += f" (n={len(best['scores'])})"  # some seeds of this config failed
    return text


def _row_name(name: str, init: str) -> str:
    return f"random init ({name}'s architecture)" if init == "random" else name


def system_rows(trials: Sequence[dict[str, Any]], *, name: str) -> dict[str, dict[str, dict[str, Any]]]:
    """The table's rows, each a `summarize` of its trials: one, named after the checkpoint, unless the grid
    sweeps `init` (the demo's pre-trained against random weights). That is a choice of model, not a
    hyper-parameter: each init gets its own row and best config, so that neither hides the other."""
    inits = sorted({t["point"].get("init", "checkpoint") for t in trials}) or ["checkpoint"]  # checkpoint first
    if len(inits) == 1:
        return {_row_name(name, inits[0]): summarize(trials)}
    return {_row_name(name, init): summarize([t for t in trials if t["point"].get("init", "checkpoint") == init])
            for init in inits}


def markdown_table(rows: dict[str, dict[str, dict[str, Any]]]) -> str:
    """Tasks as columns in the paper's order; a row per system (`system_rows`): the dev score x100, an
    average; then the chosen config of each."""
    tasks = ordered(sorted({t for summary in rows.values() for t in summary}))
    metrics = {t: next(summary[t]["metric"] for summary in rows.values() if t in summary) for t in tasks}
    head = "| System | " + " | ".join(TITLES.get(t, t) for t in tasks) + " | Average |"
    rule = "|---|" + "---|" * (len(tasks) + 1)
    metric_row = "| (dev metric) | " + " | ".join(METRIC_ABBR.get(metrics[t], metrics[t]) for t in tasks) + " | |"

    def score_row(name: str, summary: dict[str, dict[str, Any]]) -> str:
        points = [summary[t]["best"]["score"] * (1 if t == "squad" else 100) for t in tasks
                  if t in summary and summary[t]["best"]]
        avg = f"{statistics.fmean(points):.1f}" if points and len(points) == len(tasks) else "-"
        # "-" where this row ran no trial of the task (the grid gave it none), "failed" where all of them failed
        return f"| {name} | " + " | ".join(_cell(t, summary[t]) if t in summary else "-" for t in tasks) + f" | {avg} |"

    def cfg(summary: dict[str, dict[str, Any]], t: str) -> str:
        best = summary[t]["best"] if t in summary else None
        if best is None:
            return "-"
        c = best["config"]
        # The paper's three where the grid sets them (flags fix the rest), then any other swept setting
        # (one that differs between this row's grid points).
        swept = swept_beyond_lr_batch_epochs([g["config"] for g in summary[t]["grid"]])
        return ", ".join([_setting(k, c[k]) for k in ("lr", "batch_size", "epochs") if k in c]
                         + [_setting(k, c.get(k)) for k in swept]) or "-"

    config_rows = [f"| best config{'' if len(rows) == 1 else ', ' + name} | " + " | ".join(cfg(summary, t) for t in tasks)
                   + " | |" for name, summary in rows.items()]
    lines = [head, rule, metric_row, *(score_row(n, s) for n, s in rows.items()), *config_rows]
    seeds = max((s[t].get("seeds", 1) for s in rows.values() for t in s), default=1)
    if seeds > 1:
        lines += ["", f"Dev score x100 of the best config: mean ± std (population) over its {seeds} seeds."]
    failed = {t: sum(len(s[t]["failed"]) for s in rows.values() if t in s) for t in tasks}
    if any(failed.values()):
        lines += ["", "Failed trials (after retries): " + ", ".join(f"{t}: {n}" for t, n in failed.items() if n)]
    return "\n".join(lines) + "\n"


_ABBR = {"lr": "lr", "batch_size": "bs", "epochs": "ep"}


def _setting(key: str, value: Any) -> str:
    shown = f"{value:g}" if isinstance(value, float) else value
    return f"{_ABBR.get(key, key)} {shown}"


def x_setting(points: Sequence[dict[str, Any]]) -> str | None:
    """What a grid plot puts on its x axis: the learning rate where the grid sets it, else the first
    other swept setting whose values are all numbers (a grid of `warmup` alone), else nothing."""
    if any("lr" in p for p in points):
        return "lr"
    numeric = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)  # noqa: E731
    return next((k for k in swept_beyond_lr_batch_epochs(points) if all(numeric(p.get(k)) for p in points)), None)


def grid_lines(trials: Sequence[dict[str, Any]], task: str) -> dict[str, dict[float, list[float]]]:
    """One task's dev scores by line label, then the `x_setting` (the learning rate): a line per
    (batch size, epochs, any other swept setting), so that points differing in, say, `init` are
    never averaged together."""
    scored = [(t["point"], t["metrics"]["score"]) for t in trials
              if t["point"]["task"] == task and (t.get("metrics") or {}).get("score") is not None]
    x = x_setting([p for p, _ in scored])
    swept = [k for k in swept_beyond_lr_batch_epochs([p for p, _ in scored]) if k != x]
    lines: dict[tuple, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for p, score in scored:
        label = tuple((k, p[k]) for k in ("batch_size", "epochs") if k in p) + tuple((k, p.get(k)) for k in swept)
        lines[label][float(p[x]) if x else 0.0].append(score)
    return {", ".join(_setting(k, v) for k, v in label) or task: dict(by_x)
            for label, by_x in sorted(lines.items(), key=lambda kv: str(kv[0]))}


def plot_grid(trials: Sequence[dict[str, Any]], summary: dict[str, dict[str, Any]], path: Path,
              name: str | None = None) -> None:
    """Dev metric against the learning rate (`x_setting`), one line per `grid_lines` label, one panel per task;
    `name` (the checkpoint's, as results.md names it) above them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = ordered(list(summary))
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.5 * len(tasks), 3.8), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        lines = grid_lines(trials, task)
        x = x_setting([t["point"] for t in trials if t["point"]["task"] == task])
        for label, by_lr in lines.items():
            lrs = sorted(by_lr)
            (line,) = ax.plot(lrs, [statistics.fmean(by_lr[lr]) for lr in lrs], marker="o", label=label)
            for lr in lrs:
                if len(by_lr[lr]) > 1:  # the seeds behind the mean, in their line's colour
                    ax.scatter([lr] * len(by_lr[lr]), by_lr[lr], s=8, alpha=0.5, color=line.get_color())
        if x == "lr":
            ax.set_xscale("log")
        ax.set_xlabel({"lr": "learning rate", None: ""}.get(x, x))
        ax.set_ylabel(f"dev {summary[task]['metric']}")
        ax.set_title(TITLES.get(task, task))
        if lines:
            ax.legend(fontsize=7)
    if name:
        fig.suptitle(name, fontsize="medium")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
