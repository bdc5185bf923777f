"""No numbers from a broken model or broken labels [issue 40]: NaN or inf vectors are refused in
encode_sentences, so eval (STS and transfer), encode and search refuse them before any table;
transfer labels are checked against each task's classes as SentEval's files hold them (binary 0/1,
TREC's six) before any fit; files too small for the folds are one line naming the task and the
count; a refs/main that is not UTF-8 in the Hugging Face cache is passed over."""
import shutil

import pytest
import torch

import common
from test_transfer import write_transfer_folders
from tiny_world import tokenizer


@pytest.fixture(scope="module")
def world(tiny_world, tmp_path_factory):
    """The tiny world, its SentEval folder copied with the transfer tasks' beside the STS files,
    and a corpus."""
    tmp = tmp_path_factory.mktemp("broken-models")
    shutil.copytree(tiny_world["senteval"], tmp / "senteval")
    write_transfer_folders(tmp / "senteval")
    (tmp / "corpus.txt").write_text("a man plays .\na dog runs .\n")
    return dict(tiny_world) | {"senteval": str(tmp / "senteval"), "tmp": tmp}


@pytest.fixture(scope="module", params=[float("nan"), float("inf")], ids=["nan", "inf"])
def broken(world, request):
    model = common.Bert.from_pretrained(world["model"])
    with torch.no_grad():
        model.embeddings.word_embeddings.weight[5:].fill_(request.param)
    folder = world["tmp"] / f"broken-{request.param}"
    common.save_pretrained(model, folder, tokenizer())
    return str(folder)


@pytest.mark.parametrize("command", [
    ["eval", "--tasks", "sts", "--senteval", "SENTEVAL"],
    ["eval", "--tasks", "transfer", "--mode", "fasttest", "--senteval", "SENTEVAL"],
    ["encode", "--input", "CORPUS", "--out", "OUT/v.npy"],
    ["search", "--corpus", "CORPUS", "--query", "a man"]])
def test_a_broken_models_vectors_are_refused_before_any_table(world, broken, command, tmp_path,
                                                              capsys):
    """Before: a null STS table but a full transfer table (Avg 44.29), exit 0."""
    names = {"CORPUS": str(world["tmp"] / "corpus.txt"), "OUT": str(tmp_path),
             "SENTEVAL": world["senteval"]}
    args = [names.get(a.split("/")[0], a.split("/")[0]) + a[len(a.split("/")[0]):]
            for a in command]
    with pytest.raises(common.UserError, match="non-finite sentence vectors"):
        common.cli([*args, "--model", broken, "--device", "cpu"])
    assert "|" not in capsys.readouterr().out  # no table
    assert not (tmp_path / "v.npy").exists()


def evaluate_transfer(world, task):
    return common.evaluate_transfer(common.Bert.from_pretrained(world["model"]),
                                    tokenizer(), world["senteval"], "fasttest", tasks=(task,))


@pytest.mark.parametrize("task, rel, edit, said", [
    ("SST2", "SST/binary/sentiment-train", lambda t: t.replace("\t1\n", "\t2\n", 1), r"\[2\]"),
    ("SST2", "SST/binary/sentiment-dev", lambda t: t.replace("\t0\n", "\t-1\n", 1), r"\[-1\]"),
    ("MRPC", "MRPC/msr_paraphrase_train.txt",
     lambda t: t.replace("\n1\t", "\n99999999\t", 1), r"\[99999999\]"),
    ("MRPC", "MRPC/msr_paraphrase_test.txt", lambda t: t.replace("\n0\t", "\n-1\t", 1),
     r"\[-1\]")])
def test_labels_outside_a_tasks_classes_are_one_line_before_any_fit(world, task, rel, edit, said,
                                                                    tmp_path, monkeypatch):
    """Before: a label 2 was scored as a third class; 99,999,999 built a classifier that size."""
    root = tmp_path / "senteval"
    write_transfer_folders(root)
    (root / rel).write_text(edit((root / rel).read_text()))
    world = world | {"senteval": str(root)}
    monkeypatch.setattr(common, "fit_logregs", None)  # any fit would be a TypeError
    with pytest.raises(common.UserError, match=f"{rel} is malformed.*labels {said} outside 0-1"):
        evaluate_transfer(world, task)


def test_a_trec_label_outside_its_six_is_one_line(world, tmp_path):
    root = tmp_path / "senteval"
    write_transfer_folders(root)
    (root / "TREC/TREC_10.label").write_text("WHAT:other How far is it ?\n")
    with pytest.raises(common.UserError, match="TREC_10.label is malformed"):
        evaluate_transfer(world | {"senteval": str(root)}, "TREC")


@pytest.mark.parametrize("task", ["MR", "TREC"])
def test_files_too_small_for_the_folds_are_one_line_naming_task_and_count(world, tmp_path, task):
    root = tmp_path / "senteval"
    write_transfer_folders(root, n=3)  # fasttest's 5 folds need a class with 5 members
    with pytest.raises(common.UserError, match=f"{task}: [36] samples, too few: 5 folds"):
        evaluate_transfer(world | {"senteval": str(root)}, task)


@pytest.mark.parametrize("ref", [b"\xff\xfe not utf-8", b"\x00" * 40, b"../../elsewhere"])
def test_a_refs_main_that_is_not_a_commit_is_passed_over(ref, tmp_path, monkeypatch, world):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    repo = tmp_path / "models--org--tiny"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_bytes(ref)
    snapshot = repo / "snapshots" / ("a" * 40)
    snapshot.parent.mkdir()
    snapshot.symlink_to(world["model"])  # a complete snapshot: found without refs/main
    assert common.find_model("org/tiny") == (snapshot, [])
