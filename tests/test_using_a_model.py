"""After training [issue 43]: `encode` gives the vectors the evaluation uses, written a chunk at a
time with a JSON beside them; `search` ranks as a brute-force numpy cosine does; `eval --sts_file`
scores your own pairs as the STS tasks score theirs; `--dev_file` picks the best step on them."""
import argparse
import json
import random

import numpy as np
import pytest

import common
import simcse_min
from tiny_world import make_world, seeded_run_folder, sentence, stsb_dev

FIXTURES = common.Path(__file__).parent / "fixtures"


def cli(argv, capsys):
    common.main_guard(common.cli, argv)
    return capsys.readouterr().out


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("pooler", ["cls_before_pooler", "cls", "avg_first_last"])
def test_encode_gives_the_evaluations_vectors(minilm, model_dir, wiki_path, tmp_path, capsys,
                                              monkeypatch, pooler):
    tok, model = minilm
    lines = wiki_path.read_text(encoding="utf-8").splitlines()[:140] + [""]  # blank: a row too
    expected = common.encode_sentences(model, tok, lines, pooler).numpy()  # as evaluate_sts
    out = tmp_path / "v.npy"
    argv = ["encode", "--model", str(model_dir), "--input", write_lines(tmp_path / "c.txt", lines),
            "--out", str(out), "--pooler", pooler, "--device", "cpu"]
    cli(argv, capsys)  # one chunk: the same batches, the same bits
    assert np.load(out).dtype == np.float32 and (np.load(out) == expected).all()
    monkeypatch.setattr(common, "CHUNK_LINES", 56)  # three chunks, the last one short
    cli(argv + ["--batch_size", "32"], capsys)  # other batches: float32 sums in another order
    assert np.load(out).shape == (141, 384)
    assert np.abs(np.load(out) - expected).max() < 1e-6 * np.abs(expected).max()
    about = json.loads((tmp_path / "v.json").read_text())
    assert about["count"] == 141 and about["pooler"] == pooler and about["model"] == str(model_dir)
    args = argparse.Namespace(model=str(model_dir), pooler=pooler)
    corpus_sha256 = common.sha256_file(tmp_path / "c.txt")
    assert about == {**common.vectors_about(args, model, corpus_sha256, 141),
                     "npy_bytes": out.stat().st_size, "npy_sha256": common.sha256_file(out)}


def brute_force(vectors, queries, k):  # numpy cosines, every row, ranked
    a = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    q = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    sims = q.astype(np.float64) @ a.T.astype(np.float64)  # [Q, N]
    return sims, np.sort(sims, axis=1)[:, ::-1][:, :k]


def test_search_ranks_as_numpy_does_on_twelve_thousand_lines(tmp_path, capsys, monkeypatch):
    seeded_run_folder(tmp_path / "m")  # N(0, 0.3) weights: vectors far apart, few near-ties
    world = {"model": str(tmp_path / "m")}
    rng = random.Random(5)
    corpus = write_lines(tmp_path / "corpus.txt", [sentence(rng) for _ in range(12_000)])
    queries = [sentence(rng) for _ in range(4)]
    monkeypatch.setattr(common, "CHUNK_LINES", 1000)  # twelve chunks merged
    vectors = tmp_path / "v.npy"
    base = ["--model", world["model"], "--corpus", corpus, "--device", "cpu", "--top_k", "7"]
    cli(["encode", "--model", world["model"], "--input", corpus, "--out", str(vectors),
         "--device", "cpu"], capsys)
    for extra in (["--vectors", str(vectors)], []):  # read back, or encoded in memory
        out = cli(["search", *base, *extra, "--queries",
                   write_lines(tmp_path / "q.txt", queries), "--json"], capsys)
        rows = [json.loads(line) for line in out.splitlines()]
        tok = common.Tokenizer.from_pretrained(world["model"])
        model = common.Bert.from_pretrained(world["model"])
        q = common.encode_sentences(model, tok, queries).numpy()
        sims, best = brute_force(np.load(vectors), q, 7)
        for j, query in enumerate(queries):  # ties aside: the same scores, each row's own
            found = [r for r in rows if r["query"] == query]
            assert [r["rank"] for r in found] == list(range(1, 8))
            assert np.allclose([r["score"] for r in found], best[j], atol=1e-5)
            assert np.allclose([sims[j, r["line"] - 1] for r in found], best[j], atol=1e-5)
    text = cli(["search", *base, "--vectors", str(vectors), "--query", queries[0]], capsys)
    assert text.splitlines()[0] == f"query: {queries[0]}" and len(text.splitlines()) == 8


