"""SQuAD v1.1: reader, windowed features (doc stride, max query length), n-best post-processing, scorer.

Windows follow the original BERT `run_squad.py`: the question (cut to `max_query_length` tokens) is
sentence A; the context is split into windows of what is left of `max_seq_len`, the next window
starting `doc_stride` tokens later; a token's prediction is taken only from the window where it has
the most context on both sides. Answers are cut from the original context by character offsets.
The scorer reproduces the official v1.1 `evaluate-v1.1.py` (normalisation: lower case, drop
punctuation, drop the articles a/an/the, collapse whitespace; EM and F1 maxed over the gold answers).
"""

from __future__ import annotations

import collections
import json
import logging
import math
import re
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from launch.finetune.examples import DataError, QAExample, SplitFiles, json_int, unreadable

logger = logging.getLogger(__name__)

FILES = {"train": ("train-v1.1.json", "train.json"), "dev": ("dev-v1.1.json", "dev.json")}


# ---- reading -------------------------------------------------------------------------------------

FOLDER = SplitFiles("SQuAD", ("squad", "SQuAD"), FILES, pattern="{split}*.json")  # e.g. dev-v1.1-subset.json


def find_file(data_dir: Path, split: str, *, required: bool) -> Path | None:
    """`split`'s file in DIR/squad/, DIR/SQuAD/ or DIR, whichever holds the task's files (`SplitFiles`): one of
    FILES' names, or when none is there one `<split>*.json`."""
    return FOLDER.find(data_dir, split, required=required)


def _text(value: object, what: str, path: Path, article: int) -> str:
    """A field that must be text: `null` or a number there failed later (the tokenizer, the scorer after training)."""
    if not isinstance(value, str):
        raise DataError(f"{path}: article {article}: {what} is {json.dumps(value)[:40]}, not a string; fix the file")
    return value


def read_squad(path: Path) -> list[QAExample]:
    try:
        with open(path, encoding="utf-8-sig") as f:  # a byte order mark (an editor's save) is dropped, as elsewhere
            data = json.load(f, parse_int=json_int)
    except json.JSONDecodeError as err:
        raise DataError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from None
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not UTF-8 text (byte {err.start}: {err.reason}); SQuAD files are UTF-8 JSON") from None
    except OSError as err:
        raise unreadable(path, err) from None
    except RecursionError:  # thousands of nested [ or {: no SQuAD file is that deep
        raise DataError(f"{path}: not a SQuAD file (JSON nested too deeply); expected SQuAD v1.1 layout") from None
    except ValueError as err:  # json_int's: a number of thousands of digits
        raise DataError(f"{path}: {err}") from None
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise DataError(f"{path}: not a SQuAD file (expected an object with a `data` list of articles)")
    out: list[QAExample] = []
    for a, article in enumerate(data["data"]):
        try:
            for paragraph in article["paragraphs"]:
                context = _text(paragraph["context"], "a paragraph's context", path, a)
                for qa in paragraph["qas"]:
                    if not isinstance(qa["id"], (str, int)) or isinstance(qa["id"], bool):
                        raise DataError(f"{path}: article {a} has a question whose id is {json.dumps(qa['id'])[:40]}; "
                                        "give each question a string id")
                    guid = str(qa["id"])
                    question = _text(qa["question"], f"the question of id {guid!r}", path, a)
                    if not question.strip():
                        raise DataError(f"{path}: article {a}: the question of id {guid!r} is empty; write the question "
                                        "or remove it")
                    answers = tuple({"text": _text(x["text"], f"an answer's text to question {guid!r}", path, a),
                                     "answer_start": int(x["answer_start"])} for x in qa.get("answers", []))
                    if not answers or qa.get("is_impossible"):
                        # SQuAD 2.0's unanswerable questions: v1.1 training would take them for a
                        # misplaced answer and its scorer has no gold text to compare with
                        raise DataError(f"{path}: question {guid!r} has no answer; bertpipe fine-tunes SQuAD v1.1, "
                                        "where every question has one (remove SQuAD 2.0's unanswerable questions)")
                    out.append(QAExample(guid, question, context, answers, article.get("title", "")))
        except DataError:
            raise
        except (KeyError, TypeError, ValueError, OverflowError) as err:  # Overflow: an answer_start of Infinity
            raise DataError(f"{path}: article {a} is malformed (missing or wrong field: {err}); expected SQuAD v1.1 layout") from None
    seen: set[str] = set()
    for ex in out:  # predictions and scores are keyed by id: a repeated one scored one question's answer twice
        if ex.guid in seen:
            raise DataError(f"{path}: question id {ex.guid!r} is used more than once; give each question its own id")
        seen.add(ex.guid)
    return out


