"""Bad input through the real CLI: the job finishes, skips are counted by reason and dead-lettered,
no good document is lost; bad settings fail before any work with a message that says what to do."""

from __future__ import annotations

import bz2
import gzip
import json
import shutil

import pyarrow as pa
import pytest

from launch import cli
from pipeline.inspect_corpus import read_shard
from pipeline.manifest import read_manifest

PROSE = ("The quick brown fox jumps over the lazy dog. It was a very sunny day in the valley. "
         "Nobody in the village had seen anything like it before. ")


def _page(i: int, text: str) -> str:
    return f"<page><title>T{i}</title><ns>0</ns><id>{i}</id><revision><text>{text}</text></revision></page>\n"


@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory, data_dir):
    d = tmp_path_factory.mktemp("bad")
    good_book = data_dir / "books" / "persuasion.txt"
    (d / "good_book.txt").write_bytes(good_book.read_bytes()[:60_000])
    # Truncated bz2 wiki dump: several 100 kB blocks, cut in the middle.
    wiki = "<mediawiki>\n" + "".join(_page(i, f"{PROSE}Page {i}. " * 12) for i in range(1, 300)) + "</mediawiki>\n"
    data = bz2.compress(wiki.encode(), compresslevel=1)
    (d / "truncated.xml.bz2").write_bytes(data[: len(data) // 2])
    # A good gzip member followed by garbage.
    (d / "corrupt.txt.gz").write_bytes(gzip.compress((PROSE * 20).encode()) + b"\x1f\x8b\x08\x00not-gzip-at-all")
    (d / "latin1.txt").write_bytes((PROSE * 10).encode() + b"caf\xe9 cr\xe8me br\xfbl\xe9e. " + (PROSE * 10).encode())
    (d / "malformed.xml").write_text(
        "<mediawiki>\n" + _page(1001, PROSE * 5) + _page(1002, PROSE + " & broken <b> markup")
        + "<page><title>x</title><ns>0</ns><id>1003</id><revision><text>" + PROSE + "</page>\n"
        + _page(1004, PROSE * 5) + "</mediawiki>\n", encoding="utf-8")
    (d / "empty.jsonl").write_text(json.dumps({"id": "e", "text": "  "}) + "\n" + json.dumps({"id": "ok", "text": PROSE * 8}) + "\n")
    with open(d / "huge_line.txt", "wb") as f:  # 50 MB single-line document
        chunk = PROSE.encode() * 1000
        for _ in range(50_000_000 // len(chunk) + 1):
            f.write(chunk)
    (d / "blob.bin").write_bytes(bytes(range(256)) * 4096)
    (d / "download.json").write_text("{}")  # the downloader's state file: not corpus text
    return d


def _built(inputs, out, data_dir) -> dict:
    """The manifest of a corpus built from `inputs` into `out` through the CLI (seq 64, no heldout split)."""
    argv = ["corpus", "--input", str(inputs), "--vocab", str(data_dir / "vocab" / "bert-base-uncased-vocab.txt"),
            "--out", str(out), "--seq-len", "64", "--dupe-factor", "1", "--heldout-fraction", "0"]
    assert cli.main(argv) == 0
    return read_manifest(out)


def test_bad_inputs_are_counted_and_good_documents_kept(bad_inputs, tmp_path, data_dir):
    out = tmp_path / "c"
    m = _built(bad_inputs, out, data_dir)
    c = m["counters"]
    assert c["files_read"] == 8  # download.json ignored
    assert c["skipped_corrupt_compression"] == 2
    assert c["skipped_malformed_xml"] == 2
    assert c["skipped_empty_document"] == 1
    assert c["skipped_document_too_large"] == 1
    assert c["skipped_binary_file"] == 1
    assert c["documents_invalid_utf8_repaired"] == 1
    dead = [json.loads(line) for p in sorted((out / "dead_letter").glob("*.jsonl")) for line in p.read_text().splitlines()]
    assert {(d["record_id"].rsplit("/", 1)[-1], d["reason"]) for d in dead} >= {
        ("malformed.xml#1002", "malformed_xml"), ("malformed.xml#1003", "malformed_xml"),
        ("empty.jsonl:e", "empty_document"), ("huge_line.txt", "document_too_large"), ("blob.bin", "binary_file"),
    }
    assert sum(d["reason"] == "corrupt_compression" for d in dead) == 2
    docs = set(pa.concat_tables([read_shard(out / s["path"]) for s in m["shards"]]).column("doc_id").to_pylist())
    truncated = {d for d in docs if d.startswith("truncated.xml.bz2#")}
    # Every good document made it: the book, the repaired file, the two good pages, the JSON one,
    # and the wiki pages before the truncation point.
    assert {"good_book.txt", "latin1.txt", "malformed.xml#1001", "malformed.xml#1004", "empty.jsonl:ok"} <= docs
    assert len(truncated) > 50 and truncated == {f"truncated.xml.bz2#{i}" for i in range(1, len(truncated) + 1)}
    assert c["documents_read"] == len(docs)


def _fails(argv, capsys) -> str:
    with pytest.raises(SystemExit) as err:
        cli.main(argv)
    assert err.value.code == 2
    return capsys.readouterr().err


def test_clear_errors_before_any_work(tmp_path, data_dir, capsys):
    vocab = str(data_dir / "vocab" / "bert-base-uncased-vocab.txt")
    book = str(data_dir / "books" / "persuasion.txt")
    out = tmp_path / "never"
    base = ["corpus", "--out", str(out)]
    assert "vocab file" in _fails(base + ["--input", book, "--vocab", str(tmp_path / "missing.txt")], capsys)
    assert "matches no file" in _fails(base + ["--input", str(tmp_path / "nope*.txt"), "--vocab", vocab], capsys)
    assert "--seq-len 4 is out of range" in _fails(base + ["--input", book, "--vocab", vocab, "--seq-len", "4"], capsys)
    assert "--seq-len 100000" in _fails(base + ["--input", book, "--vocab", vocab, "--seq-len", "100000"], capsys)
    assert "exactly one of --vocab" in _fails(base + ["--input", book], capsys)
    assert "give --input" in _fails(base + ["--vocab", vocab], capsys)
    assert "--seq-lenn" in _fails(base + ["--input", book, "--vocab", vocab, "--seq-lenn", "64"], capsys)
    assert not out.exists()  # nothing was started


def test_bad_vocab_fails_before_the_previous_corpus_is_cleared(tmp_path, data_dir, capsys):
    out = tmp_path / "corpus"
    out.mkdir()
    (out / "manifest.json").write_text("{}")
    (out / "train-00000-of-00001.arrow").write_bytes(b"previous shard")
    no_mask = tmp_path / "no_mask.txt"
    no_mask.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nthe\n", encoding="utf-8")
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"\xff\xfe\x00vocab")
    base = ["corpus", "--input", str(data_dir / "books" / "persuasion.txt"), "--out", str(out)]
    assert "[MASK]" in _fails(base + ["--vocab", str(no_mask)], capsys)
    assert "not UTF-8" in _fails(base + ["--vocab", str(binary)], capsys)
    assert "cannot be read" in _fails(base + ["--vocab", str(tmp_path)], capsys)  # a directory
    vocab = str(data_dir / "vocab" / "bert-base-uncased-vocab.txt")
    assert "is a file" in _fails(base[:-1] + [str(no_mask), "--vocab", vocab], capsys)
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "train-00000-of-00001.arrow"]


def test_out_inside_an_input_directory_is_not_read_back(tmp_path, data_dir):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "book.txt").write_bytes((data_dir / "books" / "persuasion.txt").read_bytes()[:20_000])
    argv = ["corpus", "--input", str(raw), "--vocab", str(data_dir / "vocab" / "bert-base-uncased-vocab.txt"),
            "--out", str(raw / "corpus"), "--seq-len", "64", "--dupe-factor", "1", "--heldout-fraction", "0"]
    assert cli.main(argv) == 0
    first = read_manifest(raw / "corpus")
    assert cli.main(argv) == 0  # the rerun sees the first run's vocab.txt, shards and dead letters
    again = read_manifest(raw / "corpus")
    assert again["inputs"] == [str(raw / "book.txt")] and again["counters"] == first["counters"]
    assert [s["sha256"] for s in again["shards"]] == [s["sha256"] for s in first["shards"]]


