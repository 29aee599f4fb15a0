"""Dev metrics under the names users know (GLUE / HF `run_glue`), computed by well-kept libraries:
scikit-learn (accuracy, F1, Matthews correlation, confusion matrix), scipy (Pearson, Spearman),
seqeval (entity-level NER F1, CoNLL-style chunking).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np


def classification_metrics(
    labels: Sequence[int], preds: Sequence[int], *, num_labels: int, metric_names: Sequence[str] = ()
) -> dict[str, float]:
    """accuracy always; binary `f1` (positive class 1) for two classes; macro/micro F1 for more; MCC when asked."""
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

    y, p = np.asarray(labels), np.asarray(preds)
    out = {"accuracy": float(accuracy_score(y, p))}
    every = list(range(num_labels))
    if num_labels == 2:
        out["f1"] = float(f1_score(y, p, labels=every, pos_label=1, average="binary", zero_division=0))
    # Over the classes in the gold labels or the predictions (scikit-learn's own default): a class that
    # appears in neither (a small dev set, a --max-eval-samples subset) would count as F1 0.
    present = sorted(set(y.tolist()) | set(p.tolist()))
    out["macro_f1"] = float(f1_score(y, p, labels=present, average="macro", zero_division=0))
    out["micro_f1"] = float(f1_score(y, p, labels=every, average="micro", zero_division=0))
    if "matthews_correlation" in metric_names or num_labels == 2:
        out["matthews_correlation"] = float(matthews_corrcoef(y, p)) if len(set(y) | set(p)) > 1 else 0.0
    return out


def regression_metrics(labels: Sequence[float], preds: Sequence[float]) -> dict[str, float]:
    from scipy.stats import pearsonr, spearmanr

    y, p = np.asarray(labels, dtype=np.float64), np.asarray(preds, dtype=np.float64)
    # Constant means every value equal: np.std of [0.1] * 3 is 1.4e-17, not 0, and scipy's answer NaN.
    if len(y) < 2 or np.ptp(p) == 0 or np.ptp(y) == 0:
        # Correlation is undefined for constant predictions (an untrained model can produce them).
        pearson = spearman = 0.0
    else:
        pearson = float(pearsonr(y, p)[0])
        spearman = float(spearmanr(y, p)[0])
    return {"pearson": pearson, "spearmanr": spearman, "mse": float(np.mean((y - p) ** 2))}


# seqeval's default (conlleval) mode reads B/I/E/S but not BILOU's L/U: it would merge `U-PER U-PER` into one
# entity. L- and U- mean what E- and S- mean, so they are renamed before scoring.
_BILOU_AS_IOBES = {"L-": "E-", "U-": "S-"}


def _seqeval_tags(seqs: Sequence[Sequence[str]]) -> list[list[str]]:
    return [[_BILOU_AS_IOBES.get(t[:2], t[:2]) + t[2:] if len(t) > 2 else t for t in s] for s in seqs]


def tagging_metrics(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> dict[str, float]:
    """Entity-level precision/recall/F1 (conlleval semantics, via seqeval) plus token accuracy."""
    from seqeval.metrics import accuracy_score, f1_score, precision_score, recall_score

    g, p = _seqeval_tags(gold), _seqeval_tags(pred)
    return {
        "f1": float(f1_score(g, p, zero_division=0)),
        "precision": float(precision_score(g, p, zero_division=0)),
        "recall": float(recall_score(g, p, zero_division=0)),
        "accuracy": float(accuracy_score(g, p)),
    }


def tagging_report(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> str:
    from seqeval.metrics import classification_report

    return classification_report(_seqeval_tags(gold), _seqeval_tags(pred), digits=4, zero_division=0)


def confusion(labels: Sequence[int], preds: Sequence[int], num_labels: int) -> np.ndarray:
    """[true, predicted] counts over every class, including classes never predicted."""
    from sklearn.metrics import confusion_matrix

    return confusion_matrix(labels, preds, labels=list(range(num_labels)))


def format_confusion(matrix: np.ndarray, names: Sequence[str]) -> str:
    """A plain-text table: rows are the true class, columns the predicted class."""
    width = max(6, *(len(n) for n in names), len(str(int(matrix.max(initial=0)))))
    head = " " * width + " | " + " ".join(f"{n:>{width}}" for n in names)
    lines = ["true \\ predicted", head, "-" * len(head)]
    for name, row in zip(names, matrix):
        lines.append(f"{name:>{width}} | " + " ".join(f"{int(v):>{width}}" for v in row))
    return "\n".join(lines)


def plot_confusion(matrix: np.ndarray, names: Sequence[str], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    size = max(4.0, 0.6 * len(names) + 2)
    fig, ax = plt.subplots(figsize=(size, size))
    ax.imshow(matrix, cmap="Blues")
    ax.set_xticks(range(len(names)), labels=names, rotation=45, ha="right")
    ax.set_yticks(range(len(names)), labels=names)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title)
    top = matrix.max(initial=0)
    for i in range(matrix.shape[0]):
        for j in range(matrix.shape[1]):
            ax.text(j, i, int(matrix[i, j]), ha="center", va="center", color="white" if matrix[i, j] > top / 2 else "black")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