# ---- the official v1.1 scorer ----------------------------------------------------------------------

def normalize_answer(s: str) -> str:
    """Exactly the official v1.1 normalisation, in its order: lower, punctuation, articles, whitespace."""
    s = s.lower()
    exclude = set(string.punctuation)
    s = "".join(ch for ch in s if ch not in exclude)
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def f1_score(prediction: str, ground_truth: str) -> float:
    pred = normalize_answer(prediction).split()
    gold = normalize_answer(ground_truth).split()
    common = collections.Counter(pred) & collections.Counter(gold)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(gold)
    return 2 * precision * recall / (precision + recall)


def exact_match_score(prediction: str, ground_truth: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(ground_truth))


def evaluate(examples: Iterable[QAExample], predictions: dict[str, str]) -> dict[str, float]:
    """{'exact_match', 'f1'} in percent; an unanswered question scores 0 (as the official script)."""
    em = f1 = 0.0
    total = missing = 0
    for ex in examples:
        total += 1
        if ex.guid not in predictions:
            missing += 1
            continue
        golds = [a["text"] for a in ex.answers]
        pred = predictions[ex.guid]
        em += max(exact_match_score(pred, g) for g in golds)
        f1 += max(f1_score(pred, g) for g in golds)
    if missing:
        logger.warning("%d question(s) had no prediction and score 0", missing)
    return {"exact_match": 100.0 * em / max(total, 1), "f1": 100.0 * f1 / max(total, 1)}


# ---- features ---------------------------------------------------------------------------------------

@dataclass
class QAFeature:
    example_index: int
    input_ids: list[int]
    token_type_ids: list[int]
    # per position: (char start, char end) in the context for context tokens, None elsewhere
    offsets: list[tuple[int, int] | None]
    max_context: list[bool]
    start_position: int = 0  # training target; 0 ([CLS]) when the answer is not in this window
    end_position: int = 0


