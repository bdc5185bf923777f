"""WordPiece tokenizer: identical ids to Hugging Face's (slow, pure-Python) BertTokenizer, plus
small unit tests.

The Hugging Face ids live in tests/fixtures/tokenizer_ref.json (made by
tests/fixtures/make_fixtures.py, which is the only place transformers is ever imported). The corpus
sentences are extracted here exactly as that script's docstring specifies, tokenized with our
Tokenizer and compared chunk by chunk through sha256 digests.
"""
import hashlib
import json

import pytest

from conftest import FIXTURES

REF = json.loads((FIXTURES / "tokenizer_ref.json").read_text(encoding="utf-8"))

STS_SUBSETS = {  # [make_fixtures.py docstring]
    "STS12": ["MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN", "surprise.SMTnews"],
    "STS13": ["FNWN", "headlines", "OnWN"],
    "STS14": ["deft-forum", "deft-news", "headlines", "images", "OnWN", "tweet-news"],
    "STS15": ["answers-forums", "answers-students", "belief", "headlines", "images"],
    "STS16": ["answer-answer", "headlines", "plagiarism", "postediting", "question-question"],
}


def norm(s):
    return " ".join(s.split())


def read_lines(path):
    return open(path, encoding="utf8").read().splitlines()


def corpus_sentences(name, senteval, wiki):
    """The sentences of one fixture corpus, extracted exactly as tests/fixtures/make_fixtures.py
    describes."""
    group, _, sub = name.partition("/")
    if group in STS_SUBSETS:
        sents = []
        for line in read_lines(senteval / "STS" / f"{group}-en-test" / f"STS.input.{sub}.txt"):
            pair = line.split("\t")
            assert len(pair) == 2, (name, line)
            sents += [norm(pair[0]), norm(pair[1])]
        return sents
    if group == "STSBenchmark":
        return [norm(s) for line in read_lines(senteval / "STS" / "STSBenchmark" / f"{sub}.csv")
                for s in line.strip().split("\t")[5:7]]
    if group == "SICK":
        return [norm(s) for line in read_lines(senteval / "SICK" / sub)[1:] for s
                in line.strip().split("\t")[1:3]]
    assert name == "wiki1m_head", name
    return [line.strip() for line in open(wiki, encoding="utf8") if line.strip()]


def digest(id_lists):
    return hashlib.sha256(json.dumps(id_lists, separators=(",", ":")).encode()).hexdigest()[:16]


@pytest.fixture(scope="module")
def tok(minilm):
    return minilm[0]


def test_fixture_lists_every_corpus():
    expected = {f"{y}/{s}" for y, subs in STS_SUBSETS.items() for s in subs}
    expected |= {f"STSBenchmark/{s}" for s in ("sts-train", "sts-dev", "sts-test")}
    expected |= {f"SICK/{f}" for f in ("SICK_train.txt", "SICK_trial.txt",
                                       "SICK_test_annotated.txt")}
    assert set(REF["corpora"]) == expected | {"wiki1m_head"}


@pytest.mark.parametrize("name", sorted(REF["corpora"]))
def test_corpus_matches_hugging_face(tok, senteval_dir, wiki_path, name):
    ref = REF["corpora"][name]
    sents = corpus_sentences(name, senteval_dir, wiki_path)
    assert (
        len(sents) == ref["n"]
    ), f"{name}: extracted {len(sents)} sentences, the fixture has {ref['n']}"
    size = ref["chunk"]
    ids = [tok.encode(s) for s in sents]
    for k, want in enumerate(ref["digests"]):
        chunk = ids[k * size:(k + 1) * size]
        if digest(chunk) != want:
            lo, hi = k * size, min((k + 1) * size, len(sents))
            suspects = [s for s in sents[lo:hi] if not s.isascii()][:3]
            pytest.fail(f"{name}: chunk {k} (sentences {lo}..{hi - 1}) differs from Hugging Face; "
                        f"its first "
                        f"sentence: {sents[lo]!r}; non-ASCII sentences in it: {suspects!r}")
    assert len(ref["digests"]) == -(-len(sents) // size)


@pytest.mark.parametrize("case", REF["hard"], ids=lambda c: ascii(c["text"])[:40])
def test_hard_strings(tok, case):
    assert tok.encode(case["text"]) == case["ids"], case["text"]


@pytest.mark.parametrize("case", REF["truncation"],
                         ids=lambda c: f"{c['max_len']}-{ascii(c['text'])[:30]}")
def test_truncation_matches_hugging_face(tok, case):
    got = tok.encode(case["text"], case["max_len"])
    assert got == case["ids"]
    assert len(got) <= case["max_len"] and got[-1] == tok.sep_id
