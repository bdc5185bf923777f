"""STS evaluation: Spearman, the 'all' setting, SentEval file parsing, encoding order, official
numbers, CLI.

Fast on purpose: the full 7-task table (~2 min on a CPU) lives in tests/tools/bench/bench_eval.py;
here the real model is checked against the official numbers on the two cheapest tasks only (STS-B
test and STS13). The oracles: scipy's Spearman, numpy's cosine, and the official numbers.
"""
import numpy as np
import pytest
import scipy.stats
import torch

import common

# Official SimCSE evaluation.py --pooler avg --mode test on all-MiniLM-L6-v2
# (../shared/data/README.md)
OFFICIAL_AVG = {"STS13": 80.60, "STSBenchmark": 82.03}


# ---- helpers -------------------------------------------------------------------------------------

def write(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf8")


def slice_senteval(dst, src, n, sizes=None, mode_files=None):
    """A SentEval-layout copy of `src` with only the first n pairs of each file (SICK keeps its
    header)."""
    sizes = sizes or {}
    files = mode_files if mode_files is not None else sorted(set(common.sts_files("test")
                                                                 + common.sts_files("dev")))
    for rel in files:
        lines = (src / rel).read_text("utf8").splitlines()
        k = sizes.get(rel, n) + (1 if rel.startswith("SICK/") else 0)
        write(dst / rel, lines[:k])
    return dst


class FakeEncoder:
    """Stands in for common.encode_sentences: each sentence's vector is looked up in a dict
    (controlled cosines)."""

    def __init__(self, vectors):
        self.vectors = vectors

    def __call__(self, model, tok, sentences, pooler="cls_before_pooler", batch_size=128,
                 id_lists=None, progress=None):
        return torch.tensor(np.array([self.vectors[s] for s in sentences]), dtype=torch.float32)


def pairs_with_cosines(prefix, cosines, gold):
    """(A, B, gold) whose pair i has cosine exactly cosines[i], plus the sentence -> vector
    table."""
    vectors, a, b = {}, [], []
    for i, c in enumerate(cosines):
        a.append(f"{prefix} a {i}")
        b.append(f"{prefix} b {i}")
        vectors[a[-1]] = [1.0, 0.0]
        vectors[b[-1]] = [c, np.sqrt(1 - c * c)]
    return (a, b, np.array(gold, dtype=float)), vectors


# ---- Spearman on hand-computable toys ------------------------------------------------------------

def test_spearman_monotone_reversed_and_ties():
    assert common.score_pairs(np.array([0.1, 0.5, 0.7, 0.9]), np.array([1, 2, 3,
                                                                        4.0]))["spearman"] == \
        pytest.approx(100)
    # monotone but not linear: Spearman 100, Pearson below
    s = common.score_pairs(np.array([1, 2, 3, 100.0]), np.array([1, 2, 3, 4.0]))
    assert s["spearman"] == pytest.approx(100) and s["pearson"] < 99 and s["n"] == 4
    assert common.score_pairs(np.array([0.9, 0.7, 0.5, 0.1]), np.array([1, 2, 3,
                                                                        4.0]))["spearman"] == \
        pytest.approx(-100)
    # ties get average ranks: pred ranks [1, 2.5, 2.5, 4] vs gold ranks [1, 2, 3, 4]
    # -> Pearson of ranks = 4.5 / sqrt(4.5 * 5) = sqrt(0.9)
    tied = common.score_pairs(np.array([1, 2, 2, 3.0]), np.array([1, 2, 3, 4.0]))
    assert tied["spearman"] == pytest.approx(100 * np.sqrt(0.9), abs=1e-9)
    # the gold scale does not matter (golds are not normalised)
    assert common.score_pairs(np.array([0.3, 0.1, 0.2]), np.array([50, 10, 30.0]))[
        "spearman"
    ] == pytest.approx(100)


def test_cosine_matches_numpy_and_zero_vector_is_zero():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(5, 7, generator=g), torch.randn(5, 7, generator=g)
    expected = [float(np.dot(x, y) / np.linalg.norm(x) / np.linalg.norm(y)) for x, y
                in zip(a.numpy(), b.numpy())]
    np.testing.assert_allclose(common.cosine(a, b), expected, atol=1e-6)
    assert common.cosine(torch.zeros(1, 3), torch.ones(1, 3))[0] == 0  # nan_to_num, as SentEval


# ---- 'all' (subsets concatenated) is what STS12-16 report, not the mean of subsets ---------------

def test_all_is_concatenation_not_mean_controlled(monkeypatch):
    # subset A: perfectly ranked, high gold, low cosines; subset B: perfectly ranked, low gold, high
    # cosines
    sub_a, va = pairs_with_cosines("A", [0.1, 0.2, 0.3], [3, 4, 5])
    sub_b, vb = pairs_with_cosines("B", [0.7, 0.8, 0.9, 0.95], [0, 1, 2, 2.5])
    monkeypatch.setattr(common, "encode_sentences", FakeEncoder({**va, **vb}))
    res = common.evaluate_sts(None, None, None, tasks={"STS12": {"A": sub_a, "B": sub_b}})
    d = res["details"]["STS12"]
    assert d["A"]["spearman"] == pytest.approx(100) and d["B"]["spearman"] == pytest.approx(100)
    assert d["mean"] == pytest.approx(100) and d["wmean"] == pytest.approx(100)
    # by hand: pred ranks 1..7, gold ranks [5, 6, 7, 1, 2, 3, 4]; d = [-4]*3 + [3]*4; sum d^2 = 84
    assert res["STS12"] == pytest.approx(100 * (1 - 6 * 84 / (7 * 48)))  # -50
    assert d["all"]["n"] == 7 and "Avg" not in res


def test_wmean_weights_by_subset_size(monkeypatch):
    sub_a, va = pairs_with_cosines("A", [0.1, 0.2, 0.3], [3, 2, 1])        # -100, n = 3
    sub_b, vb = pairs_with_cosines("B", [0.4, 0.5, 0.6, 0.7], [1, 2, 3, 4])  # +100, n = 4
    monkeypatch.setattr(common, "encode_sentences", FakeEncoder({**va, **vb}))
    d = common.evaluate_sts(None, None, None, tasks={"STS15": {"A": sub_a,
                                                               "B": sub_b}})["details"]["STS15"]
    assert d["mean"] == pytest.approx(0) and d["wmean"] == pytest.approx(100 / 7)


def test_avg_is_mean_of_rounded_task_scores(monkeypatch):
    vectors, tasks = {}, {}
    rng = np.random.default_rng(0)
    for t in common.TEST_TASKS:
        sub, v = pairs_with_cosines(t, rng.uniform(-1, 1, 9), rng.uniform(0, 5, 9))
        vectors.update(v)
        tasks[t] = {"x": sub} if t in common.STS_YEARS else {"test": sub}
    monkeypatch.setattr(common, "encode_sentences", FakeEncoder(vectors))
    res = common.evaluate_sts(None, None, None, mode="test", tasks=tasks)
    assert set(res) == {*common.TEST_TASKS, "Avg", "details"}
    assert res["Avg"] == pytest.approx(np.mean([round(res[t], 2) for t in common.TEST_TASKS]),
                                       abs=1e-12)


def tiny_model_and_tokenizer():
    words = (
        "a man woman dog cat is are playing eating riding the guitar horse bike food on in with"
        .split()
    )
    vocab = {t: i for i, t in enumerate([*common.SPECIAL_TOKENS, *words, "."])}
    torch.manual_seed(0)
    model = common.Bert(common.BertConfig.tiny(vocab_size=len(vocab))).eval()
    return common.Tokenizer(vocab), model, words


def test_all_is_concatenation_with_a_tiny_bert():
    tok, model, words = tiny_model_and_tokenizer()
    rng = np.random.default_rng(1)

    def sentence():
        return " ".join(rng.choice(words, rng.integers(2, 9))) + " ."

    def subset(n, offset):
        return (
            [sentence() for _ in range(n)],
            [sentence() for _ in range(n)],
            rng.uniform(0, 2.5, n) + offset,
        )

    tasks = {"STS12": {"subA": subset(25, 0.0), "subB": subset(30, 2.5)}}
    res = common.evaluate_sts(model, tok, None, pooler="cls_before_pooler", batch_size=8,
                              tasks=tasks)

    def alone(s):  # one sentence, no padding: raw last-layer [CLS]
        ids, mask = tok([s])
        with torch.no_grad():
            return model(ids, mask)[0, 0].double().numpy()

    preds, golds, per_subset = [], [], []
    for a, b, gold in tasks["STS12"].values():
        p = [float(np.dot(alone(x), alone(y)) / np.linalg.norm(alone(x)) / np.linalg.norm(alone(y)))
             for x, y in zip(a, b)]
        preds += p
        golds += list(gold)
        per_subset.append(100 * scipy.stats.spearmanr(p, gold)[0])
    expected_all = 100 * scipy.stats.spearmanr(preds, golds)[0]
    d = res["details"]["STS12"]
    assert res["STS12"] == pytest.approx(expected_all, abs=1e-6)
    assert d["mean"] == pytest.approx(np.mean(per_subset), abs=1e-6)
    assert abs(res["STS12"] - d["mean"]) > 1  # the reported number is not the mean of the subsets
    assert res["details"]["sentences_encoded"] == len({s for a, b, _ in tasks["STS12"].values()
                                                       for s in a + b})
