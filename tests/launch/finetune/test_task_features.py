"""Features: pair truncation, first-sub-token NER labels, SQuAD windows and n-best decoding."""

from __future__ import annotations

import json

import numpy as np
import pytest

from launch.finetune import squad
from launch.finetune.examples import ChoiceExample, DataError, QAExample, TaggedExample, TextExample, in_documents
from launch.finetune.encoding import IGNORE, choice_features, collate, tag_features, text_features
from launch.finetune.glue import GLUE_TASKS, read_split

from repo_paths import DATA


def test_text_pair_truncation_and_collate(tokenizer, caplog):
    long_a = " ".join(["alpha"] * 40)
    examples = [TextExample("0", long_a, "beta gamma", "1"), TextExample("1", "short one", None, "0")]
    with caplog.at_level("INFO", logger="launch.finetune.encoding"):
        feats = text_features(examples, tokenizer, max_seq_len=16, label_ids={"0": 0, "1": 1})
    assert "1 of 2 texts cut to --max-seq-len 16 tokens" in caplog.text
    assert len(feats[0].input_ids) == 16  # longest-first cuts the long sentence, keeps the pair
    assert tokenizer.decode(feats[0].input_ids[-4:-1]) == "beta gamma"
    assert feats[0].token_type_ids[-1] == 1 and feats[1].token_type_ids == [0] * 4
    batch = collate(feats)
    assert batch["input_ids"].shape == (2, 16)
    assert batch["attention_mask"][1].tolist() == [1] * 4 + [0] * 12
    assert batch["labels"].tolist() == [1, 0]
    # tokenizer state is restored: later encodes are not truncated
    assert len(tokenizer.encode(long_a).ids) == 42


def _reference_cut(tokens_a: list, tokens_b: list, max_length: int) -> None:
    """google-research/bert run_classifier.py's _truncate_seq_pair, as written there."""
    while True:
        total_length = len(tokens_a) + len(tokens_b)
        if total_length <= max_length:
            break
        if len(tokens_a) > len(tokens_b):
            tokens_a.pop()
        else:
            tokens_b.pop()


def test_pairs_are_cut_as_the_bert_reference_cuts_them(tokenizer):
    # a tie with an odd budget: the reference cuts B first; HF tokenizers' longest_first cut A
    (feat,) = text_features([TextExample("t", "a b c d e f g h i j", "k l m n o p q r s t", None)], tokenizer,
                            max_seq_len=16, label_ids=None)
    assert tokenizer.decode(feat.input_ids) == "a b c d e f g k l m n o p"
    assert feat.token_type_ids == [0] * 9 + [1] * 7
    # every real MRPC and STS-B dev pair at a length that cuts most of them
    for task in ("mrpc", "stsb"):
        examples = read_split(GLUE_TASKS[task], DATA / "glue", "dev")
        feats = text_features(examples, tokenizer, max_seq_len=16, label_ids=None)
        for ex, feat in zip(examples, feats):
            a = tokenizer.encode(ex.text_a, add_special_tokens=False).ids
            b = tokenizer.encode(ex.text_b, add_special_tokens=False).ids
            _reference_cut(a, b, 16 - 3)
            cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
            assert feat.input_ids == [cls, *a, sep, *b, sep], ex.guid
            assert feat.token_type_ids == [0] * (len(a) + 2) + [1] * (len(b) + 1)


def test_ner_labels_first_subtoken_and_chunks(tokenizer):
    ex = TaggedExample("s", ("Blackburn", "visited", "Gethsemane"), ("B-PER", "O", "B-LOC"), "d1")
    ids = {"O": 0, "B-PER": 1, "B-LOC": 2}
    (feat,) = tag_features([ex], tokenizer, max_seq_len=32, label_ids=ids)
    pieces = [tokenizer.id_to_token(i) for i in feat.input_ids]
    assert pieces[0] == "[CLS]" and pieces[-1] == "[SEP]"
    assert pieces[1:-1] == ["blackburn", "visited", "get", "##hs", "##eman", "##e"]
    assert feat.label == [IGNORE, 1, 0, 2, IGNORE, IGNORE, IGNORE, IGNORE]
    assert feat.word_index == [0, 1, 2]
    # a window too small for the sentence: split into whole-word chunks, every word still predicted
    chunks = tag_features([ex], tokenizer, max_seq_len=6, label_ids=ids)
    assert [c.word_index for c in chunks] == [[0, 1], [2]]
    assert all(len(c.input_ids) <= 6 for c in chunks)


def test_ner_a_word_longer_than_the_window_keeps_its_first_pieces(tokenizer):
    # One word of more word pieces than the window holds (a URL, a chemical name) must not overflow it:
    # a feature longer than --max-seq-len fails on the position embeddings.
    ex = TaggedExample("1", ("Hi", "antidisestablishmentarianism", "there"), ("O", "B-MISC", "O"))
    assert len(tokenizer.encode("antidisestablishmentarianism", add_special_tokens=False).ids) > 3
    feats = tag_features([ex], tokenizer, max_seq_len=5, label_ids={"O": 0, "B-MISC": 1})
    assert all(len(f.input_ids) <= 5 for f in feats), [len(f.input_ids) for f in feats]
    assert [f.word_index for f in feats] == [[0], [1], [2]]  # every word still predicted


