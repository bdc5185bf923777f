"""After training [issue 43]: `encode` gives the vectors the evaluation uses, written a chunk at a
time with a JSON beside them; `search` ranks as a brute-force numpy cosine does; `eval --sts_file`
scores your own pairs as the STS tasks score theirs, its rows read as docs/using-a-model.md writes
them; `--dev_file` picks the best step on them; no traceback after the work (a closed pipe, a file
named as the table's keys) [issue 52]."""
import argparse
import json
import random
import shutil
import subprocess
import sys

import numpy as np
import pytest

import common
import simcse_min
from conftest import FIXTURES, ROOT, cli_output, one_line, tiny_config
from tiny_world import seeded_run_folder, sentence, stsb_dev



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
    cli_output(capsys, argv)  # one chunk: the same batches, the same bits
    assert np.load(out).dtype == np.float32 and (np.load(out) == expected).all()
    monkeypatch.setattr(common, "CHUNK_LINES", 56)  # three chunks, the last one short
    # other batches: float32 sums in another order
    cli_output(capsys, argv + ["--batch_size", "32"])
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
    cli_output(capsys, ["encode", "--model", world["model"], "--input", corpus, "--out",
                        str(vectors), "--device", "cpu"])
    for extra in (["--vectors", str(vectors)], []):  # read back, or encoded in memory
        out = cli_output(capsys, ["search", *base, *extra, "--queries",
                                  write_lines(tmp_path / "q.txt", queries), "--json"])
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
    text = cli_output(capsys, ["search", *base, "--vectors", str(vectors), "--query", queries[0]])
    assert text.splitlines()[0] == f"query: {queries[0]}" and len(text.splitlines()) == 8


def test_search_refuses_vectors_of_another_model_pooler_or_corpus(world, tmp_path, capsys):
    lines = ["a man is playing .", "a dog runs ."]
    corpus = write_lines(tmp_path / "c.txt", lines)
    cli_output(capsys, ["encode", "--model", world["model"], "--input", corpus, "--out",
                        str(tmp_path / "v.npy"), "--device", "cpu"])
    tok = common.Tokenizer.from_pretrained(world["model"])
    model = common.Bert.from_pretrained(world["model"], quiet=True)
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
        assert key in one_line(capsys, argv), key
    assert cli_output(capsys, ["search", "--model", world["model"], "--corpus", corpus,
                               "--vectors", str(tmp_path / "v.npy"), "--query", "a man"])


def write_tsv(path, a, b, gold, header=True):
    rows = [f"{x}\t{y}\t{g}" for x, y, g in zip(a, b, gold)]
    return write_lines(path, ["sentence1\tsentence2\tscore"] * header + rows)


def test_sts_file_of_sts_b_test_gives_the_tables_sts_b(minilm, model_dir, senteval_dir, tmp_path,
                                                       capsys):
    pairs = common.load_sts_split(senteval_dir, "STSBenchmark", "test")
    argv = ["eval", "--model", str(model_dir), "--device", "cpu", "--json",
            str(tmp_path / "r.json")]
    out = cli_output(capsys, [*argv, "--sts_file", write_tsv(tmp_path / "stsb-test.tsv", *pairs)])
    scores = json.loads((tmp_path / "r.json").read_text())["details"]["sts_file"]["test"]
    reference = json.loads((FIXTURES / "pooler_ref.json").read_text())["sts"]  # transformers
    assert scores["spearman"] == pytest.approx(reference["cls_before_pooler"]["STSBenchmark"],
                                               abs=0.01) and scores["n"] == 1379
    assert f"Spearman {scores['spearman']:.2f}, Pearson {scores['pearson']:.2f}, n 1379" in out
    tok, model = minilm  # the table's own path, on 300 pairs: the same numbers to the last bit
    part = tuple(x[:300] for x in pairs)
    part_file = write_tsv(tmp_path / "part.tsv", *part, header=False)
    cli_output(capsys, [*argv, "--sts_file", part_file])
    scores = json.loads((tmp_path / "r.json").read_text())["details"]["sts_file"]["test"]
    table = common.evaluate_sts(model, tok, senteval_dir, "test",
                                tasks={"STSBenchmark": {"test": part}})
    assert scores == table["details"]["STSBenchmark"]["test"]


