"""SentEval's files as SentEval reads them (empty gold lines, STS-B and SICK columns, malformed and
missing files), then the real data: pair counts, order restored, the official numbers, the dev
set. The oracles: SentEval's own reading of each format, the real pair counts and the official
numbers."""
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

import common
from conftest import ROOT
from test_sts import OFFICIAL_AVG, slice_senteval, write
from tiny_world import stsb_dev


# ---- SentEval file parsing -----------------------------------------------------------------------

def test_empty_gold_lines_are_dropped_and_pairs_stay_aligned(tmp_path):
    folder = tmp_path / "STS" / "STS16-en-test"
    write(folder / "STS.input.toy.txt", ["s0 a\ts0 b", "s1 a\ts1 b", "s2  a\t s2 b ", "s3 a\ts3 b",
                                         "s4 a\ts4 b"])
    write(folder / "STS.gs.toy.txt", ["4.0", "", "2.5", "", "1"])
    a, b, gold = common.load_sts_subset(tmp_path, "STS16", "toy")
    # whitespace re-joined with single spaces, as SentEval's batcher
    assert a == ["s0 a", "s2 a", "s4 a"]
    assert b == ["s0 b", "s2 b", "s4 b"]
    np.testing.assert_array_equal(gold, [4.0, 2.5, 1.0])


def test_stsb_and_sick_parsing(tmp_path):
    write(tmp_path / "STS/STSBenchmark/sts-test.csv", [
        "main-captions\tMSRvid\t2012test\t0001\t2.500\tA man is  playing.\tA man plays.",
        "main-news\theadlines\t2015\t0002\t0.000\tFirst one\tSecond one",
    ])
    a, b, y = common.load_sts_split(tmp_path, "STSBenchmark", "test")
    assert a == ["A man is playing.", "First one"] and b == ["A man plays.", "Second one"]
    np.testing.assert_array_equal(y, [2.5, 0.0])
    write(tmp_path / "SICK/SICK_trial.txt", [
        "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment",
        "4\tThe boys are playing\tNo boy is playing\t3.6\tCONTRADICTION",
        "24\tA person rides\tA person is riding\t4.9\tENTAILMENT",
    ])
    a, b, y = common.load_sts_split(tmp_path, "SICKRelatedness", "dev")  # dev = SICK trial
    assert a == ["The boys are playing", "A person rides"] and b == ["No boy is playing",
                                                                     "A person is riding"]
    np.testing.assert_array_equal(y, [3.6, 4.9])


# cut
@pytest.mark.parametrize("row", ["main-captions\tMSRvid\t2012test\t0001\t2.500\tA man is playing.",
                                 # bad score
                                 "main-news\theadlines\t2015\t0002\tfive\tFirst one\tSecond one"])
def test_malformed_file_is_a_one_line_error_naming_it(tmp_path, row):
    write(tmp_path / "STS/STSBenchmark/sts-dev.csv", ["main-news\theadlines\t2015\t0001\t1.0\tA\tB",
                                                      row])
    with pytest.raises(common.UserError, match=r"sts-dev\.csv is malformed") as e:
        common.load_sts_split(tmp_path, "STSBenchmark", "dev")
    assert "\n" not in str(e.value) and "download senteval" in str(e.value)


def test_check_senteval_lists_missing_files(tmp_path):
    write(tmp_path / "STS/STSBenchmark/sts-test.csv", ["x\tx\tx\tx\t1\ta\tb"])
    with pytest.raises(common.UserError) as e:
        common.check_senteval(tmp_path, "test")
    msg = str(e.value)
    assert "missing" in msg and "STS/STS12-en-test/STS.input.MSRpar.txt" in msg
    assert "sts-test.csv" not in msg  # present, so not listed
    assert "python common.py download senteval" in msg and "\n" not in msg
    with pytest.raises(common.UserError, match="SICK/SICK_trial.txt"):
        common.check_senteval(tmp_path, "dev")