def test_trained_vocab_and_parquet(tmp_path, data_dir):
    out = tmp_path / "trained"
    text = tmp_path / "sample.txt"
    text.write_bytes((data_dir / "books" / "northangerabbey.txt").read_bytes()[:150_000])
    argv = ["corpus", "--input", str(text), "--train-vocab-size", "1500", "--out", str(out), "--seq-len", "64",
            "--dupe-factor", "1", "--shard-format", "parquet", "--num-shards", "1", "--runner", "FnApiRunner"]
    assert cli.main(argv) == 0
    m = read_manifest(out)
    vocab = (out / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] and 1000 < len(vocab) <= 1500
    assert m["vocab_size"] == len(vocab) and m["counters"]["vocab_distinct_words"] > 500
    (shard,) = m["shards"]
    assert shard["path"] == "train-00000-of-00001.parquet"
    table = read_shard(out / shard["path"])
    ids = [i for row in table.column("input_ids").to_pylist() for i in row]
    assert table.num_rows == m["num_instances"] > 50 and max(ids) < len(vocab)
    # The trained vocab actually covers the text: few unknown pieces.
    assert ids.count(1) < 0.01 * len(ids)


def test_vocab_training_is_deterministic(data_dir):
    """HF's trainer alone breaks merge ties in hash order; ours gives the same vocab every time."""
    import collections
    import re

    from pipeline.vocab_training import train_wordpiece

    words = re.findall(r"\w+|[^\w\s]", (data_dir / "books" / "persuasion.txt").read_text(encoding="utf-8").lower())
    counts = [(w, n) for w, n in collections.Counter(words).items() if n >= 2]
    first = train_wordpiece(counts, 2500, lowercase=True)
    assert len(first) == 2500 and first[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    for _ in range(3):
        assert train_wordpiece(list(reversed(counts)), 2500, lowercase=True) == first


def test_scaled_down_counts_keep_every_words_expected_frequency(data_dir):
    # Above max_trainer_words each count is divided by the scale; rounded up, every rare word went in at
    # least once: on these books at a scale of 100, the tail was 26% of the text and 76% of what was fed.
    import collections
    import re

    from pipeline.vocab_training import _scaled_text

    text = " ".join((data_dir / "books" / name).read_text(encoding="utf-8") for name in ("persuasion.txt", "northangerabbey.txt"))
    counts = sorted(collections.Counter(re.findall(r"\w+", text.lower())).items())
    total = sum(n for _, n in counts)
    budget = total // 100
    fed = collections.Counter(w for line in _scaled_text(counts, budget) for w in line.split())
    rare = {w for w, n in counts if n < 100}
    true_share, fed_share = sum(n for w, n in counts if w in rare) / total, sum(fed[w] for w in rare) / sum(fed.values())
    assert abs(fed_share - true_share) < 0.03, (true_share, fed_share)
    assert abs(sum(fed.values()) - budget) < 0.05 * budget
    assert dict(collections.Counter(w for line in _scaled_text(counts, 10 * total) for w in line.split())) == dict(counts)


def test_beam_options_pass_through(capsys):
    from apache_beam.options.pipeline_options import FlinkRunnerOptions, StandardOptions

    from launch.cli import build_parser
    from launch.cli.corpus import beam_args_of
    from pipeline.corpus_job import pipeline_options

    args = build_parser("corpus").parse_args(
        ["--input", "x", "--vocab", "v", "--out", "o", "--runner=FlinkRunner", "--flink_master=localhost:8081",
         "--environment_type=LOOPBACK", "--parallelism=4"]
    )
    opts = pipeline_options(beam_args_of(args))
    assert opts.view_as(StandardOptions).runner == "FlinkRunner"
    assert opts.view_as(FlinkRunnerOptions).flink_master == "localhost:8081"
    # The local default is named explicitly (never Beam's Prism download), and N local workers are processes.
    local = pipeline_options(["--direct_num_workers=2"]).get_all_options()
    assert local["runner"] == "FnApiRunner" and local["direct_running_mode"] == "multi_processing"
    base = ["corpus", "--input", "x", "--vocab", "v", "--out", "o"]
    assert "a Beam option takes its value as --flink_master=h:1" in _fails([*base, "--flink_master", "h:1"], capsys)
    assert "--seqlx is not a flag of bertpipe corpus (`--help` lists them)" in _fails([*base, "--seqlx", "64"], capsys)
    # Close to a flag of ours and not Beam's: Beam dropped --seqlen=64 with a warning, and seq len 128 was used
    assert "unrecognized argument --seqlen=64: did you mean --seq-len?" in _fails([*base, "--seqlen=64"], capsys)
    assert "unrecognized argument --dupefactor: did you mean --dupe-factor?" in _fails([*base, "--dupefactor", "1"], capsys)
    # a config key spelt as Beam spells its options: Beam dropped it with a warning, and seq len 128 was used
    assert "--seq_len is spelled --seq-len" in _fails([*base, "--seq_len=64"], capsys)


def test_a_vocab_that_does_not_fit_the_text_fails_with_its_unk_share(tmp_path, data_dir, capsys):
    """A SentencePiece-style list with BERT's five specials: nearly every word piece of real text is [UNK]."""
    spm = tmp_path / "spm_vocab.txt"
    pieces = ["\u2581the", "\u2581of", "\u2581and", "\u2581to", "s", "ing", "\u2581a", "\u2581in", "ed", "\u2581was"]
    spm.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *pieces]) + "\n", encoding="utf-8")
    out = tmp_path / "corpus"
    err = _fails(["corpus", "--input", str(data_dir / "books" / "persuasion.txt"), "--vocab", str(spm),
                  "--out", str(out), "--seq-len", "64", "--dupe-factor", "1"], capsys)
    assert "of the" in err and "word pieces are [UNK] (limit --max-unk-share 0.05)" in err
    assert "does not fit this text" in err and not (out / "manifest.json").exists()
    # A vocabulary trained here: the advice was to pass --train-vocab-size, the flag already given.
    from pipeline.corpus_job import CorpusConfig, _check_result

    trained = CorpusConfig(inputs=["x"], out="o", train_vocab_size=300)
    with pytest.raises(ValueError, match=r"a vocabulary of --train-vocab-size 300 cannot spell .* raise --train-vocab-size"):
        _check_result(trained, {"tokens": 100, "unk_tokens": 50}, 10, 1, 300)
    # ...where the text was too small to learn 300 tokens, more asked for changes nothing (108 learnt of 1,000).
    with pytest.raises(ValueError, match=r"too small to train a vocabulary: 108 tokens were learnt .* give more text, or "
                                         r"pass --vocab"):
        _check_result(trained, {"tokens": 100, "unk_tokens": 50}, 10, 1, 108)