def test_ner_document_context_is_unlabelled(tokenizer):
    doc = in_documents([TaggedExample(str(i), (w,), ("O",), "d") for i, w in enumerate(["before", "target", "after"])])
    feats = tag_features(doc, tokenizer, max_seq_len=16, label_ids={"O": 0}, doc_context=True)
    mid = feats[1]
    assert [tokenizer.id_to_token(i) for i in mid.input_ids] == ["[CLS]", "before", "target", "after", "[SEP]"]
    assert mid.label == [IGNORE, IGNORE, 0, IGNORE, IGNORE]


def test_ner_document_context_stops_at_a_sentence_that_does_not_fit(tokenizer):
    # the sentence after the target is too long for the window: the right side stops there rather
    # than reaching past it to "far", which would sit beside the target as if it were its neighbour
    words = [("before",), ("target",), ("big",) * 12, ("far",)]
    doc = in_documents([TaggedExample(str(i), w, ("O",) * len(w), "d") for i, w in enumerate(words)])
    mid = tag_features(doc, tokenizer, max_seq_len=8, label_ids={"O": 0}, doc_context=True)[1]
    assert [tokenizer.id_to_token(i) for i in mid.input_ids] == ["[CLS]", "before", "target", "[SEP]"]


def test_ner_document_context_in_a_subset_is_the_files_neighbours(tokenizer):
    # --max-train-samples keeps sentences 0 and 2 of a document: sentence 2's context was sentence 0, which was
    # never beside it; it is sentence 1 (not in the subset, still the text around it)
    doc = in_documents([TaggedExample(str(i), (w,), ("O",), "d") for i, w in enumerate(["alpha", "beta", "gamma"])]
                       + [TaggedExample("x", ("other",), ("O",), "e")])
    subset = [doc[0], doc[2], doc[3]]
    feats = tag_features(subset, tokenizer, max_seq_len=16, label_ids={"O": 0}, doc_context=True)
    pieces = [[tokenizer.id_to_token(i) for i in f.input_ids[1:-1]] for f in feats]
    assert pieces == [["alpha", "beta", "gamma"], ["alpha", "beta", "gamma"], ["other"]]
    assert feats[1].label[1:-1] == [IGNORE, IGNORE, 0]


def test_ner_document_context_of_a_chunk_is_its_own_sentence_first(tokenizer):
    # a sentence cut into chunks: the second chunk's left context is the end of the first, not the sentence
    # before (which came before the whole first chunk)
    words = [("before",), tuple(f"w{k}" for k in range(10)), ("after",)]
    doc = in_documents([TaggedExample(str(i), w, ("O",) * len(w), "d") for i, w in enumerate(words)])
    budget = len(tokenizer.encode("w0", add_special_tokens=False).ids)
    feats = tag_features(doc, tokenizer, max_seq_len=2 + 6 * budget, label_ids={"O": 0}, doc_context=True)
    chunks = [f for f in feats if f.example_index == 1]
    assert [c.word_index for c in chunks] == [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9]]
    text = tokenizer.decode(chunks[1].input_ids[1:-1])
    assert text.replace(" ", "").startswith("w5w6") and text.replace(" ", "").endswith("w9after"), text


def test_choice_features_shape(tokenizer):
    ex = ChoiceExample("1", "A man is standing on a ladder.", "He", ("swims.", "climbs the roof.", "sings.", "naps."), 1)
    (feat,) = choice_features([ex], tokenizer, max_seq_len=32)
    assert len(feat.input_ids) == 4
    assert tokenizer.decode(feat.input_ids[1]).endswith("he climbs the roof.")
    batch = collate([feat, feat])
    assert batch["input_ids"].shape[:2] == (2, 4) and batch["labels"].tolist() == [1, 1]


def test_squad_windows_cover_the_context_with_stride(tokenizer):
    examples = squad.read_squad(DATA / "squad" / "dev-v1.1-subset.json")[:40]
    feats, skipped = squad.build_features(examples, tokenizer, max_seq_len=64, doc_stride=16, max_query_length=12,
                                          training=True)
    assert skipped == []
    assert all(len(f.input_ids) <= 64 for f in feats)
    assert len(feats) > len(examples)  # contexts are longer than one window
    # every training answer lies in at least one window, marked with token positions inside the context part
    found = {f.example_index for f in feats if f.start_position > 0}
    assert found == set(range(len(examples)))
    # each context token is "max context" in exactly one window
    first = [f for f in feats if f.example_index == 0]
    owners = {}
    for f in first:
        for off, best in zip(f.offsets, f.max_context):
            if off is not None and best:
                assert off not in owners
                owners[off] = True
    assert len(owners) == len(tokenizer.encode(examples[0].context, add_special_tokens=False).ids)


