"""What encode writes and search believes [issue 52]: every output named and owned (check_output),
a new .npy and .json replace the old pair only when whole (a SIGKILL at any moment leaves the old
pair or the new, no temporary), and search checks the .npy against its JSON before ranking."""
import json
import os
import random
import signal
import sys

import numpy as np
import pytest

import common
from conftest import cli, one_line
from tiny_world import sentence


def corpus(tmp_path, n=3, name="c.txt"):
    rng = random.Random(n)
    (tmp_path / name).write_text("".join(sentence(rng) + "\n" for _ in range(n)))
    return str(tmp_path / name)


def encode(world, tmp_path, *more, n=3):  # n=None: the corpus as it is (a child's: no race)
    path = corpus(tmp_path, n) if n else str(tmp_path / "c.txt")
    return cli("encode", "--model", world["model"], "--input", path, "--out",
               str(tmp_path / "v.npy"), *more)


def search(world, tmp_path, pooler="cls_before_pooler"):
    return cli("search", "--model", world["model"], "--corpus", str(tmp_path / "c.txt"),
               "--vectors", str(tmp_path / "v.npy"), "--query", "a man", "--pooler", pooler)


def test_every_output_is_named_and_owned(world, tmp_path, capsys):
    (tmp_path / "package.json").write_text('{"name": "mine"}')  # not encode's: kept
    assert "was not written by encode" in one_line(
        capsys, ["encode", "--model", world["model"], "--input", corpus(tmp_path), "--out",
                 str(tmp_path / "package.npy"), "--device", "cpu"])
    assert (tmp_path / "package.json").read_text() == '{"name": "mine"}'
    model = common.Path(world["model"])
    for out in (model / "special_tokens_map.npy", model / "1_Pooling" / "config.npy",
                common.Path(world["senteval"]) / "STS" / "v.npy", "/dev/null"):
        assert "--out" in one_line(capsys, ["encode", "--model", world["model"], "--input",
                                            corpus(tmp_path), "--out", str(out), "--device", "cpu"])
    assert os.path.exists("/dev/null") and not os.path.isfile("/dev/null")
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("a man\ta person\t4\na dog\ta cat\t1\nthe sun\ta car\t0\n")
    before = pairs.read_text()
    for out in (pairs, common.Path(world["senteval"]) / "STS" / "r.json", model / "modules.json"):
        one_line(capsys, ["eval", "--model", world["model"], "--sts_file", str(pairs), "--json",
                          str(out), "--device", "cpu"])
    assert pairs.read_text() == before
    (tmp_path / "target.json").write_text("{}")  # a link to a file: refused, never replaced
    (tmp_path / "link.json").symlink_to(tmp_path / "target.json")
    assert "not a regular file" in one_line(capsys, ["eval", "--model", world["model"],
                                                     "--sts_file", str(pairs), "--json",
                                                     str(tmp_path / "link.json"), "--device",
                                                     "cpu"])
    assert (tmp_path / "link.json").is_symlink()


def test_eval_json_into_a_pipe_or_a_link_to_one_is_written_through(world, tmp_path, capsys):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("a man\ta person\t4\na dog\ta cat\t1\nthe sun\ta car\t0\n")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "link").symlink_to(fifo)
    for out in (fifo, tmp_path / "link"):
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # the other end, as >(jq .) holds it
        cli("eval", "--model", world["model"], "--sts_file", str(pairs), "--json", str(out))
        assert json.loads(os.read(reader, 1 << 16))["details"]["sts_file"]["test"]["n"] == 3
        os.close(reader)
    assert (tmp_path / "link").is_symlink() and not fifo.is_file()
    assert sorted(os.listdir(tmp_path)) == ["fifo", "link", "pairs.tsv"]  # no temporary


def test_search_believes_only_what_it_checks(world, tmp_path, capsys):
    encode(world, tmp_path)
    good = (tmp_path / "v.npy").read_bytes()
    encode(world, tmp_path, "--pooler", "avg")  # the same shape, another pooler: copied over
    (tmp_path / "v.npy").write_bytes(good)
    assert "does not describe it" in one_line(capsys, [
        "search", "--model", world["model"], "--corpus", str(tmp_path / "c.txt"), "--vectors",
        str(tmp_path / "v.npy"), "--query", "a", "--pooler", "avg", "--device", "cpu"])
    about = json.loads((tmp_path / "v.json").read_text())
    for bad, why in ((np.full((3, 32), np.nan, "<f4"), "NaN"),
                     (np.zeros((2, 32), "<f4"), "(2, 32)"), (np.zeros((3, 32), "<f8"), "float64"),
                     (np.array([{}] * 3), "not an array")):
        np.save(tmp_path / "v.npy", bad, allow_pickle=True)  # and a JSON that describes it
        seen = {"npy_bytes": os.path.getsize(tmp_path / "v.npy"),
                "npy_sha256": common.sha256_file(tmp_path / "v.npy")}
        (tmp_path / "v.json").write_text(json.dumps({**about, **seen}))
        err = one_line(capsys, ["search", "--model", world["model"], "--corpus",
                                str(tmp_path / "c.txt"), "--vectors", str(tmp_path / "v.npy"),
                                "--query", "a", "--pooler", "avg", "--device", "cpu"])
        assert why in err and "allow_pickle" not in err, err


def test_encode_takes_the_lock_the_other_writers_take(world, tmp_path, capsys):
    encode(world, tmp_path)
    held = common.lock_folder(tmp_path)  # as a second encode (or a run) there would hold it
    try:
        assert "in use by another run or encode" in one_line(
            capsys, ["encode", "--model", world["model"], "--input", str(tmp_path / "c.txt"),
                     "--out", str(tmp_path / "v.npy"), "--pooler", "avg", "--device", "cpu"])
    finally:
        os.close(held)
    search(world, tmp_path)


def test_a_stopped_or_failed_encode_keeps_the_old_pair(world, tmp_path, capsys, monkeypatch):
    encode(world, tmp_path)
    pair = {n: (tmp_path / n).read_bytes() for n in ("v.npy", "v.json")}
    real = common.encode_sentences

    def stopped_halfway(*args, **kw):
        signal.raise_signal(signal.SIGTERM)
        return real(*args, **kw)
    monkeypatch.setattr(common, "encode_sentences", stopped_halfway)
    with pytest.raises(SystemExit) as stop:  # on main, SIGTERM ended pytest: a handler
        before = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # to see it
        try:
            cli("encode", "--model", world["model"], "--input", str(tmp_path / "c.txt"), "--out",
                str(tmp_path / "v.npy"), "--pooler", "avg")
        finally:
            assert signal.signal(signal.SIGTERM, before) is not signal.default_int_handler
    assert stop.value.code == 130 and capsys.readouterr().err == "interrupted\n"
    assert {n: (tmp_path / n).read_bytes() for n in pair} == pair
    assert sorted(os.listdir(tmp_path)) == ["c.txt", "v.json", "v.npy"]
    monkeypatch.undo()
    search(world, tmp_path)