def _stride(max_doc: int, doc_stride: int | None) -> int:
    """The step between window starts. Unset: the paper's 128 where a window holds more than twice
    that (seq 384), else half a window, so that windows overlap and an answer across one window's
    edge lies whole in the next. A stride as long as the window leaves such answers in none."""
    return doc_stride if doc_stride is not None else max(1, min(128, max_doc // 2))


def _windows(n: int, max_doc: int, stride: int) -> list[tuple[int, int]]:
    spans, start = [], 0
    while True:
        length = min(n - start, max_doc)
        spans.append((start, length))
        if start + length >= n:
            return spans
        start += min(length, stride)


def _max_context_windows(spans: Sequence[tuple[int, int]], n: int) -> list[int]:
    """For each of the `n` document tokens, the window that gives it the most context: the largest
    min(left, right) plus 0.01 x the window's length (ties: the first). Each window scores only its own
    tokens, so a long document costs its tokens times the windows' overlap, not tokens times windows."""
    best_score, best = [-1.0] * n, [-1] * n
    for i, (start, length) in enumerate(spans):
        end = start + length - 1
        for pos in range(start, end + 1):
            score = min(pos - start, end - pos) + 0.01 * length
            if score > best_score[pos]:
                best_score[pos], best[pos] = score, i
    return best


def _answer_tokens(offsets: Sequence[tuple[int, int]], start_char: int, end_char: int) -> tuple[int, int] | None:
    start = next((i for i, (_, e) in enumerate(offsets) if e > start_char), None)
    end = next((i for i in range(len(offsets) - 1, -1, -1) if offsets[i][0] < end_char), None)
    if start is None or end is None or end < start:
        return None
    return start, end


def build_features(
    examples: Sequence[QAExample],
    tokenizer,
    *,
    max_seq_len: int,
    doc_stride: int | None,
    max_query_length: int,
    training: bool,
) -> tuple[list[QAFeature], list[str]]:
    """(features, ids of the training examples skipped because their answer is not at answer_start)."""
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    questions = tokenizer.encode_batch([ex.question for ex in examples], add_special_tokens=False)
    contexts = tokenizer.encode_batch([ex.context for ex in examples], add_special_tokens=False)
    features: list[QAFeature] = []
    skipped: list[str] = []
    apart = 0
    for index, (ex, q_enc, c_enc) in enumerate(zip(examples, questions, contexts)):
        q_ids = q_enc.ids[:max_query_length]
        doc_ids, doc_offsets = c_enc.ids, c_enc.offsets
        max_doc = max_seq_len - len(q_ids) - 3
        if max_doc < 1:
            raise DataError(f"max_seq_len {max_seq_len} leaves no room for the context after a {len(q_ids)}-token question; raise --max-seq-len or lower --max-query-length")
        apart += doc_stride is not None and doc_stride >= max_doc and len(doc_ids) > max_doc
        answer = None
        if training:
            a = ex.answers[0] if ex.answers else None
            if a is not None:
                s = a["answer_start"]
                e = s + len(a["text"])
                if ex.context[s:e] == a["text"]:
                    answer = _answer_tokens(doc_offsets, s, e)
            if answer is None:
                skipped.append(ex.guid)
                continue
        spans = _windows(len(doc_ids), max_doc, _stride(max_doc, doc_stride))
        best_window = _max_context_windows(spans, len(doc_ids))
        for w, (start, length) in enumerate(spans):
            head = [cls_id] + q_ids + [sep_id]
            ids = head + doc_ids[start : start + length] + [sep_id]
            types = [0] * len(head) + [1] * (length + 1)
            offsets: list[tuple[int, int] | None] = [None] * len(head)
            offsets += [tuple(doc_offsets[i]) for i in range(start, start + length)] + [None]
            max_ctx = [False] * len(head) + [best_window[start + i] == w for i in range(length)] + [False]
            feat = QAFeature(index, ids, types, offsets, max_ctx)
            if answer is not None:
                a_start, a_end = answer
                if start <= a_start and a_end < start + length:
                    feat.start_position = a_start - start + len(head)
                    feat.end_position = a_end - start + len(head)
            features.append(feat)
    if apart:
        logger.warning("squad: --doc-stride %d is not shorter than the context part of a window at --max-seq-len %d for "
                       "%d question(s): their windows do not overlap, and an answer across a window's edge is in none; "
                       "lower --doc-stride or leave it unset", doc_stride, max_seq_len, apart)
    return features, skipped


# ---- post-processing ---------------------------------------------------------------------------------

def postprocess(
    examples: Sequence[QAExample],
    features: Sequence[QAFeature],
    start_logits: Sequence[np.ndarray],
    end_logits: Sequence[np.ndarray],
    *,
    n_best: int = 20,
    max_answer_length: int = 30,
) -> tuple[dict[str, str], dict[str, list[dict]]]:
    """(best answer per question id, n-best list per id with text, start/end logit and probability)."""
    by_example: dict[int, list[int]] = collections.defaultdict(list)
    for i, feat in enumerate(features):
        by_example[feat.example_index].append(i)
    best: dict[str, str] = {}
    nbest: dict[str, list[dict]] = {}
    for ex_index, ex in enumerate(examples):
        candidates = []
        for fi in by_example.get(ex_index, []):
            feat, s_log, e_log = features[fi], start_logits[fi], end_logits[fi]
            n = len(feat.input_ids)
            starts = np.argsort(s_log[:n])[::-1][:n_best]
            ends = np.argsort(e_log[:n])[::-1][:n_best]
            for s in starts:
                if feat.offsets[s] is None or not feat.max_context[s]:
                    continue
                for e in ends:
                    if feat.offsets[e] is None or e < s or e - s + 1 > max_answer_length:
                        continue
                    char_s, char_e = feat.offsets[s][0], feat.offsets[e][1]
                    candidates.append((float(s_log[s] + e_log[e]), float(s_log[s]), float(e_log[e]), char_s, char_e))
        candidates.sort(key=lambda c: c[0], reverse=True)
        seen, entries = set(), []
        for score, s_logit, e_logit, cs, ce in candidates:
            text = ex.context[cs:ce]
            if text in seen:
                continue
            seen.add(text)
            entries.append({"text": text, "start_logit": s_logit, "end_logit": e_logit, "score": score})
            if len(entries) >= n_best:
                break
        if not entries:
            entries = [{"text": "", "start_logit": 0.0, "end_logit": 0.0, "score": 0.0}]
        top = max(e["score"] for e in entries)
        weights = [math.exp(e["score"] - top) for e in entries]
        total = sum(weights)
        for entry, w in zip(entries, weights):
            entry["probability"] = w / total
            del entry["score"]
        best[ex.guid] = entries[0]["text"]
        nbest[ex.guid] = entries
    return best, nbest
