"""`bertpipe features` through the real CLI, checked against transformers on the real checkpoint."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml
import torch

from launch import cli
from launch.finetune.feature_extraction import parse_layers


@pytest.fixture(scope="module")
def texts_file(tmp_path_factory, sentences):
    path = tmp_path_factory.mktemp("features") / "texts.txt"
    # Many more texts than one batch, in an order that is not sorted by length.
    path.write_text("\n".join(sentences * 3) + "\n")
    return path


def _hf_hidden(hf_minilm, minilm_dir, texts):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    tok.enable_padding(pad_id=0)
    enc = tok.encode_batch(texts)
    ids, mask = torch.tensor([e.ids for e in enc]), torch.tensor([e.attention_mask for e in enc])
    with torch.no_grad():
        out = hf_minilm(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids), output_hidden_states=True)
    return out.hidden_states, mask, enc


def test_mean_pooling_of_last_layer_matches_transformers(minilm_dir, hf_minilm, texts_file, tmp_path, capsys):
    argv = ["features", "--checkpoint", str(minilm_dir), "--input", str(texts_file), "--out", str(tmp_path / "f"),
            "--layers", "last", "--pool", "mean", "--batch-size", "4"]
    assert cli.main(argv) == 0
    ours = np.load(tmp_path / "f.npy")
    texts = texts_file.read_text().splitlines()
    hidden, mask, _ = _hf_hidden(hf_minilm, minilm_dir, texts)
    m = mask.unsqueeze(-1).float()
    expected = ((hidden[-1] * m).sum(1) / m.sum(1)).numpy()
    assert ours.dtype == np.float32 and ours.shape == (len(texts), 384)
    assert np.abs(ours - expected).max() < 1e-4  # rows in input order despite length-sorted batches
    assert yaml.safe_load((tmp_path / "f.features.yaml").read_text())["device"] == "cpu"  # what ran, not "auto"
    assert cli.main([*argv[:5], "--out", str(tmp_path / "long"), "--max-seq-len", "9999"]) == 0
    assert yaml.safe_load((tmp_path / "long.features.yaml").read_text())["max_seq_len"] == 512  # the model's cap
    assert "wrote" in capsys.readouterr().out
    assert cli.main(argv) == 0  # its own earlier output (the .features.yaml beside it) is rewritten
    # A file of the user's under the output name is refused, not written over.
    (tmp_path / "mine.npy").write_bytes(b"my data")
    with pytest.raises(SystemExit) as exc:
        cli.main([str(tmp_path / "mine.npy") if a == str(tmp_path / "f") else a for a in argv])
    assert exc.value.code == 2 and "did not write it (no mine.features.yaml beside it" in capsys.readouterr().err
    assert (tmp_path / "mine.npy").read_bytes() == b"my data" and not (tmp_path / "mine.features.yaml").exists()
    # Nor a settings file of the user's under the sidecar's name (the sidecar is what proves ownership).
    (tmp_path / "notes.features.yaml").write_text("my: notes\n")
    with pytest.raises(SystemExit) as exc:
        cli.main([str(tmp_path / "notes") if a == str(tmp_path / "f") else a for a in argv])
    assert exc.value.code == 2 and "notes.features.yaml exists and is not a `bertpipe features` settings" in capsys.readouterr().err
    assert (tmp_path / "notes.features.yaml").read_text() == "my: notes\n"
    # Even one with some of the settings' keys (it was rewritten with the resolved settings, comments lost).
    (tmp_path / "notes.features.yaml").write_text("# tuned by hand\nlayers: all-sum\npool: cls\n")
    with pytest.raises(SystemExit):
        cli.main([str(tmp_path / "notes") if a == str(tmp_path / "f") else a for a in argv])
    assert (tmp_path / "notes.features.yaml").read_text() == "# tuned by hand\nlayers: all-sum\npool: cls\n"
    capsys.readouterr()
    # A parent of --out that is a file: one line, exit 2
    (tmp_path / "afile").write_text("x")
    with pytest.raises(SystemExit) as exc:
        cli.main([str(tmp_path / "afile" / "sub" / "f") if a == str(tmp_path / "f") else a for a in argv])
    assert exc.value.code == 2 and "cannot create --out" in capsys.readouterr().err


def test_cls_and_layer_combinations(minilm_dir, hf_minilm, texts_file, tmp_path):
    texts = texts_file.read_text().splitlines()
    hidden, _, _ = _hf_hidden(hf_minilm, minilm_dir, texts)
    cases = {
        "last4-concat": torch.cat(hidden[3:7], dim=-1),
        "last4-sum": torch.stack(hidden[3:7]).sum(0),
        "all-sum": torch.stack(hidden[1:7]).sum(0),
        "0,-1": torch.cat([hidden[0], hidden[6]], dim=-1),
    }
    for spec, expected in cases.items():
        out = tmp_path / spec
        assert cli.main(["features", "--checkpoint", str(minilm_dir), "--input", str(texts_file), "--out", str(out),
                         f"--layers={spec}", "--pool", "cls"]) == 0
        got = np.load(out.with_name(out.name + ".npy"))
        assert np.abs(got - expected[:, 0].numpy()).max() < 1e-4, spec


def test_per_token_parquet_with_first_subtoken(minilm_dir, hf_minilm, tmp_path):
    texts_file = tmp_path / "in.jsonl"
    texts = ["Kellynch Hall", "Somersetshire baronetage, unquestionably.", "U.S. beat Jean-Pierre 1-0 ."]
    texts_file.write_text("".join(json.dumps({"id": i, "body": t}) + "\n" for i, t in enumerate(texts)))
    base = ["features", "--checkpoint", str(minilm_dir), "--input", str(texts_file), "--text-field", "body", "--pool", "none"]
    assert cli.main(base + ["--out", str(tmp_path / "all")]) == 0
    assert cli.main(base + ["--out", str(tmp_path / "first"), "--first-subtoken"]) == 0
    hidden, _, enc = _hf_hidden(hf_minilm, minilm_dir, texts)
    table = pq.read_table(tmp_path / "all.parquet")
    assert table["row"].to_pylist() == [0, 1, 2]
    for i, e in enumerate(enc):
        n = sum(e.attention_mask)
        assert table["tokens"][i].as_py() == e.tokens[:n]
        feats = np.array(table["features"][i].as_py(), dtype=np.float32)
        assert np.abs(feats - hidden[-1][i, :n].numpy()).max() < 1e-4
    first = pq.read_table(tmp_path / "first.parquet")["tokens"].to_pylist()
    # A word is what whitespace separates, as in CoNLL and fine-tuning's labels: one vector each (`U.S.` was
    # four words by the tokenizer's word ids, `Jean-Pierre` three)
    assert [len(t) for t in first] == [len(t.split()) for t in texts]
    assert first[2] == ["u", "beat", "jean", "1", "."]
    assert all(not tok.startswith("##") and tok not in ("[CLS]", "[SEP]") for row in first for tok in row)


def test_user_errors_are_clear(minilm_dir, texts_file, tmp_path, capsys):
    def fails(*extra):
        with pytest.raises(SystemExit) as exc:
            cli.main(["features", "--checkpoint", str(minilm_dir), "--out", str(tmp_path / "x"), *extra])
        assert exc.value.code == 2
        return capsys.readouterr().err

    assert "not one of" in fails("--input", str(texts_file), "--layers", "top")
    assert "out of range" in fails("--input", str(texts_file), "--layers", "9")
    assert "layer 1 is named twice" in fails("--input", str(texts_file), "--layers", "1,1")  # was accepted
    assert f"input {tmp_path} is a directory; pass one .txt or .jsonl file" in fails("--input", str(tmp_path))
    os.mkfifo(tmp_path / "pipe.txt")  # was "does not exist"
    assert f"input {tmp_path / 'pipe.txt'} is not a regular file (a pipe or a device)" in fails(
        "--input", str(tmp_path / "pipe.txt"))
    with pytest.raises(SystemExit):  # `--out d1/` wrote d1.npy beside d1
        cli.main(["features", "--checkpoint", str(minilm_dir), "--input", str(texts_file), "--out", str(tmp_path)])
    assert f"--out {tmp_path} is a directory; --out names the output files" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"txt": "no"}\n')
    assert "bad.jsonl:2" in fails("--input", str(bad))
    assert "--pool none" in fails("--input", str(texts_file), "--first-subtoken")
    assert ".txt" in fails("--input", str(minilm_dir / "config.json"))
    (tmp_path / "x.features.yaml").mkdir()  # an IsADirectoryError traceback
    assert "x.features.yaml exists and is not a file bertpipe wrote" in fails("--input", str(texts_file))
    # A vocabulary that is not the checkpoint's is refused.
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    for name in ("config.json", "model.safetensors"):
        (ckpt / name).symlink_to(minilm_dir / name)
    (ckpt / "vocab.txt").write_text("".join(f"t{i}\n" for i in range(1000)))  # not this checkpoint's
    with pytest.raises(SystemExit):
        cli.main(["features", "--checkpoint", str(ckpt), "--input", str(texts_file), "--out", str(tmp_path / "y")])
    assert "1000 tokens" in capsys.readouterr().err


def test_output_is_whole_or_absent_and_only_ours_is_replaced(minilm_dir, texts_file, tmp_path, monkeypatch, capsys):
    import launch.finetune.feature_extraction as fe

    base = ["features", "--checkpoint", str(minilm_dir), "--input", str(texts_file), "--batch-size", "16"]
    out = tmp_path / "f"
    assert cli.main([*base, "--out", str(out), "--layers", "last"]) == 0
    assert np.load(tmp_path / "f.npy").shape[1] == 384

    # Interrupted mid-write with other settings: the old features go (the settings no longer describe
    # them) and no part of the new ones appears.
    real = fe.write_pooled

    def interrupted(extractor, texts, path, progress):
        real(extractor, texts[:3], path, progress)
        raise KeyboardInterrupt

    monkeypatch.setattr(fe, "write_pooled", interrupted)
    assert cli.main([*base, "--out", str(out), "--layers", "last4-concat"]) != 0
    assert "interrupted" in capsys.readouterr().err
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("f", ".f"))) == ["f.features.yaml"]

    # The settings of a per-token run do not make a user's own OUT.npy ours.
    assert cli.main([*base, "--out", str(tmp_path / "t"), "--pool", "none"]) == 0
    np.save(tmp_path / "t.npy", np.zeros((3, 5)))
    with pytest.raises(SystemExit):
        cli.main([*base, "--out", str(tmp_path / "t"), "--pool", "mean"])
    assert "t.npy exists and `bertpipe features` did not write it" in capsys.readouterr().err
    assert np.load(tmp_path / "t.npy").shape == (3, 5)


def test_parse_layers_rows_of_table_7():
    assert parse_layers("last", 12).indices == [12]
    assert parse_layers("second-to-last", 12).indices == [11]
    assert parse_layers("last4-concat", 12).indices == [9, 10, 11, 12]
    assert parse_layers("last4-sum", 12).combine == "sum"
    assert parse_layers("all-sum", 12).indices == list(range(1, 13))
    assert parse_layers("embeddings", 12).indices == [0]
    assert parse_layers("1, -1", 12).indices == [1, 12]
    with pytest.raises(ValueError, match="at least 4"):
        parse_layers("last4-sum", 2)


def test_parse_layers_refuses_a_layer_just_past_either_end():
    # On a 2-layer model the hidden states are 0 (embeddings), 1, 2: index 3 or -4 names none of them
    # (an IndexError mid-extraction, after the model was loaded and the texts tokenised).
    assert parse_layers("2", 2).indices == [2] and parse_layers("-3", 2).indices == [0]
    for spec in ("3", "-4", "0,3"):
        with pytest.raises(ValueError, match=r"out of range; the model has layers 0 \(embeddings\) to 2"):
            parse_layers(spec, 2)


def test_features_refuses_a_learned_weighted_sum_instead_of_writing_another_combination(tiny_checkpoint, texts_file,
                                                                                        tmp_path, capsys):
    # all-weighted's weights exist only once trained with a task; `features` would otherwise write some
    # other combination of the layers under that name.
    with pytest.raises(SystemExit) as exc:
        cli.main(["features", "--checkpoint", str(tiny_checkpoint), "--input", str(texts_file),
                  "--out", str(tmp_path / "w"), "--layers", "all-weighted"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--layers all-weighted: its weights are learned with a task" in err and "all-sum" in err
    assert not list(tmp_path.glob("w*"))


@pytest.mark.parametrize("flags", [["--max-seq-len", "1"], ["--batch-size", "0"]])
def test_a_length_or_batch_that_cannot_hold_a_text_is_refused_before_the_model_loads(tiny_checkpoint, texts_file,
                                                                                     tmp_path, capsys, flags):
    # One word piece holds not even [CLS] and [SEP]: every text would come out as a truncated [CLS].
    with pytest.raises(SystemExit) as exc:
        cli.main(["features", "--checkpoint", str(tiny_checkpoint), "--input", str(texts_file),
                  "--out", str(tmp_path / "f"), *flags])
    assert exc.value.code == 2 and "--batch-size must be >= 1 and --max-seq-len >= 2" in capsys.readouterr().err
    assert not list(tmp_path.glob("f*"))


def test_a_second_run_on_the_same_output_is_refused_while_the_first_writes(minilm_dir, texts_file, tmp_path, capsys):
    # Two runs on one --out shared `.OUT.npy.partial`: one renamed the other's file away, and died in a traceback
    import json
    import socket
    import subprocess
    import sys

    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / ".x.bertpipe.lock").write_text(json.dumps(
            {"pid": holder.pid, "host": socket.gethostname(), "command": "features", "since": "then"}))
        with pytest.raises(SystemExit) as exc:
            cli.main(["features", "--checkpoint", str(minilm_dir), "--input", str(texts_file), "--out", str(tmp_path / "x")])
        assert exc.value.code == 2 and f"being written by `bertpipe features` (pid {holder.pid}" in capsys.readouterr().err
        assert not list(tmp_path.glob("x*")) and not list(tmp_path.glob(".x.*partial"))
    finally:
        holder.kill()
        holder.wait()


def test_input_rows_are_the_lines_a_user_counts(tmp_path):
    """A form feed or U+2028 inside a line is text, not a line break: str.splitlines cut there and every
    later row described the wrong line. A byte-order mark is not text."""
    from launch.finetune.feature_extraction import read_texts

    txt = tmp_path / "texts.txt"
    txt.write_bytes(b"\xef\xbb\xbfline one\r\nline two has a form\x0cfeed inside\nline three with \xe2\x80\xa8 LS\nline four\n")
    assert read_texts(txt) == ["line one", "line two has a form\x0cfeed inside", "line three with \u2028 LS", "line four"]
    jsonl = tmp_path / "texts.jsonl"
    jsonl.write_text("\ufeff" + "\n".join(json.dumps({"text": t}, ensure_ascii=False) for t in ("a\u2028b", "c")) + "\n",
                     encoding="utf-8")
    assert read_texts(jsonl) == ["a\u2028b", "c"]


def test_an_out_stem_that_names_a_file_writes_beside_it_and_leaves_it(tiny_checkpoint, tmp_path, capsys):
    # `--out fu/plain`, plain a file of the user's: "--out fu/plain is a file; pass a directory", where --out
    # names the output files (plain.npy, plain.features.yaml) and a directory is refused. plain is never written.
    texts = tmp_path / "texts.txt"
    texts.write_text("the cat sat on the mat\na second line\n")
    plain = tmp_path / "fu" / "plain"
    plain.parent.mkdir()
    plain.write_text("mine")
    argv = ["features", "--checkpoint", str(tiny_checkpoint), "--input", str(texts), "--pool", "mean",
            "--device", "cpu"]
    assert cli.main([*argv, "--out", str(plain)]) == 0, capsys.readouterr().err
    assert plain.read_text() == "mine" and np.load(tmp_path / "fu" / "plain.npy").shape[0] == 2
    assert sorted(p.name for p in plain.parent.iterdir()) == ["plain", "plain.features.yaml", "plain.npy"]
    # The same stem through a link to its folder is the same output (its own earlier output, rewritten).
    (tmp_path / "fulink").symlink_to("fu")
    assert cli.main([*argv, "--out", str(tmp_path / "fulink" / "plain")]) == 0
    assert sorted(p.name for p in plain.parent.iterdir()) == ["plain", "plain.features.yaml", "plain.npy"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
