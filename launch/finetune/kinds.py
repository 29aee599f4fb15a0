"""Task kinds: how each task reads its splits, which head it trains, its loss, scoring and outputs.

A `Task` is the seam between the generic runner and a task: `load` -> `TaskData`, `featurize`,
`collate`, `loss`, `gather` (model outputs -> per-feature numpy) and `score` (-> metrics, files).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from launch.finetune import conll, glue, metrics, squad, swag, userdata
from launch.finetune.finetune_config import FinetuneConfig
from launch.finetune.examples import DataError, SkipCounter
from launch.finetune.encoding import IGNORE, Feature, choice_features, collate, tag_features, text_features

logger = logging.getLogger(__name__)


@dataclass
class Split:
    name: str  # "dev", "dev_mismatched", "test", a GLUE test file name ...
    examples: list
    labelled: bool
    prefix: str = ""  # metric-name prefix (MNLI's mismatched dev: "mismatched_")
    submission: str | None = None  # GLUE server file name for test predictions


@dataclass
class TaskData:
    train: list
    evals: list[Split]
    labels: tuple[str, ...] | None = None  # class names; None for regression / QA / choice
    extra: dict[str, Any] = field(default_factory=dict)
    train_unused: int = 0  # training examples featurize could not use (SQuAD: the answer not at its answer_start)


class Task:
    name: str = ""
    metric: str = "accuracy"  # the dev metric a sweep maximises
    model_kind: str = "sequence"  # sequence | qa | token | choice

    def load(self, data_dir: Path, cfg: FinetuneConfig) -> TaskData:
        raise NotImplementedError

    def head_kwargs(self, data: TaskData) -> dict[str, Any]:
        return {}

    def featurize(self, examples: list, tokenizer, cfg: FinetuneConfig, data: TaskData, training: bool) -> list:
        raise NotImplementedError

    def collate(self, feats: Sequence[Any]) -> dict[str, torch.Tensor]:
        return collate(feats)

    def loss(self, out: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return F.cross_entropy(out.float(), batch["labels"])

    def gather(self, out: Any, batch: dict[str, torch.Tensor]) -> list[np.ndarray]:
        return list(out.float().cpu().numpy())

    def score(self, split: Split, feats: list, outputs: list[np.ndarray], data: TaskData, out_dir: Path,
              cfg: FinetuneConfig) -> dict[str, float]:
        raise NotImplementedError


# ---- sentence / sentence-pair classification and regression ------------------------------------------

class _TextTask(Task):
    regression = False

    def head_kwargs(self, data):
        return {"num_labels": 1 if self.regression else len(data.labels)}

    def featurize(self, examples, tokenizer, cfg, data, training):
        label_ids = None if self.regression else {name: i for i, name in enumerate(data.labels)}
        return text_features(examples, tokenizer, max_seq_len=cfg.max_seq_len, label_ids=label_ids)

    def collate(self, feats):
        return collate(feats, regression=self.regression)

    def loss(self, out, batch):
        if self.regression:
            return F.mse_loss(out.float().view(-1), batch["labels"])
        return F.cross_entropy(out.float(), batch["labels"])

    def predictions(self, outputs, data) -> list:
        if self.regression:
            return [float(o[0]) for o in outputs]
        return [data.labels[int(np.argmax(o))] for o in outputs]

    def score(self, split, feats, outputs, data, out_dir, cfg):
        preds = self.predictions(outputs, data)
        examples = split.examples
        if split.submission:
            glue.write_submission(out_dir / "submission" / split.submission, [ex.guid for ex in examples], preds)
        rows = ["guid\tprediction" + ("\tlabel" if split.labelled else "")]
        for ex, p in zip(examples, preds):
            rows.append(f"{ex.guid}\t{p}" + (f"\t{ex.label}" if split.labelled else ""))
        (out_dir / "predictions").mkdir(parents=True, exist_ok=True)
        (out_dir / "predictions" / f"{split.name.removesuffix('.tsv')}.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
        if not split.labelled:
            return {}
        if self.regression:
            return metrics.regression_metrics([float(ex.label) for ex in examples], preds)
        index = {name: i for i, name in enumerate(data.labels)}
        gold = [index[str(ex.label)] for ex in examples]
        pred = [index[p] for p in preds]
        result = metrics.classification_metrics(gold, pred, num_labels=len(data.labels), metric_names=(self.metric,))
        matrix = metrics.confusion(gold, pred, len(data.labels))
        table = metrics.format_confusion(matrix, data.labels)
        stem = "confusion_matrix" + (f"_{split.prefix.rstrip('_')}" if split.prefix else "")  # MNLI: _mismatched
        (out_dir / f"{stem}.txt").write_text(table + "\n")
        metrics.plot_confusion(matrix, data.labels, out_dir / f"{stem}.png", f"{self.name} {split.name}")
        logger.info("%s %s confusion matrix:\n%s", self.name, split.name, table)
        return result


class GlueTask(_TextTask):
    def __init__(self, spec: glue.GlueSpec) -> None:
        self.spec = spec
        self.name = spec.name
        self.metric = spec.metrics[0]
        self.regression = spec.labels is None

    def load(self, data_dir, cfg):
        read = lambda split: glue.read_split(self.spec, data_dir, split, skip_malformed=cfg.skip_malformed)  # noqa: E731
        train = read("train")
        evals = [Split(name, read(name), True, "" if k == 0 else name.removeprefix("dev_") + "_")
                 for k, name in enumerate(self.spec.dev_files)]
        for test in glue.available_tests(self.spec, data_dir):
            evals.append(Split(test, read(test), False, submission=self.spec.test_files[test]))
        return TaskData(train, evals, self.spec.labels)


class _UserTextTask(_TextTask):
    def load(self, data_dir, cfg):
        cols = userdata.Columns(cfg.text_column, cfg.text_pair_column, cfg.label_column)
        skips = SkipCounter(allow=cfg.skip_malformed)
        paths = {s: userdata.find_split_file(data_dir, s, required=s != "test") for s in ("train", "dev", "test")}
        read = lambda s, labelled: userdata.read_text_split(paths[s], cols, labelled=labelled,  # noqa: E731
                                                            regression=self.regression, skips=skips)
        train, dev = read("train", True), read("dev", True)
        if not train:
            raise DataError(f"{paths['train']}: no examples")
        labels = None
        if not self.regression:  # regress: the runner checks that the scores vary, after any subsetting
            labels = tuple(sorted({str(ex.label) for _, ex in train}))
            if len(labels) < 2:
                raise DataError(f"{paths['train']}: classify needs at least two labels in column {cols.label!r}, found {list(labels)}")
            userdata.check_labels(dev, labels, paths["dev"])
        evals = [Split("dev", [ex for _, ex in dev], True)]
        if paths["test"] is not None:
            evals.append(Split("test", [ex for _, ex in read("test", False)], False))
        skips.log(str(data_dir))
        return TaskData([ex for _, ex in train], evals, labels)


class UserClassifyTask(_UserTextTask):
    name, metric = "classify", "accuracy"


class UserRegressTask(_UserTextTask):
    name, metric, regression = "regress", "spearmanr", True


# ---- token classification ---------------------------------------------------------------------------

class _TagTask(Task):
    metric, model_kind = "f1", "token"

    def head_kwargs(self, data):
        return {"num_labels": len(data.labels)}

    def featurize(self, examples, tokenizer, cfg, data, training):
        ids = {name: i for i, name in enumerate(data.labels)}
        return tag_features(examples, tokenizer, max_seq_len=cfg.max_seq_len, label_ids=ids, doc_context=cfg.doc_context)

    def loss(self, out, batch):
        return F.cross_entropy(out.float().flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE)

    def gather(self, out, batch):
        return list(out.argmax(-1).cpu().numpy())  # [L] predicted label ids per feature

    def score(self, split, feats, outputs, data, out_dir, cfg):
        words_pred: list[list[str]] = [["O" if "O" in data.labels else data.labels[0]] * len(ex.words) for ex in split.examples]
        for feat, row in zip(feats, outputs):
            # First sub-tokens carry a label slot even on unlabelled data (tag_features puts 0 there).
            positions = [p for p, lab in enumerate(feat.label) if lab != IGNORE]
            for pos, w in zip(positions, feat.word_index):
                words_pred[feat.example_index][w] = data.labels[int(row[pos])]
        lines = []
        for ex, pred in zip(split.examples, words_pred):
            for w, word in enumerate(ex.words):
                gold = ex.tags[w] if ex.tags else "-"
                lines.append(f"{word} {gold} {pred[w]}")
            lines.append("")
        (out_dir / "predictions").mkdir(parents=True, exist_ok=True)
        (out_dir / "predictions" / f"{split.name}.txt").write_text("\n".join(lines), encoding="utf-8")
        if not split.labelled:
            return {}
        gold = [list(ex.tags) for ex in split.examples]
        (out_dir / f"{split.name}_entity_report.txt").write_text(metrics.tagging_report(gold, words_pred))
        return metrics.tagging_metrics(gold, words_pred)


class ConllTask(_TagTask):
    name = "conll2003"

    def load(self, data_dir, cfg):
        skips = SkipCounter(allow=cfg.skip_malformed)
        read = lambda p: conll.read_conll(p, skips=skips)  # noqa: E731
        train = read(conll.find_file(data_dir, "train", required=True))
        evals = [Split("dev", read(conll.find_file(data_dir, "dev", required=True)), True)]
        test = conll.find_file(data_dir, "test", required=False)
        if test is not None:  # CoNLL's test set is labelled: scored like dev, reported as test_*
            evals.append(Split("test", read(test), True, "test_"))
        return TaskData(train, evals, conll.LABELS)


ENTITY_PREFIXES = ("B-", "I-", "E-", "S-", "L-", "U-")  # IOB1/IOB2/IOE/IOBES/BILOU, as seqeval reads them


class UserTagTask(_TagTask):
    name = "tag"

    def load(self, data_dir, cfg):
        cols = userdata.Columns(cfg.text_column, None, cfg.label_column)
        skips = SkipCounter(allow=cfg.skip_malformed)
        paths = {s: userdata.find_split_file(data_dir, s, required=s != "test") for s in ("train", "dev", "test")}
        train = userdata.read_tag_split(paths["train"], cols, labelled=True, skips=skips)
        dev = userdata.read_tag_split(paths["dev"], cols, labelled=True, skips=skips)
        if not train:
            raise DataError(f"{paths['train']}: no examples")
        tags = sorted({t for _, ex in train for t in ex.tags})
        plain = [t for t in tags if t != "O" and not (t[:2] in ENTITY_PREFIXES and len(t) > 2)]
        if plain:  # seqeval would cut them into made-up entities and score those
            raise DataError(f"{paths['train']}: tag scores entities, so tags are O or B-/I-/E-/S- (or L-/U-) and a type "
                            f"(B-PER, I-PER); {plain[:5]} are not; per-token classes such as POS tags are not supported")
        labels = tuple(["O"] + [t for t in tags if t != "O"]) if "O" in tags else tuple(tags)
        if len(labels) < 2:  # else the model refused one class, blamed on the checkpoint
            raise DataError(f"{paths['train']}: every tag is {labels[0]!r}; tagging needs at least one entity "
                            "tag (B-PER, I-PER, ...) besides O")
        userdata.check_tags(dev, labels, paths["dev"])
        evals = [Split("dev", [ex for _, ex in dev], True)]
        if paths["test"] is not None:
            test = userdata.read_tag_split(paths["test"], cols, labelled=False, skips=skips)
            evals.append(Split("test", [ex for _, ex in test], False))
        skips.log(str(data_dir))
        return TaskData([ex for _, ex in train], evals, labels)


# ---- SQuAD v1.1 -----------------------------------------------------------------------------------------

class QATask(Task):
    name, metric, model_kind = "squad", "f1", "qa"

    def load(self, data_dir, cfg):
        train = squad.read_squad(squad.find_file(data_dir, "train", required=True))
        dev = squad.read_squad(squad.find_file(data_dir, "dev", required=True))
        return TaskData(train, [Split("dev", dev, True)])

    def featurize(self, examples, tokenizer, cfg, data, training):
        feats, skipped = squad.build_features(examples, tokenizer, max_seq_len=cfg.max_seq_len, doc_stride=cfg.doc_stride,
                                              max_query_length=cfg.max_query_length, training=training)
        if training:
            data.train_unused = len(skipped)
        if skipped:
            logger.warning("squad: %d training question(s) skipped: the answer text is not at its answer_start "
                           "(a character offset into the context), e.g. %s", len(skipped), ", ".join(skipped[:5]))
        return feats

    def collate(self, feats):
        batch = collate([Feature(f.input_ids, f.token_type_ids) for f in feats])
        batch["start_positions"] = torch.tensor([f.start_position for f in feats])
        batch["end_positions"] = torch.tensor([f.end_position for f in feats])
        return batch

    def loss(self, out, batch):
        # Padding is never an answer: its logits leave the softmax. Without this the padded layout scored
        # W·h + b there and `unpad` (zeros in, the bias out) another number: the two trained differently.
        pad = batch["attention_mask"] == 0
        start, end = (logits.float().masked_fill(pad, torch.finfo(torch.float32).min)
                      for logits in (out.start_logits, out.end_logits))
        return (F.cross_entropy(start, batch["start_positions"]) + F.cross_entropy(end, batch["end_positions"])) / 2

    def gather(self, out, batch):
        both = torch.stack([out.start_logits, out.end_logits], dim=-1).float().cpu().numpy()
        return list(both)

    def score(self, split, feats, outputs, data, out_dir, cfg):
        best, nbest = squad.postprocess(split.examples, feats, [o[:, 0] for o in outputs], [o[:, 1] for o in outputs],
                                        n_best=cfg.n_best, max_answer_length=cfg.max_answer_length)
        (out_dir / "predictions").mkdir(parents=True, exist_ok=True)
        (out_dir / "predictions" / "predictions.json").write_text(json.dumps(best, indent=1, ensure_ascii=False))
        (out_dir / "predictions" / "nbest_predictions.json").write_text(json.dumps(nbest, indent=1, ensure_ascii=False))
        return squad.evaluate(split.examples, best)


# ---- SWAG ------------------------------------------------------------------------------------------------

class ChoiceTask(Task):
    name, metric, model_kind = "swag", "accuracy", "choice"

    def load(self, data_dir, cfg):
        skips = SkipCounter(allow=cfg.skip_malformed)
        train = swag.read_swag(swag.find_file(data_dir, "train", required=True), labelled=True, skips=skips)
        evals = [Split("dev", swag.read_swag(swag.find_file(data_dir, "dev", required=True), labelled=True, skips=skips), True)]
        test = swag.find_file(data_dir, "test", required=False)
        if test is not None:
            evals.append(Split("test", swag.read_swag(test, labelled=False, skips=skips), False))
        return TaskData(train, evals)

    def featurize(self, examples, tokenizer, cfg, data, training):
        return choice_features(examples, tokenizer, max_seq_len=cfg.max_seq_len)

    def score(self, split, feats, outputs, data, out_dir, cfg):
        preds = [int(np.argmax(o)) for o in outputs]
        rows = ["id\tprediction" + ("\tlabel" if split.labelled else "")]
        rows += [f"{ex.guid}\t{p}" + (f"\t{ex.label}" if split.labelled else "") for ex, p in zip(split.examples, preds)]
        (out_dir / "predictions").mkdir(parents=True, exist_ok=True)
        (out_dir / "predictions" / f"{split.name}.tsv").write_text("\n".join(rows) + "\n")
        if not split.labelled:
            return {}
        return {"accuracy": float(np.mean([p == ex.label for p, ex in zip(preds, split.examples)]))}
