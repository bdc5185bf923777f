"""torchrun's variables are read and checked in one place (torchrun_env) [issue 61]: a value that
is not a number in ASCII digits, a RANK not below WORLD_SIZE, or one torchrun sets that is missing,
is one line naming it, before any process group is joined; never int()'s traceback."""
import pytest
import torch

import common

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
    """Only RANK matters without WORLD_SIZE (a stale one would skip the out_dir lock)."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv("LOCAL_RANK", "x")
    assert common.init_distributed(torch.device("cpu")) == torch.device("cpu")
