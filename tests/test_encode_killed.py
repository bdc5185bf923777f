"""An encode killed at any moment over an existing good pair (issue 52): search works with the old
pair or the new, never neither, and no temporary remains. The children are forked: each sets one
thread first (libgomp's threads of the parent are gone in a forked child: an OpenMP region there
waits for ever), and the parent waits for them with a deadline, never for ever. The oracle: the pair
on disk after each kill, read by search."""
import json
import os
import random
import signal
import time

import pytest
import torch

import common
from test_encode_pairs import encode, search


def waited(pid, seconds=120):
    """os.waitpid with a deadline -> the child's exit code (-9: SIGKILL); a child still running
    then is killed and the test fails."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(f"a forked encode was still running after {seconds} s")


def test_sigkill_at_random_moments_leaves_the_old_pair_or_the_new(world, tmp_path):
    encode(world, tmp_path, n=1500)  # the old pair; each round encodes with the other pooler
    rng, poolers, kept = random.Random(52), ["cls_before_pooler", "avg"], []
    start = time.time()
    encode(world, tmp_path, "--pooler", "avg", n=1500)
    took = time.time() - start  # an encode's whole time: the kill falls anywhere in it
    for round in range(20):
        pid = os.fork()
        if pid == 0:  # the child encodes and is killed; the parent checks what is left
            torch.set_num_threads(1)  # the parent's OpenMP threads are not the child's
            code = 1  # an error in the encode: not a kill, and not a finished encode
            try:
                encode(world, tmp_path, "--pooler", poolers[round % 2], n=None)
                code = 0
            finally:
                os._exit(code)
        time.sleep(rng.uniform(0, 1.2 * took))
        os.kill(pid, signal.SIGKILL)
        assert waited(pid) in (0, -signal.SIGKILL)  # finished first, or killed
        assert sorted(os.listdir(tmp_path)) == ["c.txt", "v.json", "v.npy"]  # no temporary
        found = [p for p in poolers if common.described(json.loads(
            (tmp_path / "v.json").read_text()), tmp_path / "v.npy")["pooler"] == p]
        assert len(found) == 1
        search(world, tmp_path, found[0])  # works with the pair that is there
        kept.append(found[0] != poolers[round % 2])
    assert any(kept) and not all(kept)  # kills before the new pair was whole, and after


@pytest.mark.parametrize("at", ["link 1", "replace 1", "link 2", "replace 2", "replace 3"])
def test_a_kill_at_each_step_of_the_commit_leaves_a_pair_search_uses(world, tmp_path, at):
    encode(world, tmp_path)  # the old pair; the child writes the new one and dies at `at`
    name, k = at.split()
    pid = os.fork()
    if pid == 0:
        torch.set_num_threads(1)  # after fork, libgomp's pool of the parent would hang the child
        real, calls = getattr(os, name), []

        def then_die(*args, **kw):
            real(*args, **kw)
            calls.append(1)
            if len(calls) == int(k):
                os._exit(9)  # as SIGKILL: no cleanup runs
        setattr(os, name, then_die)
        try:
            encode(world, tmp_path, "--pooler", "avg", n=None)
        finally:
            os._exit(0)
    assert waited(pid) == 9  # it died at `at`: the commit got there
    about = json.loads((tmp_path / "v.json").read_text())
    pooler = common.described(about, tmp_path / "v.npy")["pooler"]
    search(world, tmp_path, pooler)
    encode(world, tmp_path)  # and the next encode clears a temporary name the kill left
    assert sorted(os.listdir(tmp_path)) == ["c.txt", "v.json", "v.npy"]
