"""Multi-GPU training, checked on the CPU: 2 processes (gloo, torchrun's environment set by hand)
against 1 process on the same global batches, dropout 0 and float64 so both see identical vectors.
For each method, the loss of each of two steps matches to 1e-6 and every parameter (and BatchNorm
statistic) after them to 1e-5.

The steps are the method's own training loop pieces (shard, all_gather, Run.ddp,
train_step, optimizer_step, the momentum update); both processes are spawned once and run all four
methods."""
import importlib
import json
import socket
import subprocess
import sys
import types

import pytest
import torch
import torch.multiprocessing as mp

import common
from ddp_world import (METHODS, Masks, assert_same_states, diffcse_config, free_port, run_method,
                       worker)


@pytest.fixture(scope="module")
def tiny_run(tiny_world, tmp_path_factory):
    """train() settings on the tiny world (its model has BERT's pooler, as bert-base-uncased and the
    released ones [issue 57]), dropout 0; a checkpoint at step 2 of 3."""
    tmp, world = tmp_path_factory.mktemp("ddp"), tiny_world
    return tmp, dict(model=world["model"], data=world["data"], senteval=world["senteval"],
                     device="cpu",
                     batch_size=8, max_steps=3, eval_every=1, save_every=2, dropout=0.0)


@pytest.fixture(scope="module")
def two_processes(tiny_run):
    tmp, config = tiny_run
    mp.spawn(worker, args=(free_port(), str(tmp / "rank0.pt"), {**config,
                                                                "out_dir": str(tmp / "two")}),
             nprocs=2,
             join=True)
    results = torch.load(tmp / "rank0.pt")
    results["masks"] = [torch.load(f"{tmp / 'rank0.pt'}.masks{rank}") for rank in (0, 1)]
    return results


@pytest.mark.parametrize("method", METHODS)
def test_two_processes_match_one(method, two_processes):
    assert common.world() == (0, 1)  # the reference: no process group here
    losses, grads, states = run_method(method)
    losses2, grads2, states2 = two_processes[method]
    assert losses2 == pytest.approx(losses, abs=1e-6, rel=0)
    assert losses[0] != pytest.approx(losses[1], abs=1e-3)  # the first step moved the weights
    for step, (g1, g2) in enumerate(zip(grads, grads2)):
        for i, (a, b) in enumerate(zip(g1, g2)):
            torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-9, msg=f"step {step + 1}, gradient "
                                                                       f"{i}")
    for module, state in states.items():
        assert state.keys() == states2[module].keys()
        for name, t in state.items():
            torch.testing.assert_close(states2[module][name], t, rtol=0, atol=1e-5,
                                       msg=f"{module}.{name}")


@pytest.mark.parametrize("method", METHODS)
def test_two_processes_chunked_match_one_unchunked(method, two_processes):
    """--chunk_size 16 under 2 processes (32 sentences each), 8 steps of batch 64, float64, hidden
    dropout 0.1: one process's unchunked steps with the masks both drew (ddp_world.Masks) to 1e-12
    [issue 44] (ddp_world.tolerance); DDP all-reduces the gradients once a step, not a chunk."""
    recorded = [masks[method] for masks in two_processes["masks"]]
    losses, _, states = run_method(method, 0, 64, 8, masks=Masks(recorded, batch=64))
    assert not any(stream for saved in recorded for stream in saved.values())  # all replayed
    losses2, _, states2 = two_processes["chunked"][method]
    assert losses2 == pytest.approx(losses, abs=1e-12, rel=0)
    syncs, unchunked_syncs = (r[2]["syncs"]["per_step"].tolist() for r in
                              (two_processes["chunked"][method], two_processes[method]))
    assert syncs[:len(unchunked_syncs)] == unchunked_syncs and len(set(syncs[1:])) == 1  # a step
    assert_same_states(states2, states)


def test_batch_not_divisible_by_processes_is_a_user_error(two_processes):
    assert (
        "--batch_size 7 is the global batch and must split evenly over 2 processes"
        in two_processes["error"]
    )


def test_one_process_needs_no_process_group():
    x, linear = torch.arange(12.0).view(6, 2), torch.nn.Linear(2, 2)
    assert torch.equal(common.shard(x, views=2), x) and common.all_gather(x, views=3) is x
    run = object.__new__(common.Run)
    run.world_size = 1
    assert run.ddp(linear) is linear