def test_cli_incomplete_senteval_is_one_line_error(tmp_path, model_dir):
    (tmp_path / "STS").mkdir()
    r = subprocess.run([sys.executable, "common.py", "eval", "--model", str(model_dir),
                        "--senteval", str(tmp_path),
                        "--device", "cpu"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error:")
    assert "python common.py download senteval" in lines[0]


def test_cli_dev_mode_needs_only_the_dev_files(tmp_path, senteval_dir, model_dir):
    # `eval --mode dev` reads STS-B dev and SICK trial only; a folder holding just those must be
    # enough. KNOWN BUG (common.py): resolve_senteval() checks the test-mode files before run_eval's
    # mode-aware check.
    slice_senteval(tmp_path, senteval_dir, 10, mode_files=common.sts_files("dev"))
    res = common.cli(["eval", "--model", str(model_dir), "--senteval", str(tmp_path), "--mode",
                      "dev",
                      "--device", "cpu"])
    assert set(res) == {"STSBenchmark", "SICKRelatedness", "details"}


# ---- real data -----------------------------------------------------------------------------------

def test_real_pair_counts(senteval_dir):
    expected = {"STS12": 3108, "STS13": 1500, "STS14": 3750, "STS15": 3000, "STS16": 1186,
                "STSBenchmark": 1379, "SICKRelatedness": 4927}
    tasks = common.load_sts(senteval_dir, "test")
    assert list(tasks) == common.TEST_TASKS
    for task, subsets in tasks.items():
        for a, b, gold in subsets.values():
            assert len(a) == len(b) == len(gold) and np.isfinite(gold).all()
        assert sum(len(g) for _, _, g in subsets.values()) == expected[task], task
    for task, subsets in common.load_sts(senteval_dir, "test").items():
        if task in common.STS_YEARS:
            assert list(subsets) == common.STS_YEARS[task]
    dev = common.load_sts(senteval_dir, "dev")
    assert {t: len(s["dev"][2]) for t, s in dev.items()} == {"STSBenchmark": 1500,
                                                             "SICKRelatedness": 500}


@pytest.mark.parametrize("pooler", ["cls_before_pooler", "cls", "avg"])
def test_encode_sentences_restores_order(minilm, pooler):
    tok, model = minilm
    sentences = ["a man is playing a guitar .", "hi", "the quick brown fox jumps over the lazy dog "
                                                      "near the river bank",
                 "a woman is slicing an onion .", "two dogs run", "a man is playing a guitar .",
                 "stocks fell sharply on tuesday after the central bank raised interest rates "
                 "again", "ok then",
                 "a child rides a horse on the beach at sunset", "birds"]
    order = np.random.default_rng(0).permutation(len(sentences))
    shuffled = [sentences[i] for i in order]
    batched = common.encode_sentences(model, tok, shuffled, pooler, batch_size=3)  # 4 batches
    alone = torch.cat([common.encode_sentences(model, tok, [s], pooler, batch_size=1) for s
                       in shuffled])
    assert batched.shape == (len(sentences),
                             model.cfg.hidden_size) and batched.dtype == torch.float32
    torch.testing.assert_close(batched, alone, atol=1e-5, rtol=0)


def test_official_number_stsb_test_avg(minilm, senteval_dir):
    tok, model = minilm
    tasks = {"STSBenchmark": {"test": common.load_sts_split(senteval_dir, "STSBenchmark", "test")}}
    res = common.evaluate_sts(model, tok, senteval_dir, pooler="avg", tasks=tasks)
    assert res["STSBenchmark"] == pytest.approx(OFFICIAL_AVG["STSBenchmark"], abs=0.02)


def test_official_number_sts13_all_avg(minilm, senteval_dir):
    tok, model = minilm
    tasks = {"STS13": {s: common.load_sts_subset(senteval_dir, "STS13", s) for s
                       in common.STS_YEARS["STS13"]}}
    res = common.evaluate_sts(model, tok, senteval_dir, pooler="avg", tasks=tasks)
    assert res["STS13"] == pytest.approx(OFFICIAL_AVG["STS13"], abs=0.02)
    # 'all' really differs from the mean here
    assert abs(res["details"]["STS13"]["mean"] - res["STS13"]) > 1


def test_devset_equals_evaluate_sts_dev(minilm, senteval_dir, tmp_path):
    # a slice of the real files (200 STS-B dev pairs) keeps this fast; the full dev set is in
    # bench_eval.py
    tok, model = minilm
    root = slice_senteval(tmp_path, senteval_dir, 10, sizes={"STS/STSBenchmark/sts-dev.csv": 200},
                          mode_files=common.sts_files("dev"))
    dev_set = common.DevSet(tok, stsb_dev(root), model.cfg.max_tokens)
    dev = common.evaluate_dev(model, dev_set)["stsb_dev"]
    res = common.evaluate_sts(model, tok, root, mode="dev", pooler="cls_before_pooler")
    assert dev == pytest.approx(res["STSBenchmark"], abs=1e-6)
    assert res["details"]["STSBenchmark"]["dev"]["n"] == 200


def test_cli_json_dev_keys(minilm, senteval_dir, model_dir, tmp_path):
    # a slice of every real file, so that the folder is complete but tiny
    root = slice_senteval(tmp_path / "senteval", senteval_dir, 20)
    out = tmp_path / "dev.json"
    r = subprocess.run([sys.executable, "common.py", "eval", "--model", str(model_dir),
                        "--senteval", str(root),
                        "--mode", "dev", "--device", "cpu", "--json", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "STS-B" in r.stdout and "SICK-R" in r.stdout
    data = json.loads(out.read_text())
    assert set(data) == {"STSBenchmark", "SICKRelatedness", "details"}
    # the same numbers as in-process
    tok, model = minilm
    res = common.evaluate_sts(model, tok, root, mode="dev", pooler="cls_before_pooler")
    assert data["STSBenchmark"] == pytest.approx(res["STSBenchmark"], abs=1e-6)
    assert data["SICKRelatedness"] == pytest.approx(res["SICKRelatedness"], abs=1e-6)


def test_cli_json_into_a_new_folder(minilm, senteval_dir, model_dir, tmp_path):
    # --json runs/x/dev.json with runs/x not there yet: written (or refused up front), never a
    # traceback after the whole evaluation. KNOWN BUG (common.py): atomic_write's mkstemp raises
    # FileNotFoundError at the end.
    root = slice_senteval(tmp_path / "senteval", senteval_dir, 10,
                          mode_files=common.sts_files("test")
                          + common.sts_files("dev"))
    out = tmp_path / "runs" / "x" / "dev.json"
    common.cli(["eval", "--model", str(model_dir), "--senteval", str(root), "--mode", "dev",
                "--device", "cpu",
                "--json", str(out)])
    assert set(json.loads(out.read_text())) == {"STSBenchmark", "SICKRelatedness", "details"}