def test_dev_file_picks_the_best_step_on_its_pairs(world, tmp_path):
    a, b, gold = stsb_dev(common.resolve_senteval(world["senteval"]))
    runs = {}
    for name, dev_file in (("stsb", ""), ("same", write_tsv(tmp_path / "d.tsv", a, b, gold)),
                           ("flipped", write_tsv(tmp_path / "f.tsv", a, b, 5 - gold, False))):
        runs[name] = simcse_min.train(tiny_config(simcse_min, world, tmp_path / name,
                                                  dev_file=dev_file, max_steps=4))
    assert runs["same"]["dev_history"] == runs["stsb"]["dev_history"]  # the same pairs
    flipped = [[s, -d] for s, d in runs["flipped"]["dev_history"]]  # Spearman of 5 - gold
    assert np.allclose(flipped, runs["stsb"]["dev_history"], atol=1e-3)
    assert runs["flipped"]["align_uniform_on"].endswith("f.tsv")
    assert "| dev " in (tmp_path / "flipped" / "log.txt").read_text()


def test_dev_file_on_another_scale_says_why_its_align_is_nan(world, tmp_path):
    """No pair above 4 (scores 0-1): alignment has no positive; said once, not nan unexplained."""
    path = write_tsv(tmp_path / "d.tsv", ["a man runs ."] * 3, ["a dog runs ."] * 3, [0, 0.5, 1])
    simcse_min.train(tiny_config(simcse_min, world, tmp_path / "run", dev_file=path, max_steps=1))
    log = (tmp_path / "run" / "log.txt").read_text()
    assert log.count("align is nan") == 1 and "no pair of" in log, log


def test_no_traceback_after_the_work(world, tmp_path):
    (tmp_path / "c.txt").write_text("a man .\na dog .\nthe sun .\n")
    (tmp_path / "q.txt").write_text("a query .\n" * 3000)  # more than a pipe holds
    search = (f"{sys.executable} common.py search --model {world['model']} --corpus "
              f"{tmp_path / 'c.txt'} --queries {tmp_path / 'q.txt'} --json --device cpu")
    done = subprocess.run(["bash", "-c", f"{search} | head -n 1"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert json.loads(done.stdout)["rank"] == 1 and done.stderr == ""
    for name in ("details", "seconds", "transfer", "sentences_encoded"):  # the table's own keys
        (tmp_path / name).write_text("a man\ta person\t4\na dog\ta cat\t1\nthe sun\ta car\t0\n")
        results = common.main_guard(common.cli, [
            "eval", "--model", world["model"], "--sts_file", str(tmp_path / name), "--device",
            "cpu", "--json", str(tmp_path / "r.json")])
        assert results["details"]["sts_file"]["test"]["n"] == 3


def test_using_a_model_names_a_training_models_parts_not_its_pretraining_heads(world, tmp_path,
                                                                             capsys):
    common.load_encoder(world["model"], "cpu")  # BERT's pooler and MLM head, as released
    assert capsys.readouterr().err == ""
    shutil.copytree(world["model"], tmp_path / "m")
    tensors = common.read_safetensors(tmp_path / "m" / "model.safetensors")
    tensors["discriminator.dense.weight"] = tensors["cls.predictions.bias"]  # DiffCSE's release
    common.write_safetensors(tmp_path / "m" / "model.safetensors", tensors)
    common.load_encoder(str(tmp_path / "m"), "cpu")
    assert "not used from the checkpoint: cls.predictions.bias" in capsys.readouterr().err


@pytest.mark.parametrize("text, why", [
    ("a\tb\t1e309\nc\td\t2\n", "line 1"), ("a\tb\t4,8\nc\td\t2\ne\tf\t3\n", "line 1"),
    ("s1\ts2\tscore\na\tb\t3\nc\td\t3\n", "every pair scores 3"),
    ("a\tb\t1\nc\td\tnan\n", "line 2"), ("a\tb\t1\nc\td\tinf\n", "line 2")])
def test_sts_file_rows(text, why, tmp_path):
    (tmp_path / "p.tsv").write_text(text)
    with pytest.raises(common.UserError, match=why):
        common.read_sts_pairs(tmp_path / "p.tsv", "--sts_file")


def test_a_header_and_line_separators_inside_a_sentence(tmp_path):
    (tmp_path / "p.tsv").write_text("s1\ts2\tscore\na\u2028b\tc\x85d\t1\ne\tf\t2\n")
    a, b, gold = common.read_sts_pairs(tmp_path / "p.tsv", "--sts_file")
    assert len(a) == 2 and list(gold) == [1.0, 2.0]  # two pairs, a header: nothing split
