"""Readers on the real bundled data (GLUE, CoNLL-2003, SQuAD) and on hand-written official-layout fixtures."""

from __future__ import annotations

import json
import re

import pytest

from launch.finetune import conll, glue, squad, swag, userdata
from launch.finetune.finetune_config import FinetuneConfig
from launch.finetune.examples import DataError, SkipCounter
from launch.finetune.tasks import get_task

from repo_paths import DATA, FIXTURES as _FIXTURES, GLUE
FIXTURES = _FIXTURES / "downstream"


def load(task: str, data_dir, **cfg):
    return get_task(task).load(data_dir, FinetuneConfig(task=task, **cfg))


@pytest.mark.parametrize(
    "task, n_train, n_dev, labels, first_dev",
    [
        ("sst2", 6920, 872, ("0", "1"), ("one long string of cliches .", None, "0")),
        ("mrpc", 1000, 408, ("0", "1"), None),
        ("rte", 600, 277, ("entailment", "not_entailment"), None),
        ("cola", 8551, 527, ("0", "1"), ("The sailors rode the breeze clear of the rocks.", None, "1")),
        ("stsb", 1500, 1500, None, ("A man with a hard hat is dancing.", "A man wearing a hard hat is dancing.", 5.0)),
    ],
)
def test_glue_real_data(task, n_train, n_dev, labels, first_dev):
    data = load(task, GLUE)
    assert len(data.train) == n_train
    (dev,) = data.evals
    assert dev.labelled and len(dev.examples) == n_dev
    assert data.labels == labels
    if first_dev:
        ex = dev.examples[0]
        assert (ex.text_a, ex.text_b, ex.label) == first_dev
    if labels:
        assert {ex.label for ex in data.train} == set(labels)
    if task in ("mrpc", "rte", "stsb"):
        assert all(ex.text_b for ex in data.train)


def test_mrpc_columns_by_header():
    ex = load("mrpc", GLUE).evals[0].examples[0]
    assert ex.text_a.startswith("Detectives told Deasean's father") and ex.label == "1"
    assert ex.text_b.startswith("Shortly after his arrest, detective")


def test_mnli_matched_mismatched_and_tests():
    data = load("mnli", FIXTURES)
    assert len(data.train) == 10 and data.labels == ("contradiction", "entailment", "neutral")
    names = [(s.name, s.labelled, s.prefix, s.submission) for s in data.evals]
    assert names == [
        ("dev_matched", True, "", None), ("dev_mismatched", True, "mismatched_", None),
        ("test_matched.tsv", False, "", "MNLI-m.tsv"), ("test_mismatched.tsv", False, "", "MNLI-mm.tsv"),
        ("diagnostic.tsv", False, "", "AX.tsv"),  # GLUE's diagnostic set, in diagnostic/ beside MNLI/
    ]
    assert [ex.guid for ex in data.evals[4].examples] == ["0", "1", "2"]
    assert data.evals[0].examples[1].label == "contradiction"  # dev: gold_label is the last of 16 columns
    assert data.evals[2].examples[0].guid == "0" and data.evals[2].examples[0].label is None


def test_qnli_and_qqp_fixtures():
    qnli = load("qnli", FIXTURES)
    assert len(qnli.train) == 6 and qnli.train[2].label == "entailment"
    assert qnli.train[0].text_a == "When did the third Digimon series begin?"
    assert [s.name for s in qnli.evals] == ["dev", "test.tsv"]
    qqp = load("qqp", FIXTURES)
    assert [ex.label for ex in qqp.train] == ["0", "1", "0", "1", "0", "0", "1", "1"]
    test = qqp.evals[1]
    assert test.submission == "QQP.tsv" and test.examples[1].text_b == "How do you control your horniness?"


def test_swag_fixture_layout():
    train = swag.read_swag(FIXTURES / "SWAG" / "train.csv", labelled=True)
    assert len(train) == 6
    ex = train[1]
    assert ex.guid == "3417" and ex.label == 3 and ex.start == "Members of the procession"
    assert ex.endings[3] == "continue to play marching, interspersed."  # quoted CSV field with a comma
    test = swag.read_swag(FIXTURES / "SWAG" / "test.csv", labelled=False)
    assert [e.label for e in test] == [None, None, None]