def test_train_two_processes_end_to_end(tiny_run, two_processes):
    """The whole train() under 2 processes: Run joins the process group, shards, wraps and writes on
    rank 0 alone (checkpoints at step 2 and at the last step included); its losses and dev scores
    are those of one process (dropout 0, float32)."""
    tmp, config = tiny_run
    simcse_min = importlib.import_module("simcse_min")
    one = simcse_min.train(simcse_min.Config(**config, out_dir=str(tmp / "one")))
    two = json.loads((tmp / "two" / "results.json").read_text())
    assert [s for s, _ in two["stats_history"]] == [0, 1, 2, 3]
    for (_, a), (_, b) in zip(one["stats_history"][1:], two["stats_history"][1:]):
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-5)
    assert [d for _, d in two["dev_history"]] == pytest.approx([d for _, d in one["dev_history"]],
                                                               abs=1e-2)
    log = (tmp / "two" / "log.txt").read_text()
    assert "cpu x 2 processes" in log
    assert log.count("checkpoint saved") == 2
    assert log.count("STS12") == 1
    assert (tmp / "two" / "model.safetensors").exists()
    assert not (tmp / "two" / "checkpoint.pt").exists()


def test_diffcse_two_processes_on_a_checkpoint_with_a_pooler(tiny_run, two_processes):
    """DiffCSE's discriminator is a second copy of a checkpoint that carries BERT's pooler, which it
    never uses: under DDP an unused parameter stops the first step [issue 57]. 2 processes run, and
    their dev scores are those of 1 process."""
    tmp, config = tiny_run
    diffcse_min = importlib.import_module("diffcse_min")
    one = diffcse_min.train(diffcse_min.Config(**diffcse_config({**config,
                                                                 "out_dir": str(tmp / "one")})))
    two = json.loads((tmp / "two-diffcse" / "results.json").read_text())
    assert [s for s, _ in two["dev_history"]] == [0, 1, 2, 3]
    assert [d for _, d in two["dev_history"]] == pytest.approx([d for _, d in one["dev_history"]],
                                                               abs=1e-2)


def test_stale_torchrun_variables_are_one_line_naming_them_not_a_long_wait():
    """WORLD_SIZE=2 RANK=0 ... left in a shell, no second process: rank 0 used to wait for it (30
    minutes, then the group's 2 hours) without a word [issue 27]."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(common.os.environ, WORLD_SIZE="2", RANK="0", LOCAL_RANK="0",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    code = ("import datetime, torch, common; common.JOIN_LIMIT = datetime.timedelta(seconds=2); "
            "common.main_guard(common.init_distributed, torch.device('cpu'))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=common.Path(common.__file__).parent,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert f"WORLD_SIZE=2 RANK=0 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT={port}" in \
        proc.stderr and "unset WORLD_SIZE" in proc.stderr and "Traceback" not in proc.stderr


def test_the_process_group_waits_long_enough_and_the_others_say_for_what(monkeypatch, capsys):
    """Rank 0 downloads, tokenizes and evaluates while the others wait: the group's timeout is
    hours, not NCCL's default 10 minutes, and a waiting rank says what it waits for [issue 30]."""
    calls = []
    monkeypatch.setattr(common.dist, "init_process_group", lambda *a, **kw: calls.append(kw))
    monkeypatch.setattr(common.dist, "is_initialized", lambda: False)
    store = types.SimpleNamespace(set_timeout=lambda t: calls.append({"store": t}))
    monkeypatch.setattr(common.dist, "rendezvous", lambda url, timeout: iter([(store, 1, 2)]))
    for k, v in dict(WORLD_SIZE="2", RANK="1", LOCAL_RANK="1", MASTER_ADDR="127.0.0.1",
                     MASTER_PORT="29500").items():
        monkeypatch.setenv(k, v)
    common.init_distributed(torch.device("cpu"))
    assert calls[0]["store"] >= common.datetime.timedelta(hours=1)  # after every rank joined
    assert calls[1]["timeout"] >= common.datetime.timedelta(hours=1)
    monkeypatch.setattr(common, "world", lambda: (1, 2))
    monkeypatch.setattr(common.dist, "barrier", lambda: None)
    with common.rank0_first("the model of --model"):
        pass
    assert "rank 1: waiting for rank 0 (the model of --model; at most 2:00:00)" in \
        capsys.readouterr().err


@pytest.mark.parametrize("capability, refused", [((6, 0), True), ((7, 0), False)])
def test_compile_on_a_gpu_triton_cannot_target_is_one_line(monkeypatch, capability, refused):
    """A P100 (compute capability 6.0) with --compile: refused before any work [issue 30]. The
    record: inductor raises "Found Tesla P100-PCIE-16GB which is too old to be supported by the
    triton GPU compiler ... CUDA capability 6.0" at the first compiled call (a vLLM user's log)."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla P100-PCIE-16GB")
    cuda = torch.device("cuda", 0)
    common.check_compile(False, cuda)  # no --compile: nothing to refuse
    if refused:
        with pytest.raises(common.UserError, match="Triton.*7.0 or newer, the Tesla P100-PCIE-16GB "
                                                   "has 6.0: leave --compile out"):
            common.check_compile(True, cuda)
    else:
        common.check_compile(True, cuda)