def _max_context_by_definition(spans, cur, pos):
    """BERT's `_check_is_max_context`, checking every window for each token (quadratic in a long document)."""
    best_score, best = None, None
    for i, (start, length) in enumerate(spans):
        end = start + length - 1
        if start <= pos <= end:
            score = min(pos - start, end - pos) + 0.01 * length
            if best_score is None or score > best_score:
                best_score, best = score, i
    return cur == best


@pytest.mark.parametrize("n, max_doc, stride", [(1, 5, 2), (50, 10, 3), (50, 10, 10), (97, 20, 7), (64, 64, 16),
                                                 (300, 31, 1)])
def test_squad_max_context_window_is_the_reference_s(n, max_doc, stride):
    spans = squad._windows(n, max_doc, stride)
    best = squad._max_context_windows(spans, n)
    for w, (start, length) in enumerate(spans):
        for pos in range(start, start + length):
            assert (best[pos] == w) == _max_context_by_definition(spans, w, pos), (w, pos)


def test_squad_question_is_cut_to_max_query_length(tokenizer):
    # A long question takes at most --max-query-length tokens, leaving the rest of the window to the context.
    question = "what is the name of the very long question that goes on and on here"
    assert len(tokenizer.encode(question, add_special_tokens=False).ids) > 4
    ex = QAExample("q1", question, "The fox is red. " * 20, ({"text": "fox", "answer_start": 4},))
    feats, _ = squad.build_features([ex], tokenizer, max_seq_len=64, doc_stride=16, max_query_length=4, training=True)
    sep = tokenizer.token_to_id("[SEP]")
    for f in feats:
        assert tokenizer.decode(f.input_ids[1:f.input_ids.index(sep)]) == "what is the name"


def test_squad_decoding_recovers_gold_answers_from_oracle_logits(tokenizer):
    """Logits peaked at the gold span must decode to the gold text and score EM 100 (windows, offsets, n-best)."""
    examples = squad.read_squad(DATA / "squad" / "dev-v1.1-subset.json")
    feats, _ = squad.build_features(examples, tokenizer, max_seq_len=96, doc_stride=32, max_query_length=24,
                                    training=True)
    starts, ends = [], []
    for f in feats:
        s, e = np.zeros(len(f.input_ids)), np.zeros(len(f.input_ids))
        if f.start_position > 0:
            s[f.start_position] = e[f.end_position] = 10.0
        starts.append(s)
        ends.append(e)
    eval_feats, _ = squad.build_features(examples, tokenizer, max_seq_len=96, doc_stride=32, max_query_length=24,
                                         training=False)
    assert [f.input_ids for f in eval_feats] == [f.input_ids for f in feats]
    best, nbest = squad.postprocess(examples, eval_feats, starts, ends, n_best=5, max_answer_length=64)
    scores = squad.evaluate(examples, best)
    assert scores["exact_match"] == pytest.approx(100.0)
    assert nbest[examples[0].guid][0]["probability"] > 0.5


def test_squad_default_stride_overlaps_windows_so_every_answer_lies_in_one(tokenizer, caplog):
    """At seq 128 a stride of 128 is the whole window: windows only touch, and answers across an edge
    are in none. Unset, the stride is half a window there (128, the paper's, at seq 384)."""
    examples = squad.read_squad(DATA / "squad" / "dev-v1.1-subset.json")

    def unreachable(**kw):
        feats, _ = squad.build_features(examples, tokenizer, max_seq_len=128, max_query_length=64, training=True, **kw)
        return len(examples) - len({f.example_index for f in feats if f.start_position > 0})

    with caplog.at_level("WARNING"):
        assert unreachable(doc_stride=128) > 0
    assert "windows do not overlap" in caplog.text
    caplog.clear()
    assert unreachable(doc_stride=None) == 0
    assert "overlap" not in caplog.text
    assert squad._stride(317, None) == 128 and squad._stride(100, None) == 50 and squad._stride(100, 70) == 70


def test_squad_v2_unanswerable_question_is_refused_by_name(tmp_path):
    path = tmp_path / "dev-v2.0.json"
    qas = [{"id": "q1", "question": "Where?", "answers": [{"text": "Paris", "answer_start": 0}]},
           {"id": "q2", "question": "Who?", "answers": [], "is_impossible": True}]
    path.write_text(json.dumps({"data": [{"title": "t", "paragraphs": [{"context": "Paris is big.", "qas": qas}]}]}))
    with pytest.raises(DataError, match=r"dev-v2.0.json: question 'q2' has no answer; .*SQuAD v1.1"):
        squad.read_squad(path)
    qas[1] = {"id": "q3", "question": "Who?", "answers": [{"text": "x", "answer_start": "seven"}]}
    path.write_text(json.dumps({"data": [{"title": "t", "paragraphs": [{"context": "Paris is big.", "qas": qas}]}]}))
    with pytest.raises(DataError, match=r"dev-v2.0.json: article 0 is malformed .*'seven'"):
        squad.read_squad(path)
    path.write_bytes(b'{"data": [], "t": "caf\xe9"}')
    with pytest.raises(DataError, match=r"dev-v2.0.json: not UTF-8"):
        squad.read_squad(path)