def test_search_refuses_vectors_of_another_model_pooler_or_corpus(tmp_path, capsys):
    world = make_world(tmp_path)
    lines = ["a man is playing .", "a dog runs ."]
    corpus = write_lines(tmp_path / "c.txt", lines)
    cli(["encode", "--model", world["model"], "--input", corpus, "--out",
         str(tmp_path / "v.npy"), "--device", "cpu"], capsys)
    tok = common.Tokenizer.from_pretrained(world["model"])
    model = common.Bert.from_pretrained(world["model"])
    next(model.parameters()).data[0] += 1  # trained again: the same architecture, other weights
    common.save_pretrained(model, tmp_path / "retrained", tok)
    cases = {"weights_sha256": ["--model", str(tmp_path / "retrained"), "--corpus", corpus],
             "pooler": ["--model", world["model"], "--corpus", corpus, "--pooler", "avg"],
             "count": ["--model", world["model"], "--corpus",
                       write_lines(tmp_path / "c3.txt", lines + ["a cat ."])],
             "corpus_sha256": ["--model", world["model"], "--corpus",
                               write_lines(tmp_path / "c2.txt", lines[::-1])]}
    for key, flags in cases.items():
        argv = ["search", *flags, "--vectors", str(tmp_path / "v.npy"), "--query", "a man",
                "--device", "cpu"]
        with pytest.raises(SystemExit) as e:
            common.main_guard(common.cli, argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1 and key in err, (key, err)
    assert cli(["search", "--model", world["model"], "--corpus", corpus, "--vectors",
                str(tmp_path / "v.npy"), "--query", "a man", "--device", "cpu"], capsys)


def write_tsv(path, a, b, gold, header=True):
    rows = [f"{x}\t{y}\t{g}" for x, y, g in zip(a, b, gold)]
    return write_lines(path, ["sentence1\tsentence2\tscore"] * header + rows)


def test_sts_file_of_sts_b_test_gives_the_tables_sts_b(minilm, model_dir, senteval_dir, tmp_path,
                                                       capsys):
    pairs = common.load_sts_split(senteval_dir, "STSBenchmark", "test")
    argv = ["eval", "--model", str(model_dir), "--device", "cpu", "--json",
            str(tmp_path / "r.json")]
    out = cli([*argv, "--sts_file", write_tsv(tmp_path / "stsb-test.tsv", *pairs)], capsys)
    scores = json.loads((tmp_path / "r.json").read_text())["details"]["sts_file"]["test"]
    reference = json.loads((FIXTURES / "pooler_ref.json").read_text())["sts"]  # transformers
    assert scores["spearman"] == pytest.approx(reference["cls_before_pooler"]["STSBenchmark"],
                                               abs=0.01) and scores["n"] == 1379
    assert f"Spearman {scores['spearman']:.2f}, Pearson {scores['pearson']:.2f}, n 1379" in out
    tok, model = minilm  # the table's own path, on 300 pairs: the same numbers to the last bit
    part = tuple(x[:300] for x in pairs)
    cli([*argv, "--sts_file", write_tsv(tmp_path / "part.tsv", *part, header=False)], capsys)
    scores = json.loads((tmp_path / "r.json").read_text())["details"]["sts_file"]["test"]
    table = common.evaluate_sts(model, tok, senteval_dir, "test",
                                tasks={"STSBenchmark": {"test": part}})
    assert scores == table["details"]["STSBenchmark"]["test"]


def test_dev_file_picks_the_best_step_on_its_pairs(tmp_path):
    world = {k: v for k, v in make_world(tmp_path).items() if k != "generator"}
    a, b, gold = stsb_dev(common.resolve_senteval(world["senteval"]))
    runs = {}
    for name, dev_file in (("stsb", ""), ("same", write_tsv(tmp_path / "d.tsv", a, b, gold)),
                           ("flipped", write_tsv(tmp_path / "f.tsv", a, b, 5 - gold, False))):
        runs[name] = simcse_min.train(simcse_min.Config(
            **world, dev_file=dev_file, device="cpu", batch_size=8, max_steps=4, eval_every=1,
            out_dir=str(tmp_path / name)))
    assert runs["same"]["dev_history"] == runs["stsb"]["dev_history"]  # the same pairs
    flipped = [[s, -d] for s, d in runs["flipped"]["dev_history"]]  # Spearman of 5 - gold
    assert np.allclose(flipped, runs["stsb"]["dev_history"], atol=1e-3)
    assert runs["flipped"]["align_uniform_on"].endswith("f.tsv")
    assert "| dev " in (tmp_path / "flipped" / "log.txt").read_text()


def test_dev_file_on_another_scale_says_why_its_align_is_nan(tmp_path):
    """No pair above 4 (scores 0-1): alignment has no positive; said once, not nan unexplained."""
    path = write_tsv(tmp_path / "d.tsv", ["a man runs ."] * 3, ["a dog runs ."] * 3, [0, 0.5, 1])
    logged = []
    run = argparse.Namespace(cfg=argparse.Namespace(dev_file=path), log=logged.append)
    common.read_dev_pairs(run)
    assert len(logged) == 1 and "no pair of" in logged[0] and "align is nan" in logged[0]
