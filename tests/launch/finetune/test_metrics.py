"""Metrics against hand-computed values, and the SQuAD scorer against the official v1.1 rules."""

from __future__ import annotations

import numpy as np
import pytest

from launch.finetune import metrics, squad
from launch.finetune.examples import QAExample


def test_classification_binary_and_mcc():
    gold = [1, 1, 1, 0, 0, 0, 1, 0]
    pred = [1, 1, 0, 0, 0, 1, 1, 0]
    m = metrics.classification_metrics(gold, pred, num_labels=2, metric_names=("matthews_correlation",))
    assert m["accuracy"] == pytest.approx(6 / 8)
    # tp=3 fp=1 fn=1 -> P=R=F1=0.75; MCC = (tp*tn - fp*fn)/sqrt(...) = (9-1)/16 = 0.5
    assert m["f1"] == pytest.approx(0.75)
    assert m["matthews_correlation"] == pytest.approx(0.5)
    # Every binary task reports MCC beside its own metric (SST-2's accuracy here), not only CoLA.
    assert metrics.classification_metrics(gold, pred, num_labels=2)["matthews_correlation"] == pytest.approx(0.5)


def test_classification_multiclass_macro_micro_and_confusion():
    gold = [0, 0, 1, 1, 2, 2]
    pred = [0, 1, 1, 1, 2, 0]
    m = metrics.classification_metrics(gold, pred, num_labels=3)
    assert m["micro_f1"] == pytest.approx(4 / 6)
    # per class F1: c0 P=1/2 R=1/2 -> .5; c1 P=2/3 R=1 -> .8; c2 P=1 R=1/2 -> 2/3
    assert m["macro_f1"] == pytest.approx((0.5 + 0.8 + 2 / 3) / 3)
    assert "f1" not in m
    matrix = metrics.confusion(gold, pred, 4)  # a class never seen still gets its row and column
    assert matrix.tolist() == [[1, 1, 0, 0], [0, 2, 0, 0], [1, 0, 1, 0], [0, 0, 0, 0]]
    text = metrics.format_confusion(matrix[:3, :3], ["neg", "neu", "pos"])
    assert text.splitlines()[3].split() == ["neg", "|", "1", "1", "0"]


def test_regression_correlations():
    y = [1.0, 2.0, 3.0, 4.0, 5.0]
    p = [1.1, 1.9, 3.2, 3.9, 100.0]  # monotone: Spearman 1, Pearson well below 1
    m = metrics.regression_metrics(y, p)
    assert m["spearmanr"] == pytest.approx(1.0)
    assert m["pearson"] == pytest.approx(float(np.corrcoef(y, p)[0, 1]))
    assert metrics.regression_metrics(y, [2.0] * 5)["pearson"] == 0.0  # constant predictions: defined as 0
    assert metrics.regression_metrics([2, 2, 2], [1, 2, 3])["spearmanr"] == 0.0  # constant labels too
    # Constant whatever the rounding of their mean (np.std([0.1] * 3) is 1.4e-17): 0, not scipy's NaN.
    assert metrics.regression_metrics([1, 2, 3], [0.1] * 3) == {"pearson": 0.0, "spearmanr": 0.0,
                                                                 "mse": pytest.approx(4.2766666)}


def test_entity_level_ner_f1():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "I-ORG", "O"]]
    pred = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "O", "O"]]  # a wrong type, and a cut-short entity
    m = metrics.tagging_metrics(gold, pred)
    # gold entities: PER, LOC, ORG(2 tokens); predicted: PER (right), ORG (wrong type), ORG (too short)
    assert m["precision"] == pytest.approx(1 / 3) and m["recall"] == pytest.approx(1 / 3)
    assert m["f1"] == pytest.approx(1 / 3)
    assert m["accuracy"] == pytest.approx(5 / 7)


def test_bilou_tags_are_scored_as_their_own_entities():
    # seqeval's default mode does not know L-/U-: it merged the two U-PER into one entity and B-LOC L-LOC U-LOC
    # into one LOC, scoring 3 of 4 found entities as P = R = 0.5.
    gold = [["U-PER", "U-PER", "O", "B-LOC", "L-LOC", "U-LOC"]]
    pred = [["U-PER", "U-PER", "O", "B-LOC", "L-LOC", "O"]]
    m = metrics.tagging_metrics(gold, pred)
    assert m["precision"] == pytest.approx(1.0) and m["recall"] == pytest.approx(0.75)
    assert m["f1"] == pytest.approx(2 * 0.75 / 1.75)
    assert "PER" in metrics.tagging_report(gold, pred)


@pytest.mark.parametrize(
    "raw, normalized",
    [
        ("The Eiffel Tower", "eiffel tower"),
        ("an apple a day", "apple day"),
        ("theater", "theater"),  # articles only as whole words
        ("the-end", "theend"),  # punctuation goes first, so no article is left to remove
        ("U.S. Army", "us army"),
        ("rock-n-roll!", "rocknroll"),
        ("  New\tYork \n City ", "new york city"),
        ("A", ""),
        ("“Quoted”", "“quoted”"),  # only ASCII punctuation is removed, as in the official script
        ("$1,000.50", "100050"),
    ],
)
def test_squad_normalisation_matches_official(raw, normalized):
    assert squad.normalize_answer(raw) == normalized


def test_squad_em_f1_edge_cases():
    assert squad.exact_match_score("the Denver Broncos", "Denver Broncos!") == 1.0
    assert squad.f1_score("the cat sat", "a cat") == pytest.approx(2 * 0.5 * 1 / 1.5)
    assert squad.f1_score("", "cat") == 0.0
    assert squad.f1_score("cat cat", "cat") == pytest.approx(2 * 0.5 * 1 / 1.5)  # token counts, not sets
    examples = [
        QAExample("q1", "?", "c", ({"text": "Denver Broncos", "answer_start": 0}, {"text": "Broncos", "answer_start": 7})),
        QAExample("q2", "?", "c", ({"text": "1990", "answer_start": 0},)),
        QAExample("q3", "?", "c", ({"text": "x", "answer_start": 0},)),
    ]
    # q1 takes the max over gold answers; q3 unanswered scores 0 (official behaviour)
    scores = squad.evaluate(examples, {"q1": "the Broncos", "q2": "in 1990"})
    assert scores["exact_match"] == pytest.approx(100 / 3)
    assert scores["f1"] == pytest.approx(100 * (1 + 2 * 0.5 / 1.5) / 3)


def test_macro_f1_leaves_out_a_class_in_neither_gold_nor_predictions():
    # Perfect predictions over two of three classes read 0.667: the absent class counted as F1 0.
    from sklearn.metrics import f1_score

    assert metrics.classification_metrics([0, 1, 0, 1], [0, 1, 0, 1], num_labels=3)["macro_f1"] == 1.0
    gold, pred = [0, 1, 0, 1, 1], [0, 1, 2, 1, 0]
    assert metrics.classification_metrics(gold, pred, num_labels=4)["macro_f1"] == pytest.approx(
        f1_score(gold, pred, average="macro"))