def test_conll_real_data():
    path = conll.find_file(DATA, "train", required=True)
    sents = conll.read_conll(path)
    assert sents[0].words == ("EU", "rejects", "German", "call", "to", "boycott", "British", "lamb", ".")
    assert sents[0].tags == ("B-ORG", "O", "B-MISC", "O", "O", "O", "B-MISC", "O", "O")
    assert sents[1].words == ("Peter", "Blackburn") and sents[1].doc_id == sents[0].doc_id
    docs = {s.doc_id for s in sents}
    assert len(docs) > 10
    dev = conll.read_conll(conll.find_file(DATA, "dev", required=True))
    assert len(dev) > 500 and all(len(s.words) == len(s.tags) for s in dev)


def test_squad_subset():
    examples = squad.read_squad(squad.find_file(DATA, "dev", required=True))
    assert len(examples) == 705
    first = examples[0]
    assert first.question == "In what country is Normandy located?" and first.answers[0]["text"] == "France"
    for ex in examples:
        for a in ex.answers:
            assert ex.context[a["answer_start"]: a["answer_start"] + len(a["text"])] == a["text"]


def test_a_squad_file_saved_with_a_byte_order_mark_reads(tmp_path):
    # json.load refused it ("Unexpected UTF-8 BOM"), where every other reader drops the mark
    path = tmp_path / "dev-v1.1.json"
    path.write_bytes("\ufeff".encode() + squad.find_file(DATA, "dev", required=True).read_bytes())
    assert len(squad.read_squad(path)) == 705


@pytest.mark.parametrize("edit, said", [
    (lambda p, q: p.update(context=None), "a paragraph's context is null, not a string"),
    (lambda p, q: q.update(question=7), "the question of id '56ddde6b9a695914005b9628' is 7, not a string"),
    (lambda p, q: q["answers"][0].update(text=None), "an answer's text to question '56ddde6b9a695914005b9628' is null"),
    (lambda p, q: q.update(id=["a"]), 'a question whose id is ["a"]; give each question a string id'),
])
def test_a_squad_field_of_the_wrong_type_is_named_before_training(tmp_path, edit, said):
    # Each was a traceback: the tokenizer's TypeError, len() of an int, an unhashable id, and a null dev answer
    # only in the scorer, after the whole training run.
    data = json.loads(squad.find_file(DATA, "dev", required=True).read_text(encoding="utf-8"))
    paragraph = data["data"][0]["paragraphs"][0]
    edit(paragraph, paragraph["qas"][0])
    path = tmp_path / "dev-v1.1.json"
    path.write_text(json.dumps(data))
    with pytest.raises(DataError, match=re.escape(f"{path}: article 0") + ".*" + re.escape(said)):
        squad.read_squad(path)


