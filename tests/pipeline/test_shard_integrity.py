"""A damaged shard is named before anything reads it: `corpus inspect --verify` and `pretrain` (issue 11)."""

from __future__ import annotations

import json
import shutil

import pytest

from launch import cli


@pytest.fixture
def damaged(tmp_path, small_corpus):
    """`damage(kind) -> (corpus dir, shard path)`: a copy of the real corpus with one shard flipped or cut."""

    def damage(kind: str):
        corpus = tmp_path / kind
        shutil.copytree(small_corpus, corpus)
        shard = corpus / json.loads((corpus / "manifest.json").read_text())["shards"][0]["path"]
        data = bytearray(shard.read_bytes())
        if kind == "flipped":
            data[len(data) // 2] ^= 0x01  # one bit, in the middle of the record batches
        else:
            data = data[: len(data) - 100]
        shard.write_bytes(bytes(data))
        return corpus, shard

    return damage


def _refused(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("kind", ["flipped", "truncated"])
def test_inspect_verify_and_pretrain_name_the_damaged_shard(kind, damaged, tmp_path, capsys):
    corpus, shard = damaged(kind)
    err = _refused(["corpus", "inspect", str(corpus), "--verify"], capsys)
    assert f"shard {shard} is damaged" in err and err.count("\n") == 1
    err = _refused(["pretrain", "--config", "tiny", "--data", str(corpus), "--out", str(tmp_path / "run")], capsys)
    assert f"shard {shard} is damaged" in err and err.count("\n") == 1
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_inspect_verify_passes_on_an_intact_corpus(small_corpus, capsys):
    assert cli.main(["corpus", "inspect", str(small_corpus), "--verify", "--examples", "0"]) == 0
    assert "verified: all" in capsys.readouterr().out


def test_garbage_manifest_names_its_file(tmp_path, small_corpus, capsys):
    corpus = tmp_path / "c"
    shutil.copytree(small_corpus, corpus)
    (corpus / "manifest.json").write_text("{not json")
    err = _refused(["corpus", "inspect", str(corpus)], capsys)
    assert f"{corpus / 'manifest.json'} is not valid JSON" in err


def test_inspect_reads_the_corpus_as_pretrain_does(tmp_path, small_corpus, capsys):
    """`inspect` decodes with the corpus's own vocabulary only after checking it, and names a shard it
    cannot read even without --verify."""
    corpus = tmp_path / "c"
    shutil.copytree(small_corpus, corpus)
    tokens = (corpus / "vocab.txt").read_text().split("\n")
    i, j = tokens.index("the"), tokens.index("of")
    tokens[i], tokens[j] = tokens[j], tokens[i]  # decodes "wrongly" without a word if unchecked
    (corpus / "vocab.txt").write_text("\n".join(tokens))
    err = _refused(["corpus", "inspect", str(corpus)], capsys)
    assert f"{corpus / 'vocab.txt'} is not the vocabulary the shards were built with" in err
    shutil.copyfile(small_corpus / "vocab.txt", corpus / "vocab.txt")
    first = sorted(corpus.glob("train-*.arrow"))[0]
    first.write_bytes(first.read_bytes()[:1000])
    err = _refused(["corpus", "inspect", str(corpus)], capsys)
    assert f"shard {first} cannot be read" in err and err.count("\n") == 1


def test_inspect_without_verify_refuses_a_shard_whose_lists_point_outside_it(tmp_path, small_corpus, capsys):
    # A list offset out of range: without --verify, `inspect` read past the buffers and died of a segfault
    # (exit 139, no output); a label id beyond the vocabulary was an IndexError traceback.
    import numpy as np
    import pyarrow as pa

    corpus = tmp_path / "c"
    shutil.copytree(small_corpus, corpus)
    manifest = json.loads((corpus / "manifest.json").read_text())
    shard = corpus / next(s["path"] for s in manifest["shards"] if s["split"] == "train" and s["num_instances"])
    with pa.memory_map(str(shard)) as source:
        table = pa.ipc.open_file(source).read_all().combine_chunks()
    i = table.schema.get_field_index("input_ids")
    column = table.column(i).chunk(0)
    offsets = np.frombuffer(column.buffers()[1], dtype=np.int32).copy()
    offsets[2] = 0x7FFFFF00
    bad = pa.ListArray.from_buffers(column.type, len(column), [column.buffers()[0], pa.py_buffer(offsets.tobytes())],
                                    children=[column.values])
    with pa.OSFile(str(shard), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table.set_column(i, table.field(i), pa.chunked_array([bad])))
    err = _refused(["corpus", "inspect", str(corpus)], capsys)
    assert f"shard {shard} cannot be read" in err and "it is damaged" in err and err.count("\n") == 1


def test_a_label_id_beyond_the_vocabulary_is_shown_not_a_traceback():
    from pipeline.inspect_corpus import decode_instance

    row = {"input_ids": [2, 4, 3], "masked_lm_positions": [1], "masked_lm_ids": [40000]}
    assert decode_instance(row, ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]) == "[CLS] [MASK]{<40000>} [SEP]"



def test_verify_shards_names_a_missing_shard_and_a_changed_one(tmp_path):
    # A shard deleted after the corpus was written is named as missing (not a FileNotFoundError traceback
    # from the hasher); one whose bytes changed is named as damaged.
    from pipeline.manifest import sha256_file, verify_shards

    for name, data in (("train-00000-of-00002.arrow", b"first"), ("train-00001-of-00002.arrow", b"second")):
        (tmp_path / name).write_bytes(data)
    manifest = {"shards": [{"path": p.name, "sha256": sha256_file(p)} for p in sorted(tmp_path.glob("*.arrow"))]}
    verify_shards(tmp_path, manifest)
    (tmp_path / "train-00001-of-00002.arrow").write_bytes(b"changed")
    with pytest.raises(ValueError, match=r"train-00001-of-00002.arrow is damaged: its sha256 is not the one in"):
        verify_shards(tmp_path, manifest)
    (tmp_path / "train-00001-of-00002.arrow").unlink()
    with pytest.raises(ValueError, match=r"train-00001-of-00002.arrow listed in manifest.json is missing; the "
                                         r"corpus is incomplete"):
        verify_shards(tmp_path, manifest, threads=1)
