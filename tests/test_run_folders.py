"""Run folders are never written over [issue 40]: RANK and WORLD_SIZE are read once (a stale RANK
neither skips the out_dir lock nor is a traceback); an existing out_dir holding files that are not
a run's needs --overwrite, and /, the home folder and the project's folder never are one; a
results.json or log.txt that is a folder is one line before any work; an error caused by a caught
SIGTERM (a cold --compile's g++ killed with the process group) is one line, exit 143. The oracle:
the folders' files before and after each refusal."""
import fcntl
import importlib
import os
import re
import signal
from pathlib import Path

import pytest
import torch

import common
from conftest import tiny_config


def train(world, out, **kw):
    module = importlib.import_module("simcse_min")
    return module.train(tiny_config(module, world, out, max_steps=1, test="none", **kw))


@pytest.mark.parametrize("env, said", [({"RANK": "1"}, r"RANK=1 with WORLD_SIZE=\(unset\)"),
                                       ({"RANK": "x"}, "RANK='x' is not a number"),
                                       ({"RANK": "²", "WORLD_SIZE": "2"}, "RANK='²'"),
                                       ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 with")])
def test_a_stale_or_bad_rank_is_one_line_and_never_skips_the_lock(world, tmp_path, monkeypatch,
                                                                  env, said):
    out = tmp_path / "out"
    out.mkdir()
    held = os.open(out, os.O_RDONLY)  # a live run holds the folder
    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    try:
        with pytest.raises(common.UserError, match=said):
            train(world, out)
    finally:
        os.close(held)
    assert not list(out.iterdir())


def test_a_folder_holding_other_files_needs_overwrite(world, tmp_path):
    out = tmp_path / "another_model"
    out.mkdir()
    (out / "pytorch_model.bin").write_bytes(b"someone's weights")
    (out / "config.json").write_text('{"theirs": true}')
    with pytest.raises(common.UserError, match=r"not a run's \(pytorch_model.bin\)"):
        train(world, out)
    assert (out / "config.json").read_text() == '{"theirs": true}'
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "pytorch_model.bin"]


@pytest.mark.parametrize("files, said", [
    (["checkpoint.pt"], r"holds a training run \(checkpoint.pt\); pass --resume .* --overwrite"),
    (["results.json", "config.json", "model.safetensors"], r"a training run \(results.json\)"),
    (["config.json", "model.safetensors"], r"a model folder \(config.json, model.safetensors\)")])
def test_a_run_or_a_model_in_out_dir_needs_overwrite(tmp_path, files, said):
    """One notion of a run's folder (RUN_FILES, held_by) for check_out_dir and owner [issue 61]:
    a run's files, else a model's, are written over only with --overwrite."""
    for name in files:
        (tmp_path / name).write_text("{}")
    with pytest.raises(common.UserError, match=said):
        common.check_out_dir(tmp_path, overwrite=False)
    common.check_out_dir(tmp_path, overwrite=True)
    assert common.owner(tmp_path, "log.txt").startswith("a file of the ")


@pytest.mark.parametrize("where", ["/", "~", "project"])
def test_root_home_and_the_project_folder_never_are_an_out_dir(where):
    """The check alone, never a run: without it a run would write its files there (it did)."""
    out = Path(__file__).parent.parent if where == "project" else Path(where).expanduser()
    with pytest.raises(common.UserError, match="never a run's"):
        common.check_out_dir(out, overwrite=True)


@pytest.mark.parametrize("name", ["results.json", "log.txt", "checkpoint.pt"])
def test_an_output_that_is_a_folder_is_one_line_before_any_work(world, tmp_path, name):
    out = tmp_path / "out"
    (out / name).mkdir(parents=True)
    with pytest.raises(common.UserError, match=f"{re.escape(name)} is a folder"):
        train(world, out, overwrite=True)
    assert [p.name for p in out.iterdir()] == [name]
    assert not list((out / name).iterdir())


def test_a_run_of_ours_is_still_taken_back_without_overwrite(world, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "log.txt").write_text("a run refused before its first checkpoint\n")
    (out / ".results.json.abcd1234.tmp").write_text("a killed write")
    assert train(world, out)["best_step"] in (0, 1)
    assert not (out / ".results.json.abcd1234.tmp").exists()  # cleared with the rest


def test_an_error_after_a_caught_sigterm_is_one_line_and_exit_143(world, tmp_path, monkeypatch,
                                                                  capsys):
    """SIGTERM to the process group during a cold --compile kills inductor's g++: the compile's
    error (CppCompileError, reproduced on a CPU) followed the signal as a traceback."""
    module = importlib.import_module("simcse_min")

    def compile_killed(*args):
        signal.raise_signal(signal.SIGTERM)  # caught: the run would stop after this step
        raise RuntimeError("InductorError: CppCompileError: C++ compile error (g++ killed)")
    monkeypatch.setattr(module, "optimizer_step", compile_killed)
    cfg = tiny_config(module, world, tmp_path / "out")
    old = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as e:
        common.main_guard(module.train, cfg)
    signal.signal(signal.SIGTERM, old)
    assert e.value.code == 143
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith(
        "error: stopped by SIGTERM, which broke what was running (RuntimeError)")
    with pytest.raises(ValueError):  # without a caught signal, a crash keeps its traceback
        common.main_guard(int, "x")


FULL = dict(WORLD_SIZE="2", RANK="1", LOCAL_RANK="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")


@pytest.mark.parametrize("name, value, said", [
    ("LOCAL_RANK", "²", "LOCAL_RANK='²' is not a number"),
    ("MASTER_PORT", "²", "MASTER_PORT='²' is not a number"),
    ("MASTER_PORT", "", "MASTER_PORT"),
    ("RANK", "x", "RANK='x' is not a number"),
    ("RANK", "2", "RANK=2 with WORLD_SIZE=2")])
def test_a_bad_torchrun_variable_is_one_line_before_joining(monkeypatch, name, value, said):
    joined = []
    monkeypatch.setattr(common.dist, "rendezvous", lambda *a, **kw: joined.append(a) or iter([]))
    for k, v in {**FULL, name: value}.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(common.UserError, match=said):
        common.init_distributed(torch.device("cpu"))
    assert not joined


def test_without_torchrun_a_stray_variable_of_its_group_is_no_matter(monkeypatch):
    """torchrun's variables are read and checked in one place (torchrun_env) [issue 61]; without
    WORLD_SIZE only RANK matters (a stale one would skip the out_dir lock)."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv("LOCAL_RANK", "x")
    assert common.init_distributed(torch.device("cpu")) == torch.device("cpu")
