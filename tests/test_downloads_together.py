"""One writer per cached file [issue 40]: downloads of the same file started together (four training
runs of a sweep on a fresh machine) against the stand-in hub with a slowed CDN end with exactly the
hub's bytes and no .part; a process that finds the folder's lock held waits and uses the finished
file; a full disk says so and removes the .part; a folder where the file goes is one line."""
import multiprocessing
import random
import resource
import sys
import threading
import time

import pytest

import common
from conftest import one_file_hub, url

BLOB = bytes(range(256)) * 256  # 65,536 bytes


@pytest.fixture
def slow_hub():
    with one_file_hub(BLOB) as hub:
        hub.slow = (4096, 0.002)  # 16 pieces, about 40 ms a download: the others start meanwhile
        yield hub


def one_download(address, dest, delay):
    time.sleep(delay)
    try:
        common.download(address, dest)
    except common.UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


def test_four_downloads_started_together_leave_the_hubs_bytes(slow_hub, tmp_path):
    """20 rounds of 4 forked processes started a few milliseconds apart: each exits 0, and each
    round ends with the hub's bytes in the cache and no .part (before: a file almost twice the size
    or 'cut at 0 of 65536 bytes', exit 0 for one of them)."""
    fork, rng = multiprocessing.get_context("fork"), random.Random(0)
    for round_ in range(20):
        dest = tmp_path / f"round{round_}" / "model.safetensors"
        procs = [fork.Process(target=one_download, args=(url(slow_hub), dest, rng.random() / 50))
                 for _ in range(4)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(30)
        assert [p.exitcode for p in procs] == [0] * 4, f"round {round_}"
        assert dest.read_bytes() == BLOB, f"round {round_}: {dest.stat().st_size} bytes"
        assert sorted(p.name for p in dest.parent.iterdir()) == ["model.safetensors"]


def test_a_process_that_finds_the_lock_held_waits_then_uses_the_finished_file(slow_hub, tmp_path,
                                                                             capsys):
    dest = tmp_path / "model.safetensors"
    lock, _ = common.hold_lock(tmp_path)  # another process's download is going on
    got = []
    waiter = threading.Thread(target=lambda: got.append(common.download(url(slow_hub), dest)))
    waiter.start()
    time.sleep(0.3)
    assert waiter.is_alive() and not slow_hub.requests  # it waits, asking nothing meanwhile
    dest.write_bytes(BLOB)  # the other process finished and renamed its file
    common.release_lock(lock)
    waiter.join(10)
    assert got == [dest] and dest.read_bytes() == BLOB and not slow_hub.requests
    assert "another process is downloading" in capsys.readouterr().err


def test_a_full_disk_says_so_and_removes_the_part(slow_hub, tmp_path):
    """A file-size limit makes the writes fail as on a full disk (EFBIG; Python ignores SIGXFSZ);
    the limit is lowered in this process for the download only."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, hard))
    try:
        with pytest.raises(common.UserError, match="disk is full; deleted the partial download"):
            common.download(url(slow_hub), tmp_path / "model.safetensors")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("where", ["dest", "part"])
def test_a_folder_where_the_file_goes_is_one_line(slow_hub, tmp_path, where):
    """A cached senteval.tar that is a folder was a traceback after the whole download."""
    dest = tmp_path / "model.safetensors"
    (dest if where == "dest" else tmp_path / "model.safetensors.part").mkdir()
    with pytest.raises(common.UserError, match="is a directory: move it away"):
        common.download(url(slow_hub), dest)
    assert not slow_hub.requests  # refused before any byte was asked for


def test_a_cached_senteval_tar_that_is_a_folder_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "CACHE", tmp_path)
    (tmp_path / "data" / "senteval.tar").mkdir(parents=True)
    monkeypatch.setattr(common, "HF_ENDPOINT", "http://127.0.0.1:9")  # never asked
    with pytest.raises(common.UserError, match="senteval.tar is a directory"):
        common.download_senteval(tmp_path / "senteval")
