"""The one rule of inputs [issue 63]: every path a flag names is checked before it is read, hashed
or locked (missing, a folder, a FIFO or device), and a read error (EIO) on a file is one line naming
it, through main_guard's OSError mechanism: never a traceback, never a hang."""
import builtins
import errno
import importlib
import os
import signal

import pytest

import common
from tiny_world import make_world


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    world = make_world(tmp_path_factory.mktemp("input-rule"))
    return {k: world[k] for k in ("model", "data", "senteval")}


def one_line(capsys, fn, *args):
    """fn(*args) through main_guard, stopped after 60 s (a FIFO's read waits for ever) -> (exit
    status, its one stderr line)."""
    def hang(*_):
        raise AssertionError("a read that never ends: the input was not checked first")
    old = signal.signal(signal.SIGALRM, hang)
    signal.alarm(60)
    try:
        with pytest.raises(SystemExit) as e:
            common.main_guard(fn, *args)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(err) and len(err) == 1, err
    return e.value.code, err[0]


def train_config(world, tmp_path, **kw):
    module = importlib.import_module("simcse_min")
    return module.train, module.Config(**{**world, "device": "cpu", "batch_size": 8,
                                          "max_steps": 1, "eval_every": 1, "test": "none",
                                          "out_dir": str(tmp_path / "out"), **kw})


@pytest.mark.parametrize("kind", ["missing", "folder", "fifo"])
def test_a_dev_file_that_is_not_a_file_is_one_line_naming_the_flag(world, tmp_path, capsys, kind):
    path = tmp_path / "dev.tsv"
    if kind == "folder":
        path.mkdir()
    if kind == "fifo":
        os.mkfifo(path)
    code, line = one_line(capsys, *train_config(world, tmp_path, dev_file=str(path)))
    assert code == 2 and line.startswith(f"error: --dev_file {path} "), line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", ["missing", "folder", "fifo"])
def test_every_file_flag_of_the_commands_is_checked_by_the_same_rule(world, tmp_path, capsys,
                                                                     kind):
    path = tmp_path / "in.txt"
    if kind == "folder":
        path.mkdir()
    if kind == "fifo":
        os.mkfifo(path)
    given = {"--input": ["encode", "--out", str(tmp_path / "v.npy")],
             "--queries": ["search", "--corpus", world["data"]],
             "--corpus": ["search", "--query", "a man"],
             "--sts_file": ["eval"]}
    for flag, args in given.items():
        argv = [*args, flag, str(path), "--model", world["model"], "--device", "cpu"]
        code, line = one_line(capsys, common.cli, argv)
        assert code == 2 and line.startswith(f"error: {flag} {path} "), line


class ReadError:
    """A file whose every read fails as a bad disk's does (EIO), simulated in-process."""

    def __init__(self, f):
        self.f = f

    def __getattr__(self, name):
        if name in ("read", "read1", "readline", "readinto"):
            return self.fail
        return getattr(self.f, name)

    def fail(self, *args):
        raise OSError(errno.EIO, "Input/output error")

    def __iter__(self):
        return self

    def __next__(self):
        self.fail()

    def __enter__(self):
        return self

    def __exit__(self, *args):
        self.f.close()


@pytest.mark.parametrize("opens_before_failing", [0, 1])
def test_a_read_error_on_the_data_is_one_line_naming_it(world, tmp_path, capsys, monkeypatch,
                                                        opens_before_failing):
    """EIO while the data file is hashed (its first open), and while it is tokenized (a later
    one): one line naming the file and what happened, exit 2."""
    data = tmp_path / "data.txt"
    data.write_text(open(world["data"], encoding="utf-8").read() + "a new line .\n")
    opened = []

    def flaky_open(path, *args, **kw):
        f = builtins.open(path, *args, **kw)
        if str(path) != str(data):
            return f
        opened.append(path)
        return ReadError(f) if len(opened) > opens_before_failing else f
    monkeypatch.setattr(common, "open", flaky_open, raising=False)
    monkeypatch.setattr(common, "CACHE", tmp_path / "cache")  # no token cache yet
    code, line = one_line(capsys, *train_config(world, tmp_path, data=str(data)))
    assert code == 2 and str(data) in line and "Input/output error" in line, line
    assert len(opened) > opens_before_failing