def test_user_csv_multiclass_from_real_cola_sources(tmp_path):
    """classify: labels are whatever the data holds (here the CoLA source a sentence was taken from)."""
    import csv

    rows = [line.rstrip("\n").split("\t") for line in open(GLUE / "CoLA" / "train.tsv", encoding="utf-8")]
    by_source = {src: [r for r in rows if r[0] == src] for src in ("ks08", "l-93", "r-67")}
    for name, lo, hi in (("train", 0, 100), ("dev", 100, 133)):
        with open(tmp_path / f"{name}.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["sentence", "source"])
            w.writerows([r[3], r[0]] for src_rows in by_source.values() for r in src_rows[lo:hi])
    data = load("classify", tmp_path, text_column="sentence", label_column="source")
    assert data.labels == ("ks08", "l-93", "r-67")
    assert len(data.train) == 300 and len(data.evals[0].examples) == 99


# ---- bad input: a clear error naming the file and line, or a counted skip when asked ------------------


def test_malformed_line_reports_file_and_line():
    spec = glue.GLUE_TASKS["sst2"]
    with pytest.raises(DataError, match=r"SST-2/train.tsv:4: expected 2 tab-separated fields, got 1"):
        glue.read_split(spec, FIXTURES / "broken" / "sst2_malformed", "train")
    kept = glue.read_split(spec, FIXTURES / "broken" / "sst2_malformed", "train", skip_malformed=True)
    assert [ex.text_a for ex in kept] == ["a gripping , funny film .", "a dull , lifeless mess .", "an utterly charming comedy ."]


def test_a_test_file_without_its_id_column_is_refused(tmp_path):
    # Its rows got the ids test-2, test-3, ... in submission/SST-2.tsv, which the GLUE server rejects.
    (tmp_path / "test.tsv").write_text("sentence\nfine .\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"test.tsv has no 'index' column, by which the GLUE server matches"):
        glue.read_glue_file(glue.GLUE_TASKS["sst2"], tmp_path / "test.tsv", labelled=False, skips=SkipCounter())


def test_a_malformed_test_line_is_refused_even_when_skipping(tmp_path):
    # The GLUE server takes a submission only with a prediction for every test line: one skipped line
    # would shift every later prediction's index.
    (tmp_path / "test.tsv").write_text("index\tsentence\n0\tfine .\n1\tbad\textra\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"test.tsv: 1 malformed line\(s\), e.g. .*the GLUE server takes"):
        glue.read_split(glue.GLUE_TASKS["sst2"], tmp_path, "test.tsv", skip_malformed=True)


def test_unknown_label_and_missing_split():
    with pytest.raises(DataError, match=r"RTE/train.tsv:3: unknown label 'maybe'"):
        load("rte", FIXTURES / "broken" / "rte_unknown_label")
    with pytest.raises(DataError, match=r"dev.tsv, which does not exist"):
        load("sst2", FIXTURES / "broken" / "sst2_missing_dev")
    with pytest.raises(DataError, match=r"missing the train split"):
        load("classify", FIXTURES / "broken")
    with pytest.raises(DataError, match=r"missing the dev split"):
        load("classify", FIXTURES / "SWAG")


def test_user_jsonl_bad_line_and_unknown_dev_label():
    bad = FIXTURES / "broken" / "classify_bad_jsonl"
    with pytest.raises(DataError, match=r"train.jsonl:3: not valid JSON"):
        load("classify", bad)
    with pytest.raises(DataError, match=r"dev.jsonl:2: unknown label 'neutral'"):
        load("classify", bad, skip_malformed=True)


def test_conll_and_swag_bad_lines():
    with pytest.raises(DataError, match=r"train.txt:6: expected 4 space-separated fields"):
        conll.read_conll(FIXTURES / "broken" / "conll_bad" / "train.txt")
    skips = SkipCounter(allow=True)
    assert conll.read_conll(FIXTURES / "broken" / "conll_bad" / "train.txt", skips=skips) == []
    assert skips.count == 1
    with pytest.raises(DataError, match=r"train.csv:3: unknown label '7'"):
        swag.read_swag(FIXTURES / "broken" / "swag_bad_label" / "train.csv", labelled=True)


def test_user_regress_needs_numbers(tmp_path):
    (tmp_path / "train.tsv").write_text("text\tscore\nfine\t1.5\nbad\tnot-a-number\n")
    (tmp_path / "dev.tsv").write_text("text\tscore\nok\t2\nmeh\t1\n")
    with pytest.raises(DataError, match=r"train.tsv:3: label 'not-a-number' is not a finite number"):
        load("regress", tmp_path, label_column="score")
    rows = userdata.read_text_split(tmp_path / "dev.tsv", userdata.Columns(label="score"), labelled=True,
                                    regression=True, skips=SkipCounter())
    assert rows[0][1].label == 2.0


@pytest.mark.parametrize("json_value, raw", [("NaN", "nan"), ("Infinity", "inf"), ("-Infinity", "-Infinity"),
                                             ('"nan"', "NaN")])
def test_a_score_that_is_not_finite_is_malformed_not_read(tmp_path, json_value, raw):
    # float() reads these; one of them made the training loss and every dev correlation NaN, without a word
    (tmp_path / "train.jsonl").write_text(f'{{"text": "fine", "score": 1.5}}\n{{"text": "odd", "score": {json_value}}}\n'
                                          '{"text": "good", "score": 3}\n')
    (tmp_path / "dev.jsonl").write_text('{"text": "ok", "score": 2}\n{"text": "meh", "score": 1}\n')
    said = "label .* is not a finite number" if json_value.startswith('"') else f"holds {json_value}, which is not JSON"
    with pytest.raises(DataError, match=rf"train.jsonl:2: {said}"):
        load("regress", tmp_path, label_column="score")
    assert [ex.label for ex in load("regress", tmp_path, label_column="score", skip_malformed=True).train] == [1.5, 3.0]
    sts = tmp_path / "STS-B"
    sts.mkdir()
    head = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    (sts / "train.tsv").write_text(head + f"0\tg\tf\ty\t0\ts\ts\tA man.\tA man.\t{raw}\n"
                                   + "1\tg\tf\ty\t1\ts\ts\tA dog.\tA cat.\t1.0\n")
    with pytest.raises(DataError, match=r"train.tsv:2: score .* is not a finite number"):
        glue.read_glue_file(glue.GLUE_TASKS["stsb"], sts / "train.tsv", labelled=True, skips=SkipCounter())


def test_a_byte_order_mark_does_not_make_docstart_a_sentence(tmp_path):
    conll_file = tmp_path / "train.txt"
    conll_file.write_text("-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n", encoding="utf-8-sig")
    examples = conll.read_conll(conll_file)
    assert [ex.words for ex in examples] == [("EU", "rejects")]


def test_a_skipped_conll_line_leaves_out_its_whole_sentence(tmp_path, caplog):
    # It dropped only the line: "EU rejects call" was kept, another sentence labelled as if it were this one.
    path = tmp_path / "train.txt"
    path.write_text("EU NNP B-NP B-ORG\nrejects VBZ B-VP O\nGerman JJ B-NP\ncall NN I-NP O\n\n"
                    "Peter NNP B-NP B-PER\nBlackburn NNP I-NP I-PER\n")
    skips = SkipCounter(allow=True)
    with caplog.at_level("WARNING", logger="launch.finetune"):
        examples = conll.read_conll(path, skips=skips)
    assert [ex.words for ex in examples] == [("Peter", "Blackburn")] and skips.count == 1
    assert f"{path}: left out 1 sentence(s) with a malformed line" in caplog.text


def test_skips_are_logged_against_the_file_that_had_them(tmp_path, caplog):
    # One counter serves train and dev; a clean dev file was reported with train's skipped line.
    bad = FIXTURES / "broken" / "conll_bad" / "train.txt"
    good = tmp_path / "dev.txt"
    good.write_text("EU NNP B-NP B-ORG\n")
    skips = SkipCounter(allow=True)
    with caplog.at_level("WARNING"):
        conll.read_conll(bad, skips=skips)
        conll.read_conll(good, skips=skips)
    warned = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith(f"{bad}: skipped 1 ") and skips.count == 1


def test_user_tsv_stray_quote_is_text_and_csv_one_names_its_first_line(tmp_path, caplog):
    rows = [f"review {i}\t{i % 2}" for i in range(100)]
    rows[2] = '"unbalanced quote starts review 2\t0'
    (tmp_path / "train.tsv").write_text("text\tlabel\n" + "\n".join(rows) + "\n")
    (tmp_path / "dev.tsv").write_text('text\tlabel\n"Quoted" title and more\t1\n')
    data = load("classify", tmp_path)
    assert len(data.train) == 100 and data.train[2].text_a == '"unbalanced quote starts review 2'
    assert data.evals[0].examples[0].text_a == '"Quoted" title and more'
    # in a CSV the quote opens a field that swallows the rest of the file: stopped at the line it starts on
    csv_dir = tmp_path / "csv"
    csv_dir.mkdir()
    (csv_dir / "train.csv").write_text("text,label\n" + "\n".join(r.replace("\t", ",") for r in rows) + "\n")
    (csv_dir / "dev.csv").write_text("text,label\nok,1\n")
    with pytest.raises(DataError, match=r"train.csv:4: expected 2 fields, got 1"):
        load("classify", csv_dir)
    with caplog.at_level("WARNING"):
        data = load("classify", csv_dir, skip_malformed=True)
    assert len(data.train) == 2
    assert "train.csv: 1 record(s) run over several lines" in caplog.text and "lines 4-101" in caplog.text


@pytest.mark.parametrize("train, said, kept", [
    ('{"text": "fine", "label": "a"}\n{"text": null, "label": "b"}\n{"text": ["x", "y"], "label": "b"}\n'
     '{"text": "ok", "label": null}\n', r"train.jsonl:2: key\(s\) \['text'\] hold null, not text", ["a"]),
    # Python's json writes a missing value as NaN and reads it back: a NaN label became a third class "nan"
    # (binary F1 and MCC gone from metrics.json), and NaN text the word "nan".
    ('{"text": "good", "label": "a"}\n{"text": "bad", "label": "b"}\n{"text": "meh", "label": NaN}\n'
     '{"text": NaN, "label": "a"}\n{"text": ["a", Infinity], "label": ["O", "O"]}\n',
     r"train.jsonl:3: holds NaN, which is not JSON", ["a", "b"]),
])
def test_user_jsonl_null_nan_and_list_values_are_malformed_not_text_or_a_class(tmp_path, train, said, kept):
    (tmp_path / "train.jsonl").write_text(train)
    (tmp_path / "dev.jsonl").write_text('{"text": "fine", "label": "a"}\n')
    with pytest.raises(DataError, match=said):
        load("classify", tmp_path)
    skips = SkipCounter(allow=True)
    rows = userdata.read_text_split(tmp_path / "train.jsonl", userdata.Columns(), labelled=True, regression=False,
                                    skips=skips)
    assert [ex.label for _, ex in rows] == kept and skips.count == 3


def test_files_that_are_not_utf8_are_named(tmp_path):
    (tmp_path / "train.txt").write_bytes(b"EU NNP B-NP B-ORG\nCaf\xe9 NNP B-NP B-LOC\n")
    with pytest.raises(DataError, match=r"train.txt: not UTF-8 text \(line 2, byte 21: .*\); save it as UTF-8"):
        conll.read_conll(tmp_path / "train.txt")
    # The line of the bad byte, not the last one read before the decoder's block (8 KiB) that held it.
    (tmp_path / "train.tsv").write_bytes(b"text\tlabel\n" + b"fine\t1\n" * 3000 + b"caf\xe9\t1\n")
    with pytest.raises(DataError, match=r"train.tsv: not UTF-8 text \(line 3002, byte 21014: "):
        userdata.read_text_split(tmp_path / "train.tsv", userdata.Columns(), labelled=True, regression=False,
                                 skips=SkipCounter())
    # NUL is valid UTF-8 but no text holds it: UTF-16 without its byte-order mark reads as text with a NUL
    # after each ASCII letter, which the tokenizer would drop without a word.
    (tmp_path / "train.csv").write_bytes("text,label\nfine,1\n".encode() + "good,0\n".encode("utf-16-le"))
    with pytest.raises(DataError, match=r"train.csv: a NUL byte on line 3, .*save it as UTF-8 text"):
        userdata.read_text_split(tmp_path / "train.csv", userdata.Columns(), labelled=True, regression=False,
                                 skips=SkipCounter())
    (tmp_path / "train.txt").write_bytes(b"EU NNP B-NP B-ORG\nRome\0 NNP B-NP B-LOC\n")
    with pytest.raises(DataError, match=r"train.txt: a NUL byte on line 2, "):
        conll.read_conll(tmp_path / "train.txt")


def test_user_tag_refuses_tags_that_are_not_entity_tags(tmp_path):
    """Entity F1 over POS-style tags would score made-up chunks (gold NN NN VB vs NN VB VB: F1 0, accuracy 0.67)."""
    (tmp_path / "train.jsonl").write_text('{"text": ["dogs", "bark"], "label": ["NNS", "VBP"]}\n')
    (tmp_path / "dev.jsonl").write_text('{"text": ["cats", "sleep"], "label": ["NNS", "VBP"]}\n')
    with pytest.raises(DataError, match=r"train.jsonl: tag scores entities.*\['NNS', 'VBP'\] are not"):
        load("tag", tmp_path)
    (tmp_path / "train.jsonl").write_text('{"text": ["Ann", "Lee", "met", "Bo"], "label": ["B-PER", "E-PER", "O", "S-PER"]}\n')
    (tmp_path / "dev.jsonl").write_text('{"text": ["Bo", "sings"], "label": ["S-PER", "O"]}\n')
    assert load("tag", tmp_path).labels == ("O", "B-PER", "E-PER", "S-PER")
    (tmp_path / "train.jsonl").write_text('{"text": ["Ann", "met", "Bo"], "label": ["S-PER", null, "S-PER"]}\n')
    with pytest.raises(DataError, match=r"train.jsonl:1: key\(s\) \['label'\] hold a list with null, true/false"):
        load("tag", tmp_path)  # it was the tag 'None', refused as "not an entity tag"
    for words in ('[["Ann"], "met", "Bo"]', '[true, "met", "Bo"]'):  # were the words "['Ann']" and "True"
        (tmp_path / "train.jsonl").write_text(f'{{"text": {words}, "label": ["S-PER", "O", "S-PER"]}}\n')
        with pytest.raises(DataError, match=r"train.jsonl:1: key\(s\) \['text'\] hold a list with null, true/false"):
            load("tag", tmp_path)
    # An empty word tokenized to nothing and wrote " O I-LOC" into predictions/dev.txt (word gold predicted)
    for words in ('["", "met", "Bo"]', '["Ann Lee", "met", "Bo"]'):
        (tmp_path / "train.jsonl").write_text(f'{{"text": {words}, "label": ["S-PER", "O", "S-PER"]}}\n')
        with pytest.raises(DataError, match=r"train.jsonl:1: a word in it is empty or holds whitespace"):
            load("tag", tmp_path)
    # A tag with a space wrote four fields into such a line ("Paris B-PER X I-ORG")
    (tmp_path / "train.jsonl").write_text('{"text": ["Paris", "b"], "label": ["B-PER X", "O"]}\n')
    with pytest.raises(DataError, match=r"train.jsonl:1: a tag in it is empty or holds whitespace"):
        load("tag", tmp_path)


def test_an_empty_text_is_a_malformed_line_in_every_reader(tmp_path):
    """docs/finetune.md lists an empty text as malformed; GLUE, SWAG, a SQuAD question and a user pair column
    took one silently (trained on, and scored, a blank input)."""
    sst2 = tmp_path / "SST-2"
    sst2.mkdir()
    for split in ("train", "dev"):
        (sst2 / f"{split}.tsv").write_text("sentence\tlabel\na fine film\t1\n\t0\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"SST-2/train.tsv:3: empty text \(fix the line, or pass --skip-malformed"):
        load("sst2", tmp_path)
    header = "video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label\n"
    (tmp_path / "train.csv").write_text(header + "v,1,s,,He,gold,a,b,c,d,0\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"train.csv:2: empty text \(sent1 or an ending\)"):
        swag.read_swag(tmp_path / "train.csv", labelled=True)
    data = json.loads(squad.find_file(DATA, "dev", required=True).read_text(encoding="utf-8"))
    data["data"][0]["paragraphs"][0]["qas"][0]["question"] = "  "
    (tmp_path / "dev-v1.1.json").write_text(json.dumps(data))
    with pytest.raises(DataError, match=r"article 0: the question of id '56ddde6b9a695914005b9628' is empty"):
        squad.read_squad(tmp_path / "dev-v1.1.json")
    data["data"][0]["paragraphs"][0]["qas"][0]["question"] = "Who?"
    data["data"][0]["paragraphs"][0]["qas"][0]["answers"][0]["answer_start"] = float("inf")  # json writes Infinity
    (tmp_path / "dev-v1.1.json").write_text(json.dumps(data))
    with pytest.raises(DataError, match=r"article 0 is malformed"):  # was a traceback (OverflowError)
        squad.read_squad(tmp_path / "dev-v1.1.json")
    (tmp_path / "pairs.csv").write_text("text,pair,label\na,b,1\nc,,0\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"pairs.csv:3: empty text in column 'pair'"):
        userdata.read_text_split(tmp_path / "pairs.csv", userdata.Columns(text_pair="pair"), labelled=True,
                                 regression=False, skips=SkipCounter())


def test_user_labels_one_number_one_class_and_a_label_across_lines_is_malformed(tmp_path):
    # pandas writes an integer column with a missing value as floats: 1 and 1.0 were two classes
    (tmp_path / "train.jsonl").write_text('{"text": "good", "label": 1}\n{"text": "bad", "label": 0.0}\n'
                                          '{"text": "fine", "label": 1.0}\n{"text": "meh", "label": "0"}\n')
    (tmp_path / "dev.jsonl").write_text('{"text": "nice", "label": 1}\n')
    assert load("classify", tmp_path).labels == ("0", "1")
    # JSON's true/false: classes "true"/"false" as a CSV spells them (were Python's "True"); never a score
    (tmp_path / "train.jsonl").write_text('{"text": "good", "label": true}\n{"text": "bad", "label": false}\n')
    (tmp_path / "dev.jsonl").write_text('{"text": "nice", "label": true}\n')
    assert load("classify", tmp_path).labels == ("false", "true")
    with pytest.raises(DataError, match=r"train.jsonl:1: label True is not a finite number"):
        load("regress", tmp_path)
    # an unclosed CSV quote swallowed three rows into one label, which became a class
    csv_dir = tmp_path / "csv"
    csv_dir.mkdir()
    (csv_dir / "train.csv").write_text('text,label\ngood movie,pos\nbad movie,"neg\ngreat,pos\nawful,neg\nugly,neg"\n'
                                       'fine,pos\nworse,neg\n')
    (csv_dir / "dev.csv").write_text("text,label\nok,pos\n")
    with pytest.raises(DataError, match=r"train.csv:3: label 'neg\\ngreat,pos.*spans lines \(a quote left open above\?\)"):
        load("classify", csv_dir)
    data = load("classify", csv_dir, skip_malformed=True)
    assert data.labels == ("neg", "pos") and len(data.train) == 3
    # a tab in a label split its row of predictions/dev.tsv into more columns than the header's
    (csv_dir / "train.csv").write_text('text,label\ngood movie,pos\nbad movie,"neg\tx"\n')
    with pytest.raises(DataError, match=r"train.csv:3: label 'neg\\tx' holds a tab; labels are names without tabs"):
        load("classify", csv_dir)


def test_user_rows_without_text_are_malformed_and_two_files_for_one_split_are_refused(tmp_path):
    (tmp_path / "train.csv").write_text("text,label\ngood,1\n,0\n   ,0\nbad,0\n")
    (tmp_path / "dev.csv").write_text("text,label\nok,1\n")
    with pytest.raises(DataError, match=r"train.csv:3: empty text in column 'text'"):
        load("classify", tmp_path)
    assert [ex.text_a for ex in load("classify", tmp_path, skip_malformed=True).train] == ["good", "bad"]
    (tmp_path / "train.jsonl").write_text('{"text": "other", "label": 1}\n')  # which one was meant?
    with pytest.raises(DataError, match=r"holds train.csv and train.jsonl for the train split; keep one of them there"):
        load("classify", tmp_path, skip_malformed=True)
