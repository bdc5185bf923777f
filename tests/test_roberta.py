"""RoBERTa (issue 18): byte-level BPE with the ids of Hugging Face's RobertaTokenizer, RoBERTa and a
DistilRoBERTa-shaped masked LM in our Bert with the outputs of RobertaModel / RobertaForMaskedLM,
saved folders in Hugging Face's layout, and every method training on a tiny RoBERTa.

The references are in tests/fixtures (made by tests/fixtures/make_roberta_fixtures.py, the only
place transformers is imported): GPT-2's real 50,000 merges (= roberta-base's merges.txt), the slow
RobertaTokenizer's ids on hard strings and on every STS, SICK and wiki sentence (digests), and two
tiny models' outputs, whose weights both sides draw from numpy's RandomState."""
import json

import numpy as np
import pytest
import torch

import common
import unicodedata
from conftest import FIXTURES
from fixtures.make_roberta_fixtures import (CONFIG_BASE, CONFIG_MLM, bpe_folder, bpe_vocab,
                                            reference_weights)
from test_tokenizer import corpus_sentences, digest

REF = json.loads((FIXTURES / "roberta_tokenizer_ref.json").read_text(encoding="utf-8"))
MODEL_REF = np.load(FIXTURES / "roberta_model_ref.npz")


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """The GPT-2/RoBERTa BPE (50,000 merges) in a folder, read by Tokenizer.from_pretrained."""
    return common.Tokenizer.from_pretrained(bpe_folder(tmp_path_factory.mktemp("bpe") / "roberta"))


def test_a_folder_with_merges_is_read_as_bpe(gpt2):
    assert isinstance(gpt2, common.BPETokenizer) and len(gpt2.vocab) == REF["vocab_size"]
    assert (gpt2.cls_id, gpt2.pad_id, gpt2.sep_id, gpt2.unk_id) == (0, 1, 2, 3)


@pytest.mark.parametrize("case", REF["hard"], ids=lambda c: repr(c["text"])[:40])
def test_hard_strings_match_hugging_face(gpt2, case):
    assert gpt2.encode(case["text"]) == case["ids"]


@pytest.mark.parametrize("case", REF["truncation"],
                         ids=lambda c: f"{c['max_len']}:{c['text'][:20]}")
def test_truncation_matches_hugging_face(gpt2, case):
    assert gpt2.encode(case["text"], case["max_len"]) == case["ids"]


def test_every_corpus_sentence_matches_hugging_face(gpt2, senteval_dir, wiki_path):
    """101,106 sentences of STS12-16, STS-B, SICK and the wiki sample, in digests of 64."""
    wrong = []
    for name, ref in REF["corpora"].items():
        sents = corpus_sentences(name, senteval_dir, wiki_path)
        assert len(sents) == ref["n"], name
        ids = [gpt2.encode(s) for s in sents]
        got = [digest(ids[i:i + ref["chunk"]]) for i in range(0, len(ids), ref["chunk"])]
        wrong += [f"{name} chunk {i}" for i, (a, b) in enumerate(zip(got, ref["digests"]))
                  if a != b]
    assert not wrong, wrong[:10]


def test_letter_and_number_classes_are_the_unicode_categories():
    """\\p{L} and \\p{N} rebuilt from unicodedata: a letter (number) joins the run before it,
    nothing else does, for every code point; \\s is White_Space (\\x1c-\\x1f are not spaces, unlike
    re's \\s)."""
    pattern = common.gpt2_pattern()
    for cp in range(0x110000):
        c, cat = chr(cp), unicodedata.category(chr(cp))
        if cat in ("Cs", "Cn"):
            continue
        assert (pattern.findall("a" + c) == ["a" + c]) == cat.startswith("L"), hex(cp)
        assert (pattern.findall("1" + c) == ["1" + c]) == cat.startswith("N"), hex(cp)
    assert pattern.findall("a\x1cb \u2028c  d") == ["a", "\x1c", "b", " ", "\u2028", "c", " ", " d"]
    assert pattern.findall("I'm 2x½!!") == ["I", "'m", " 2", "x", "½", "!!"]


def test_bpe_merges_every_occurrence_by_rank():
    """GPT-2 joins every occurrence of the best pair in one pass: 'abab' -> ab ab, though (ab a)
    ranks first (merging one occurrence at a time would give aba b); and (a b) before (b c), by
    rank."""
    merges = [("ab", "a"), ("a", "b"), ("b", "c")]
    tok = common.BPETokenizer(bpe_vocab(merges), merges)
    v = tok.vocab
    assert tok.encode("abab") == [0, v["ab"], v["ab"], 2] and tok.encode("abc") == [0, v["ab"],
                                                                                    v["c"], 2]
    assert tok.encode("ab", max_len=2) == [0, 2] and tok.encode("x <mask>") == [0, v["x"],
                                                                                v["<mask>"], 2]


def hf_folder(folder, config, shapes, seed, architecture):
    """A Hugging Face RoBERTa folder with the fixture's weights (the float tensors HF saves)."""
    weights = reference_weights({k: tuple(s) for k, s in shapes.items()
                                 if not k.endswith(("position_ids", "token_type_ids"))}, seed)
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**config, "architectures": [architecture]}))
    common.write_safetensors(folder / "model.safetensors", {k: torch.from_numpy(v) for k, v
                                                            in weights.items()})
    return folder


@pytest.fixture(scope="module")
def roberta_folders(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("roberta-models")
    return (hf_folder(tmp / "base", CONFIG_BASE, json.loads(str(MODEL_REF["keys_base"])), 1,
                      "RobertaModel"),
            hf_folder(tmp / "mlm", CONFIG_MLM, json.loads(str(MODEL_REF["keys_mlm"])), 2,
                      "RobertaForMaskedLM"))


@torch.no_grad()
def test_roberta_matches_hugging_face_on_a_padded_batch(roberta_folders):
    model = common.Bert.from_pretrained(roberta_folders[0], quiet=True).eval()
    ids, mask = torch.from_numpy(MODEL_REF["ids"]), torch.from_numpy(MODEL_REF["mask"])
    # every position, padding included: positions count real tokens from pad + 1
    hidden = model(ids, mask)
    assert (hidden - torch.from_numpy(MODEL_REF["hidden"])).abs().max() < 1e-5


@torch.no_grad()
def test_distilroberta_shaped_mlm_matches_hugging_face(roberta_folders):
    model = common.Bert.from_pretrained(roberta_folders[1], mlm_head=True).eval()
    ids, mask = torch.from_numpy(MODEL_REF["ids"]), torch.from_numpy(MODEL_REF["mask"])
    logits = model.mlm_logits(model(ids, mask))
    assert (logits - torch.from_numpy(MODEL_REF["logits"])).abs().max() < 1e-5


def test_a_roberta_config_whose_padding_leaves_no_position_is_refused(tmp_path):
    config = dict(model_type="roberta", vocab_size=64, hidden_size=32, num_hidden_layers=1,
                  num_attention_heads=2, intermediate_size=64, max_position_embeddings=40,
                  pad_token_id=38)  # positions start at 39: one left
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(common.CheckpointError, match="max_position_embeddings=40, pad_token_id"):
        common.read_config(tmp_path)
