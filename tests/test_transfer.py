"""SentEval's transfer tasks (issue 29): the order the folds are drawn on, F1, the command line on a
tiny world, and the real folders' sizes (skipped when absent). Parity with SentEval's own code and
scikit-learn's folds: test_transfer_parity.py."""
import json
import random
import shutil

import numpy as np
import pytest

import common
import tiny_world

# each task's splits as SentEval reports them: 'ndev'/'ntest' of its results, recorded in its
# README ("'MR': {'acc': 84.84, 'devacc': 85.15, 'ndev': 10662, 'ntest': 10662}", ...)
REAL_SIZES = {"MR": {"all": 10662}, "CR": {"all": 3775}, "SUBJ": {"all": 10000},
              "MPQA": {"all": 10606}, "SST2": {"train": 67349, "dev": 872, "test": 1821},
              "TREC": {"train": 5452, "test": 500}, "MRPC": {"train": 4076, "test": 1725}}


def test_samples_are_sorted_stably_by_word_count_then_label():
    samples, labels = common.length_order([["a", "b"], ["c"], ["d", "e"], ["f"], ["g"]],
                                          [1, 1, 0, 0, 1])
    assert samples == [["f"], ["c"], ["g"], ["d", "e"], ["a", "b"]]
    assert labels.tolist() == [0, 1, 1, 0, 1]


def test_mrpc_pairs_are_sorted_by_both_word_counts_then_label():
    pairs = [(["a", "b"], ["c"]), (["d"], ["e", "f"]), (["g"], ["h"]), (["i"], ["j"])]
    samples, labels = common.length_order(pairs, [0, 1, 1, 0])
    assert samples == [(["i"], ["j"]), (["g"], ["h"]), (["d"], ["e", "f"]), (["a", "b"], ["c"])]
    assert labels.tolist() == [0, 1, 1, 0]


def test_f1_is_the_positive_classes():
    y, yhat = np.array([1, 1, 0, 0, 1, 0]), np.array([1, 0, 1, 0, 1, 0])
    assert common.f1_percent(y, yhat) == round(100 * 2 * 2 / (2 * 2 + 1 + 1), 2)  # 2 tp, 1 fp, 1 fn
    assert common.f1_percent(y, 1 - y) == 0.0


def test_folds_need_a_class_with_k_members():
    with pytest.raises(ValueError, match="10 folds"):
        common.stratified_kfold(np.array([0, 1] * 4), 10)


def write_transfer_folders(root, n=30, seed=0):
    """Each transfer file in its real format, n samples each: enough for 10 folds. (The formats'
    traps, with SentEval's own reading recorded, are make_transfer_fixtures.py's files.)"""
    rng = random.Random(seed)

    def sentences():
        return [tiny_world.sentence(rng) for _ in range(n)]
    for task, (a, b) in common.BINARY_FILES.items():
        (root / task).mkdir(parents=True)
        for name in (a, b):
            (root / task / name).write_text("\n".join(sentences()) + "\n", encoding="latin-1")
    (root / "SST" / "binary").mkdir(parents=True)
    for split in ("train", "dev", "test"):
        (root / f"SST/binary/sentiment-{split}").write_text(
            "".join(f"{s}\t{rng.randint(0, 1)}\n" for s in sentences()))
    (root / "TREC").mkdir()
    for name in ("train_5500.label", "TREC_10.label"):
        (root / "TREC" / name).write_text("".join(
            f"{common.TREC_CLASSES[i % 6]}:other {s}\n" for i, s in enumerate(sentences())))
    (root / "MRPC").mkdir()
    for split in ("train", "test"):
        (root / f"MRPC/msr_paraphrase_{split}.txt").write_text(
            "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n" + "".join(
                f"{rng.randint(0, 1)}\t{i}\t{i + 1}\t{a}\t{b}\n"
                for i, (a, b) in enumerate(zip(sentences(), sentences()))))


def test_eval_prints_the_sts_and_transfer_tables(world, tmp_path, capsys):
    world["senteval"] = str(shutil.copytree(world["senteval"], tmp_path / "senteval"))
    write_transfer_folders(tmp_path / "senteval")
    out = tmp_path / "scores.json"
    results = common.cli(["eval", "--model", world["model"], "--senteval", world["senteval"],
                          "--tasks", "sts,transfer", "--mode", "fasttest", "--device", "cpu",
                          "--json", str(out)])
    printed = capsys.readouterr().out
    head = " | ".join(f"{t:>7}" for t in [*common.TRANSFER_TASKS, "Avg"])
    assert head in printed and "STS12" in printed
    saved = json.loads(out.read_text())
    assert set(saved["transfer"]) == {*common.TRANSFER_TASKS, "Avg", "details"}
    assert saved["transfer"]["Avg"] == pytest.approx(np.mean(
        [round(results["transfer"][t], 2) for t in common.TRANSFER_TASKS]))
    assert 0 <= saved["transfer"]["details"]["MRPC"]["f1"] <= 100
    assert saved["STS12"] == results["STS12"]


def test_missing_transfer_folders_are_one_line_before_any_work(world):
    with pytest.raises(common.UserError, match=r"incomplete: missing MR/rt-polarity\.pos.*"
                                               r"download senteval"):
        common.cli(["eval", "--model", world["model"], "--senteval", world["senteval"],
                    "--tasks", "transfer", "--device", "cpu"])


def test_a_cut_transfer_file_is_one_line(tmp_path):
    write_transfer_folders(tmp_path)
    (tmp_path / "TREC" / "TREC_10.label").write_text("DESC:manner How ?\nno label here\n")
    with pytest.raises(common.UserError, match=r"TREC/TREC_10\.label is malformed"):
        common.load_transfer(tmp_path, "TREC")


def test_the_real_folders_read_as_senteval_reports_them(senteval_dir):
    if not (senteval_dir / "MR").is_dir():
        pytest.skip(f"no transfer folders in {senteval_dir} (python common.py download senteval)")
    for task, sizes in REAL_SIZES.items():
        splits = common.load_transfer(senteval_dir, task)
        assert {s: len(y) for s, (_, y) in splits.items()} == sizes, task
        assert all(len(x) == len(y) for x, y in splits.values())
