"""The task registry: a task name -> how to read its files, which head it trains, how it is scored.

| task | files (under DIR or DIR/<Task>/) | head | dev metrics (first = the paper's) |
|---|---|---|---|
| mnli qqp qnli sst2 cola stsb mrpc rte wnli | GLUE TSVs | sequence classification / regression | GLUE's |
| squad | train-v1.1.json, dev-v1.1.json | span (start/end) | exact_match, f1 |
| conll2003 | train.txt, dev.txt (CoNLL layout) | token classification | entity f1 (seqeval) |
| swag | train.csv, val.csv | multiple choice | accuracy |
| classify / regress / tag | train/dev/test .csv .tsv .jsonl | as named | accuracy+F1 / pearson+spearman / entity f1 |
"""

from __future__ import annotations

from launch.finetune import glue
from launch.finetune.finetune_config import canonical_task
from launch.finetune.kinds import (
    ChoiceTask,
    ConllTask,
    GlueTask,
    QATask,
    Task,
    UserClassifyTask,
    UserRegressTask,
    UserTagTask,
)


# Column order of the paper's Table 1 (the sweep's results table follows it).
PAPER_ORDER = ("mnli", "qqp", "qnli", "sst2", "cola", "stsb", "mrpc", "rte", "wnli", "squad", "conll2003", "swag")


def task_names() -> list[str]:
    return list(glue.GLUE_TASKS) + ["squad", "conll2003", "swag", "classify", "regress", "tag"]


def get_task(name: str) -> Task:
    key = canonical_task(name)
    if key in glue.GLUE_TASKS:
        return GlueTask(glue.GLUE_TASKS[key])
    factories = {
        "squad": QATask, "conll2003": ConllTask, "swag": ChoiceTask,
        "classify": UserClassifyTask, "regress": UserRegressTask, "tag": UserTagTask,
    }
    if key not in factories:
        raise ValueError(f"unknown task {name!r}; choose one of: {', '.join(task_names())}")
    return factories[key]()