def test_the_unk_share_is_counted_in_the_manifest(small_corpus):
    counters = json.loads((small_corpus / "manifest.json").read_text())["counters"]
    assert 0 <= counters["unk_tokens"] < 0.01 * counters["tokens"]  # the right vocab: almost no [UNK]


def test_empty_input_is_an_error_not_a_zero_instance_corpus(tmp_path, data_dir, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    out = tmp_path / "corpus"
    err = _fails(["corpus", "--input", str(empty), "--vocab", str(data_dir / "vocab" / "bert-base-uncased-vocab.txt"),
                  "--out", str(out), "--seq-len", "64"], capsys)
    assert "no instances were produced from 1 input file(s)" in err and not (out / "manifest.json").exists()


def test_corpus_never_deletes_files_it_did_not_write(tmp_path, data_dir, capsys):
    """--out holding another tool's manifest.json and shard-like files: refused, every file kept."""
    out = tmp_path / "theirs"
    out.mkdir()
    (out / "manifest.json").write_text('{"format": "someone-else"}')
    (out / "train-00000-of-00002.arrow").write_bytes(b"their data")
    err = _fails(["corpus", "--input", str(data_dir / "books" / "persuasion.txt"),
                  "--vocab", str(data_dir / "vocab" / "bert-base-uncased-vocab.txt"), "--out", str(out)], capsys)
    assert "which `bertpipe corpus` did not write" in err
    assert (out / "manifest.json").read_text() == '{"format": "someone-else"}'
    assert (out / "train-00000-of-00002.arrow").read_bytes() == b"their data"


def test_a_rerun_deletes_the_earlier_corpus_and_nothing_of_the_users_beside_it(tmp_path, data_dir, capsys):
    """A rerun deleted every `*-of-*.arrow` and all of dead_letter/ once an earlier corpus of ours was there:
    a user's `data-00000-of-00001.arrow` (a `datasets` save) and notes of theirs in dead_letter/ went with it."""
    out = tmp_path / "corpus"
    argv = ["corpus", "--input", str(data_dir / "books" / "persuasion.txt"),
            "--vocab", str(data_dir / "vocab" / "bert-base-uncased-vocab.txt"), "--out", str(out),
            "--seq-len", "64", "--dupe-factor", "1", "--progress-seconds", "0"]
    assert cli.main([*argv, "--num-shards", "3"]) == 0
    (out / "dead_letter").mkdir(exist_ok=True)
    (out / "dead_letter" / "README").write_text("my notes")
    assert cli.main([*argv, "--num-shards", "2"]) == 0  # fewer shards: the third is gone, the notes stay
    assert sorted(p.name for p in out.glob("train-*")) == ["train-00000-of-00002.arrow", "train-00001-of-00002.arrow"]
    assert (out / "dead_letter" / "README").read_text() == "my notes"
    theirs = out / "data-00000-of-00001.arrow"
    theirs.write_bytes(b"their data")
    err = _fails([*argv, "--num-shards", "1"], capsys)
    assert f"--out {out} holds data-00000-of-00001.arrow beside an earlier corpus, which bertpipe did not write" in err
    assert theirs.read_bytes() == b"their data" and (out / "manifest.json").is_file()
    assert len(list(out.glob("train-*"))) == 2  # refused before anything was deleted


def test_corpus_never_overwrites_a_vocab_txt_it_did_not_write(tmp_path, data_dir, capsys):
    """--out holding the user's own vocab.txt and no bertpipe corpus: refused, the file kept; as the
    --vocab itself it is read and written back unchanged."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "vocab.txt").write_text("my notes, not a vocabulary\n")
    err = _fails(["corpus", "--input", str(data_dir / "books" / "persuasion.txt"), "--train-vocab-size", "500",
                  "--out", str(out)], capsys)
    assert "holds vocab.txt, which `bertpipe corpus` did not write" in err
    assert (out / "vocab.txt").read_text() == "my notes, not a vocabulary\n"
    assert sorted(p.name for p in out.iterdir()) == ["vocab.txt"]

    bert_vocab = (data_dir / "vocab" / "bert-base-uncased-vocab.txt").read_bytes()
    (out / "vocab.txt").write_bytes(bert_vocab)
    assert cli.main(["corpus", "--input", str(data_dir / "books" / "persuasion.txt"), "--vocab", str(out / "vocab.txt"),
                     "--out", str(out), "--seq-len", "64", "--dupe-factor", "1", "--progress-seconds", "0"]) == 0
    assert (out / "vocab.txt").read_bytes() == bert_vocab and (out / "manifest.json").is_file()
    # A later corpus there with another vocabulary would have deleted the user's file with the old corpus.
    err = _fails(["corpus", "--input", str(data_dir / "books" / "persuasion.txt"), "--train-vocab-size", "500",
                  "--out", str(out)], capsys)
    assert f"holds the vocab.txt its earlier corpus was built with (--vocab {out / 'vocab.txt'})" in err
    assert (out / "vocab.txt").read_bytes() == bert_vocab and (out / "manifest.json").is_file()
    # As the --vocab it is never rewritten: with a byte-order mark it would be, so that is refused.
    (out / "vocab.txt").write_bytes("\ufeff".encode() + bert_vocab)
    err = _fails(["corpus", "--input", str(data_dir / "books" / "persuasion.txt"), "--vocab", str(out / "vocab.txt"),
                  "--out", str(out)], capsys)
    assert "is --out's own vocab.txt, and the corpus would rewrite it" in err
    assert (out / "vocab.txt").read_bytes() == "\ufeff".encode() + bert_vocab


def test_the_users_vocab_txt_in_out_is_kept_when_the_rerun_starts_elsewhere(tmp_path, data_dir, capsys, monkeypatch):
    # The manifest kept --vocab as typed: "corp/vocab.txt", built from tmp_path, named nothing from tmp_path/sub,
    # and the rerun there deleted the user's file with the old corpus. Now the manifest records whose it is.
    out = tmp_path / "corp"
    out.mkdir()
    mine = (data_dir / "vocab" / "bert-base-uncased-vocab.txt").read_text(encoding="utf-8") + "mycustomtoken\n"
    (out / "vocab.txt").write_text(mine, encoding="utf-8")
    book = str(data_dir / "books" / "persuasion.txt")
    common = ["--seq-len", "64", "--dupe-factor", "1", "--progress-seconds", "0"]
    monkeypatch.chdir(tmp_path)
    assert cli.main(["corpus", "--input", book, "--vocab", "corp/vocab.txt", "--out", "corp", *common]) == 0
    assert json.loads((out / "manifest.json").read_text())["vocab_is_users"] is True
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    err = _fails(["corpus", "--input", book, "--vocab", str(data_dir / "vocab" / "bert-base-uncased-vocab.txt"),
                  "--out", "../corp", *common], capsys)
    assert "holds the vocab.txt its earlier corpus was built with" in err
    assert (out / "vocab.txt").read_text(encoding="utf-8") == mine
    # A vocabulary bertpipe trained there, then passed back as --vocab OUT/vocab.txt, stays bertpipe's to replace.
    trained = tmp_path / "trained"
    assert cli.main(["corpus", "--input", book, "--train-vocab-size", "500", "--out", str(trained), *common]) == 0
    assert cli.main(["corpus", "--input", book, "--vocab", str(trained / "vocab.txt"), "--out", str(trained),
                     *common]) == 0
    assert json.loads((trained / "manifest.json").read_text())["vocab_is_users"] is False
    assert cli.main(["corpus", "--input", book, "--train-vocab-size", "400", "--out", str(trained), *common]) == 0


def test_the_users_vocab_txt_in_out_is_kept_after_a_job_that_did_not_finish(tmp_path, data_dir, capsys):
    # A job with --vocab OUT/vocab.txt that failed (or was stopped) left only its temp folder, which proves OUT
    # ours, and no manifest to say whose vocab.txt is: the next corpus there deleted the user's file.
    out = tmp_path / "corp"
    out.mkdir()
    mine = (data_dir / "vocab" / "bert-base-uncased-vocab.txt").read_text(encoding="utf-8") + "mycustomtoken\n"
    (out / "vocab.txt").write_text(mine, encoding="utf-8")
    binary = tmp_path / "binary.bin"
    binary.write_bytes(bytes(range(256)) * 64)
    err = _fails(["corpus", "--input", str(binary), "--vocab", str(out / "vocab.txt"), "--out", str(out),
                  "--progress-seconds", "0"], capsys)
    assert "no instances" in err and (out / ".bertpipe-tmp").is_dir() and not (out / "manifest.json").exists()
    err = _fails(["corpus", "--input", str(data_dir / "books" / "persuasion.txt"), "--train-vocab-size", "500",
                  "--out", str(out), "--progress-seconds", "0"], capsys)
    assert f"holds the vocab.txt its earlier corpus was built with (--vocab {out / 'vocab.txt'})" in err
    assert (out / "vocab.txt").read_text(encoding="utf-8") == mine


def test_an_input_named_inside_out_is_refused_and_out_inside_an_input_folder_is_not_read(tmp_path, data_dir,
                                                                                          capsys):
    # `--input OUT/book.txt other.txt --out OUT` read only other.txt, without a word.
    out, book = tmp_path / "out", data_dir / "books" / "persuasion.txt"
    out.mkdir()
    shutil.copy(book, out / "mine.txt")
    common = ["--vocab", str(data_dir / "vocab" / "bert-base-uncased-vocab.txt"), "--seq-len", "64", "--dupe-factor",
              "1", "--progress-seconds", "0"]
    for given in (out / "mine.txt", out, f"{out}/*.txt"):
        err = _fails(["corpus", "--input", str(given), str(book), "--out", str(out), *common], capsys)
        assert f"--input {given} lies inside --out {out}" in err and "Traceback" not in err
    assert sorted(p.name for p in out.iterdir()) == ["mine.txt"]
    # --out inside an --input folder is fine: the corpus's own files there are not read back as text.
    text = tmp_path / "text"
    text.mkdir()
    shutil.copy(book, text / "book.txt")
    argv = ["corpus", "--input", str(text), "--out", str(text / "corpus"), *common]
    assert cli.main(argv) == 0 and cli.main(argv) == 0
    assert json.loads((text / "corpus" / "manifest.json").read_text())["counters"]["files_read"] == 1


def test_the_vocab_inside_an_input_directory_is_not_read_as_text(tmp_path, data_dir, capsys):
    text = tmp_path / "text"
    text.mkdir()
    shutil.copy(data_dir / "books" / "persuasion.txt", text)
    shutil.copy(data_dir / "vocab" / "bert-base-uncased-vocab.txt", text / "vocab.txt")
    out = tmp_path / "corpus"
    assert cli.main(["corpus", "--input", str(text), "--vocab", str(text / "vocab.txt"), "--out", str(out),
                     "--seq-len", "64", "--dupe-factor", "1", "--progress-seconds", "0"]) == 0
    assert f"not reading --vocab {text / 'vocab.txt'} as text" in capsys.readouterr().err
    assert json.loads((out / "manifest.json").read_text())["inputs"] == [str(text / "persuasion.txt")]
    err = _fails(["corpus", "--input", str(text / "vocab.txt"), "--vocab", str(text / "vocab.txt"),
                  "--out", str(tmp_path / "c2")], capsys)
    assert "the only input file is --vocab" in err


def test_every_special_token_is_checked_before_the_previous_corpus_is_cleared(tmp_path, data_dir, capsys):
    # A vocab without [PAD] or [UNK] used to pass the check, cost the previous corpus, then fail
    # inside a Beam worker with a traceback that did not name the file.
    out = tmp_path / "corpus"
    out.mkdir()
    (out / "manifest.json").write_text(json.dumps({"format": "bertpipe-corpus"}))
    (out / "train-00000-of-00001.arrow").write_bytes(b"previous shard")
    tokens = (data_dir / "vocab" / "bert-base-uncased-vocab.txt").read_text(encoding="utf-8").splitlines()
    base = ["corpus", "--input", str(data_dir / "books" / "persuasion.txt"), "--out", str(out)]
    for special in ("[PAD]", "[UNK]"):
        vocab = tmp_path / f"no_{special[1:-1]}.txt"
        vocab.write_text("\n".join(t for t in tokens if t != special) + "\n", encoding="utf-8")
        message = _fails(base + ["--vocab", str(vocab)], capsys).strip().splitlines()
        assert message == [f"bertpipe corpus: error: vocab {vocab} lacks {special}; a BERT vocab.txt needs "
                           "[PAD] [UNK] [CLS] [SEP] [MASK], one token per line"]
    # [CLS] twice: the corpus took its first line, masking its last, and [CLS] positions were masked as words.
    vocab = tmp_path / "cls_twice.txt"
    vocab.write_text("\n".join(tokens + ["[CLS]"]) + "\n", encoding="utf-8")
    assert (f"vocab {vocab} lists [CLS] 2 times (lines 102, {len(tokens) + 1}); each special token needs exactly "
            "one line") in _fails(base + ["--vocab", str(vocab)], capsys)
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "train-00000-of-00001.arrow"]


def test_a_vocab_saved_with_a_byte_order_mark_builds_the_same_corpus(tmp_path, data_dir):
    raw = tmp_path / "book.txt"
    raw.write_bytes((data_dir / "books" / "persuasion.txt").read_bytes()[:20_000])
    vocab = data_dir / "vocab" / "bert-base-uncased-vocab.txt"
    bom = tmp_path / "vocab_bom.txt"
    bom.write_bytes("\ufeff".encode() + vocab.read_bytes())
    runs = {}
    for name, v in (("plain", vocab), ("bom", bom)):
        argv = ["corpus", "--input", str(raw), "--vocab", str(v), "--out", str(tmp_path / name), "--seq-len", "64",
                "--dupe-factor", "1", "--heldout-fraction", "0"]
        assert cli.main(argv) == 0
        runs[name] = read_manifest(tmp_path / name)
    assert runs["bom"]["vocab_sha256"] == runs["plain"]["vocab_sha256"]
    assert [s["sha256"] for s in runs["bom"]["shards"]] == [s["sha256"] for s in runs["plain"]["shards"]]
    assert (tmp_path / "bom" / "vocab.txt").read_bytes() == vocab.read_bytes()


def test_text_without_sentence_ends_is_counted_and_warned_not_silently_cut(tmp_path, data_dir, capsys):
    """A sentence longer than a sequence keeps a sequence's length: a book without full stops lost ~99%."""
    import re

    book = (data_dir / "books" / "persuasion.txt").read_text(encoding="utf-8")[:20000]
    flat = tmp_path / "no_full_stops.txt"
    flat.write_text(re.sub(r"[.!?]", "", book), encoding="utf-8")
    argv = ["corpus", "--vocab", str(data_dir / "vocab" / "bert-base-uncased-vocab.txt"), "--seq-len", "64",
            "--dupe-factor", "1"]
    assert cli.main([*argv, "--input", str(flat), "--out", str(tmp_path / "flat")]) == 0
    counters = json.loads((tmp_path / "flat" / "manifest.json").read_text())["counters"]
    assert counters["tokens_beyond_seq_len"] > 0.5 * counters["tokens"] and counters["sentences_longer_than_seq_len"] > 0
    err = capsys.readouterr().err
    assert "of the text is left out (tokens_beyond_seq_len)" in err and "(--format lines)" in err
    prose = tmp_path / "prose.txt"
    prose.write_text(book, encoding="utf-8")
    assert cli.main([*argv, "--input", str(prose), "--out", str(tmp_path / "prose")]) == 0
    counters = json.loads((tmp_path / "prose" / "manifest.json").read_text())["counters"]
    assert counters.get("tokens_beyond_seq_len", 0) < 0.25 * counters["tokens"]  # long sentences, but sentences
    assert "left out" not in capsys.readouterr().err


def test_a_rerun_killed_while_it_deletes_the_earlier_corpus_is_still_ours_to_the_next(tmp_path, data_dir, monkeypatch):
    """The manifest, the proof that OUT is ours, was deleted before the shards (in listing order): a run killed
    between left shards every later rerun refused as "which bertpipe corpus did not write"."""
    from pipeline import corpus_output

    out = tmp_path / "corpus"
    argv = ["corpus", "--input", str(data_dir / "books" / "persuasion.txt"),
            "--vocab", str(data_dir / "vocab" / "bert-base-uncased-vocab.txt"), "--out", str(out),
            "--seq-len", "64", "--dupe-factor", "1", "--progress-seconds", "0", "--num-shards", "3"]
    assert cli.main(argv) == 0
    (out / ".bertpipe-tmp").mkdir()  # as a killed earlier rerun leaves it: every kind of entry there
    vocab_text = (data_dir / "vocab" / "bert-base-uncased-vocab.txt").read_text()
    real_delete, deleted = corpus_output.delete_tree, []

    def killed_after(n):
        def delete(path):
            if len(deleted) == n:
                raise KeyboardInterrupt  # the kill, as the n+1-th entry is deleted
            deleted.append(path)
            real_delete(path)
        return delete

    for n in range(10):
        monkeypatch.setattr(corpus_output, "delete_tree", killed_after(n))
        deleted.clear()
        try:
            corpus_output.clear_previous_output(str(out), None, vocab_text)
        except KeyboardInterrupt:
            pass
        else:
            break
        # the next run sees a corpus of ours, finished or not, and may clear it
        monkeypatch.setattr(corpus_output, "delete_tree", real_delete)
        assert (out / "manifest.json").is_file() or (out / ".bertpipe-tmp").is_dir(), (n, deleted)
        assert cli.main(argv) == 0, n
        (out / ".bertpipe-tmp").mkdir()
    assert n > 3  # every entry was tried


def test_an_unfinished_corpus_of_100000_shards_or_more_is_cleared_as_ours(tmp_path, data_dir):
    # shard_name pads to 5 digits, so 100,000 shards have 6: a rerun after an interrupt refused them as the user's.
    from pipeline import corpus_output
    from pipeline.shards import shard_name

    out = tmp_path / "many"
    (out / ".bertpipe-tmp").mkdir(parents=True)
    names = [shard_name("train", i, 100_000, "arrow") for i in (0, 366, 99_999)] + [shard_name("heldout", 0, 7, "arrow")]
    for name in names:
        (out / name).write_bytes(b"shard")
    vocab_text = (data_dir / "vocab" / "bert-base-uncased-vocab.txt").read_text()
    corpus_output.clear_previous_output(str(out), None, vocab_text)
    assert not any((out / name).exists() for name in names) and list(out.iterdir()) == []


def test_a_bad_first_jsonl_line_an_unclosed_doc_and_an_empty_document_are_dead_lettered_with_their_file(tmp_path, data_dir):
    """Three silent losses: a JSONL export whose first line was cut off became one "book" of JSON syntax; a
    WikiExtractor <doc> missing its </doc> swallowed the next article, tag line included; a document that
    tokenized to nothing was dead-lettered with `"source": ""`, its file unnamed."""
    d = tmp_path / "in"
    d.mkdir()
    records = [json.dumps({"id": i, "text": PROSE + f"Record {i}."}) for i in range(1, 40)]
    (d / "export.jsonl").write_text('{"id": 0, "text": "cut off\n' + "\n".join(records) + "\n")
    (d / "export.txt").write_text('{"id": 0, "text": "cut off\n' + "\n".join(records) + "\n")  # sniffed, not named
    (d / "wiki_00").write_text(
        '<doc id="1" url="u1" title="Alpha">\nAlpha\nAlpha is the first article. It has two sentences.\n'
        '<doc id="2" url="u2" title="Beta">\nBeta\nBeta is the second article. Its closing tag is present.\n</doc>\n'
        '<doc id="3" url="u3" title="Gamma">\nGamma\nGamma is the third article. It is complete.\n</doc>\n')
    (d / "ctrl.txt").write_bytes(b"\x01\x02\x03 \x07\n")
    out = tmp_path / "c"
    m = _built(d, out, data_dir)
    c = m["counters"]
    assert c["files_jsonl"] == 2 and c["skipped_malformed_json"] == 2 and c["skipped_malformed_doc"] == 1
    assert c["skipped_empty_document"] == 1 and c["documents_read"] == 2 * 39 + 2 + 1
    dead = [json.loads(line) for p in (out / "dead_letter").glob("*.jsonl") for line in p.read_text().splitlines()]
    assert sorted((x["source"], x["record_id"], x["reason"]) for x in dead) == [
        (str(d / "ctrl.txt"), "ctrl.txt", "empty_document"), (str(d / "export.jsonl"), "export.jsonl:1", "malformed_json"),
        (str(d / "export.txt"), "export.txt:1", "malformed_json"), (str(d / "wiki_00"), "wiki_00#1", "malformed_doc")]
    docs = set(pa.concat_tables([read_shard(out / s["path"]) for s in m["shards"]]).column("doc_id").to_pylist())
    assert {"wiki_00#2", "wiki_00#3", "export.jsonl:1", "export.txt:39"} <= docs and "wiki_00#1" not in docs
