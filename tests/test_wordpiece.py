"""WordPiece on a hand-built vocabulary (longest match, [UNK], case, accents, punctuation, CJK,
special tokens, truncation), vocab.txt and tokenizer_config.json read. The oracle: WordPiece's rules
(BERT's tokenizer) on a vocabulary small enough to work by hand."""
import json

import pytest
import torch

import common


# ---- a hand-built mini vocabulary ----------------------------------------------------------------

MINI = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un", "##aff", "##able", "want", "##want",
        "##ed", "wa",
        "runn", "##ing", ",", ".", "!", "$", "hello", "Hello", "world", "cafe", "Café", "我",
        "爱", "a", "##a", "b",
        "c", "d"]
V = {t: i for i, t in enumerate(MINI)}
PAD, UNK, CLS, SEP, MASK = range(5)


@pytest.fixture
def mini():
    return common.Tokenizer(dict(V))


def pieces(tok, text):
    inverse = {i: t for t, i in tok.vocab.items()}
    return [inverse[i] for i in tok.encode(text)[1:-1]]


def test_special_ids(mini):
    assert (mini.pad_id, mini.unk_id, mini.cls_id, mini.sep_id, mini.mask_id) == (PAD, UNK, CLS,
                                                                                  SEP, MASK)


def test_wordpiece_longest_match(mini):
    assert pieces(mini, "unaffable") == ["un", "##aff", "##able"]
    assert pieces(mini, "unwanted running") == ["un", "##want", "##ed", "runn", "##ing"]


def test_unknown_word_is_one_unk(mini):
    assert pieces(mini, "xyz") == ["[UNK]"]
    # one unknown stretch: the whole word is [UNK]
    assert pieces(mini, "unxyz hello") == ["[UNK]", "hello"]


def test_lower_case_and_accents(mini):
    assert pieces(mini, "UnAffABLE HELLO") == ["un", "##aff", "##able", "hello"]
    # accents stripped, precomposed or combining
    assert pieces(mini, "CAFÉ café cafe\u0301") == ["cafe"] * 3


def test_punctuation_and_whitespace(mini):
    assert pieces(mini, "hello,world!") == ["hello", ",", "world", "!"]
    assert pieces(mini, "$a.b") == ["$", "a", ".", "b"]  # ASCII symbols are punctuation too
    assert pieces(mini, " \thello\n\r\u00a0world  ") == ["hello", "world"]
    assert pieces(mini, "hel\x00lo\u200b") == ["hello"]  # control / format characters dropped


def test_cjk_characters_are_words(mini):
    assert pieces(mini, "我爱") == ["我", "爱"]
    assert pieces(mini, "hello我world") == ["hello", "我", "world"]


def test_special_token_strings_kept_whole(mini):
    assert pieces(mini, "hello [MASK] world") == ["hello", "[MASK]", "world"]
    assert pieces(mini, "hello[MASK].") == ["hello", "[MASK]", "."]


def test_call_places_cls_sep_and_padding(mini):
    ids, mask = mini(["hello", "hello world ."])
    assert ids.dtype == mask.dtype == torch.long
    assert ids.tolist() == [[CLS, V["hello"], SEP, PAD, PAD], [CLS, V["hello"], V["world"], V["."],
                                                               SEP]]
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert mini.encode("") == [CLS, SEP]


def test_max_len_truncation_keeps_sep(mini):
    assert mini.encode("a b c d", max_len=4) == [CLS, V["a"], V["b"], SEP]
    assert mini.encode("unaffable", max_len=3) == [CLS, V["un"], SEP]
    assert mini.encode("a b", max_len=10) == [CLS, V["a"], V["b"], SEP]
    ids, mask = mini(["a b c d e", "a"], max_len=4)
    assert ids.tolist() == [[CLS, V["a"], V["b"], SEP], [CLS, V["a"], SEP, PAD]]
    assert mask.tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]


def test_word_longer_than_100_chars_is_unk(mini):
    assert pieces(mini, "a" * 100) == ["a"] + ["##a"] * 99
    assert pieces(mini, "a" * 101) == ["[UNK]"]
    assert pieces(mini, "b " + "a" * 101 + " c") == ["b", "[UNK]", "c"]


def write_folder(path, config=None):
    path.mkdir()
    (path / "vocab.txt").write_text("".join(t + "\n" for t in MINI), encoding="utf-8")
    if config is not None:
        (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


def test_do_lower_case_false_from_tokenizer_config(tmp_path):
    cased = common.Tokenizer.from_pretrained(write_folder(tmp_path / "cased",
                                                          {"do_lower_case": False}))
    assert cased.vocab == V
    # no lower-casing, accents kept
    assert pieces(cased, "Hello hello Café") == ["Hello", "hello", "Café"]
    # no tokenizer_config.json
    uncased = common.Tokenizer.from_pretrained(write_folder(tmp_path / "uncased"))
    assert pieces(uncased, "Hello hello Café") == ["hello", "hello", "cafe"]


def test_vocab_without_final_newline_keeps_its_last_token(tmp_path):
    folder = write_folder(tmp_path / "v")
    # no newline after the last token
    (folder / "vocab.txt").write_text("\n".join(MINI), encoding="utf-8")
    # as Hugging Face's load_vocab reads it
    assert common.Tokenizer.from_pretrained(folder).vocab == V


def test_vocab_without_special_tokens_is_refused(tmp_path):
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "vocab.txt").write_text("hello\nworld\n", encoding="utf-8")
    with pytest.raises(common.CheckpointError, match="special tokens"):
        common.Tokenizer.from_pretrained(folder)
