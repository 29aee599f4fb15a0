"""`pipeline.vocab`: the one casing rule, reading, the tokenizer, the embedding-rows check."""

from __future__ import annotations

import json

import pytest

from pipeline.vocab import SPECIAL_TOKENS, Vocab, build_tokenizer, check_embedding_rows, read_vocab_tokens, vocab_is_cased
from repo_paths import VOCAB


def test_bert_base_uncased_is_uncased_although_it_holds_a_capital():
    """bert-base-uncased holds 'ℝ' (a capital letter): "any capital means cased" misread it as cased."""
    vocab = Vocab.read(VOCAB)
    assert any(any(c.isupper() for c in t) for t in vocab.tokens if not t.startswith("["))
    assert vocab.size == 30522 and vocab.lowercase is True


def test_the_rule_is_a_share_of_capitalised_pieces():
    plain = [f"w{i}" for i in range(100)]
    assert not vocab_is_cased([*SPECIAL_TOKENS, *plain[:95], *(f"W{i}" for i in range(5))])  # 5%: uncased
    assert vocab_is_cased([*SPECIAL_TOKENS, *plain[:94], *(f"W{i}" for i in range(6))])  # 6%: cased
    assert not vocab_is_cased(list(SPECIAL_TOKENS))  # special tokens do not count


def test_tokenizer_config_overrides_the_rule_and_an_argument_overrides_both(tmp_path):
    (tmp_path / "vocab.txt").write_bytes(VOCAB.read_bytes())
    assert Vocab.read(tmp_path).lowercase is True
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    assert Vocab.read(tmp_path).lowercase is False
    assert Vocab.read(tmp_path / "vocab.txt", lowercase=True).lowercase is True
    (tmp_path / "tokenizer_config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a JSON object"):
        Vocab.read(tmp_path)


def test_a_declared_casing_the_vocabulary_contradicts_is_followed_and_named_in_one_warning(tmp_path, caplog):
    # do_lower_case false beside an uncased vocabulary: "The Movie" became [UNK] [UNK] without a word, in
    # fine-tuning and in features. Followed (Hugging Face follows it too), and said.
    from launch.finetune.checkpoint import load_tokenizer, open_checkpoint
    from pipeline.vocab import model_lowercase

    (tmp_path / "vocab.txt").write_bytes(VOCAB.read_bytes())
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "vocab_size": 30522}))
    (tmp_path / "model.safetensors").write_bytes(b"")  # open_checkpoint reads the files, not the weights
    assert model_lowercase(tmp_path, read_vocab_tokens(VOCAB.read_text())) is True and not caplog.records
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    with caplog.at_level("WARNING"):
        assert Vocab.read(tmp_path).lowercase is False
        assert load_tokenizer(open_checkpoint(str(tmp_path))).encode("The Movie").tokens == ["[CLS]", "[UNK]", "[UNK]", "[SEP]"]
    assert [r.getMessage() for r in caplog.records] == [
        f"{tmp_path / 'tokenizer_config.json'} says do_lower_case: false, but its vocabulary is uncased: capitalised "
        "words become [UNK] or split into pieces the model did not learn them as; fix do_lower_case if that is not meant"] * 2
    caplog.clear()
    (tmp_path / "vocab.txt").write_text("\n".join([*SPECIAL_TOKENS, "The", "Movie", "the", "movie"]) + "\n")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    with caplog.at_level("WARNING"):
        assert Vocab.read(tmp_path).lowercase is True
    assert "says do_lower_case: true, but its vocabulary is cased: the vocabulary's capitalised pieces are never used" \
        in caplog.text
    # bertpipe's own tokenizer files (an export, a fine-tuned model/) carry the corpus's casing, chosen there
    # (--no-lowercase on lowercased text trains an uncased-looking vocabulary): nothing to warn of.
    caplog.clear()
    (tmp_path / "vocab.txt").write_bytes(VOCAB.read_bytes())
    Vocab.read(tmp_path / "vocab.txt", lowercase=False).write_tokenizer_files(tmp_path, model_max_length=512)
    with caplog.at_level("WARNING"):
        assert Vocab.read(tmp_path).lowercase is False
    assert not caplog.records


def test_a_do_lower_case_that_is_not_a_boolean_is_refused_naming_the_file(tmp_path):
    # A hand-written "false" is a string, and truthy: read either way it could case a cased model's text.
    from pipeline.vocab import declared_lowercase

    (tmp_path / "vocab.txt").write_bytes(VOCAB.read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": "false"}))
    for read in (declared_lowercase, Vocab.read):
        with pytest.raises(ValueError, match=r"tokenizer_config.json: do_lower_case is 'false', not true or false"):
            read(tmp_path)


def test_tokenizer_lowercases_and_strips_accents_exactly_for_uncased():
    tokens = [*SPECIAL_TOKENS, "cafe", "Café", "café", "hello", "Hello"]
    uncased = build_tokenizer(tokens, lowercase=True)
    cased = build_tokenizer(tokens, lowercase=False)
    assert uncased.encode("Hello Café", add_special_tokens=False).tokens == ["hello", "cafe"]
    assert cased.encode("Hello Café", add_special_tokens=False).tokens == ["Hello", "Café"]
    assert cased.encode("x").tokens == ["[CLS]", "[UNK]", "[SEP]"]  # no padding, no truncation


def test_a_vocab_without_the_bert_specials_is_refused(tmp_path):
    bad = tmp_path / "vocab.txt"
    bad.write_text("[PAD]\n[UNK]\nhello\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"lacks \[CLS\] \[SEP\] \[MASK\]"):
        Vocab.read(bad).tokenizer()
    with pytest.raises(ValueError, match="does not exist"):
        Vocab.read(tmp_path / "missing.txt")


def test_more_tokens_than_embedding_rows_is_refused_padding_is_not():
    check_embedding_rows(30522, 30528, vocab="v.txt", model="m")
    with pytest.raises(ValueError, match="v.txt has 30522 tokens but m has 30000 embedding rows"):
        check_embedding_rows(30522, 30000, vocab="v.txt", model="m")


def test_a_vocab_file_with_a_byte_order_mark_reads_like_any_other(tmp_path):
    from pipeline.masking import MaskingVocab

    bom = tmp_path / "vocab.txt"  # Notepad's "UTF-8" saves a BOM: "\ufeff[PAD]" is not [PAD]
    bom.write_bytes("\ufeff".encode() + VOCAB.read_bytes())
    plain = Vocab.read(VOCAB)
    assert Vocab.read(bom).tokens == plain.tokens and plain.tokens[0] == "[PAD]"
    assert Vocab.read(bom).tokenizer().encode("hello").tokens == ["[CLS]", "hello", "[SEP]"]
    assert MaskingVocab.from_vocab_file(bom).special_ids == MaskingVocab.from_vocab_file(VOCAB).special_ids
    assert read_vocab_tokens("\ufeff[PAD]\n[UNK]\n")[0] == "[PAD]"  # text decoded elsewhere
