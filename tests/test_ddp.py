"""Multi-GPU training, checked on the CPU: 2 processes (gloo, torchrun's environment set by hand)
against 1 process
on the same global batches, dropout 0 and float64 so both see identical vectors. For each method,
the loss of each
of two steps matches to 1e-6 and every parameter (and BatchNorm statistic) after them to 1e-5.

The steps are the method's own training loop pieces (shard, all_gather, Run.ddp's wrap_ddp,
train_step,
optimizer_step, the momentum update); both processes are spawned once and run all four methods."""
import collections
import copy
import importlib
import json
import os
import random
import socket

import pytest
import torch
import torch.multiprocessing as mp

import common
from common import Bert, BertConfig
from tiny_world import make_world, sentence, tokenizer

METHODS = ["simcse", "esimcse", "simcsepp", "diffcse"]
# global batch; a large learning rate so a wrong gradient shows in the parameters
B, STEPS, LR = 8, 2, 1e-3


def batches(tok, columns):
    """STEPS global batches of B rows x columns sentences: ids, mask [B, C, L], lengths varying
    (padding)."""
    rng = random.Random(0)
    out = []
    for _ in range(STEPS):
        ids, mask = tok([sentence(rng) for _ in range(B * columns)])  # [B*C, L]
        out.append((ids.view(B, columns, -1), mask.view(B, columns, -1)))
    return out


def no_dropout_bert(tok, mlm_head=False):
    """A tiny float64 BERT without dropout; weights N(0, 0.3), not BERT's 0.02, so that sentences
    get distinct
    vectors (with 0.02 every [CLS] is nearly the same and every loss sits at log(2B), hiding
    errors)."""
    cfg = BertConfig.tiny(vocab_size=len(tok.vocab), hidden_dropout_prob=0.0,
                          attention_probs_dropout_prob=0.0)
    model = Bert(cfg, mlm_head=mlm_head).double()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3)
    return model


def run_method(method):
    """Two training steps of `method` in this process's world (1 or 2 processes) -> (losses,
    gradients, states).

    The gradients are taken before clipping: AdamW's first steps and clipping are blind to a
    gradient's scale
    (a missing factor N in the gather would still move each parameter by about ±lr), the gradients
    are not."""
    m, tok, device = importlib.import_module(f"{method}_min"), tokenizer(), torch.device("cpu")
    # the same initial weights in every process (DDP would broadcast rank 0's anyway)
    torch.manual_seed(0)
    model = no_dropout_bert(tok)
    extra = {}
    if method == "diffcse":
        head = m.BNProjector(model.cfg.hidden_size).double()
        disc = m.Discriminator(copy.deepcopy(model)).double()
        generator = no_dropout_bert(tok, mlm_head=True).requires_grad_(False)
        # a large weight so the RTD path counts in the check
        cfg = m.Config(dropout=0.0, lambda_rtd=0.5)
        extra = dict(disc=disc, generator=generator, tok=tok, gen=torch.Generator().manual_seed(0))
    else:
        head = m.MLPHead(model.cfg.hidden_size).double()
        cfg = m.Config(dropout=0.0)
    if method == "esimcse":
        cfg = m.Config(dropout=0.0, queue_size=12, momentum=0.9)
        extra = dict(momentum=m.momentum_encoder(model), queue=collections.deque(maxlen=12),
                     rng=random.Random(0))
    trained = {"model": model, "head": head, **({"disc": extra["disc"]} if "disc" in extra else {})}
    opt, sched = common.make_optimizer([p for x in trained.values() for p in x.parameters()], LR,
                                       10, device)
    wrapped = {k: common.wrap_ddp(x, device) for k, x in trained.items()}
    args = {**extra, **{k: v for k, v in wrapped.items() if k == "disc"}}
    for x in wrapped.values():
        x.train()
    losses, grads, params = [], [], [p for x in trained.values() for p in x.parameters()
                                     if p.requires_grad]
    # simcse: supervised, hard negatives
    for ids, mask in batches(tok, 3 if method == "simcse" else 1):
        loss, _ = m.train_step(wrapped["model"], wrapped["head"], ids, mask, cfg, **args)
        # common.optimizer_step, with the gradients recorded between backward and clipping
        loss.backward()
        grads.append([p.grad.clone() for p in params])
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step(), sched.step(), opt.zero_grad(set_to_none=True)
        if method == "esimcse":
            m.momentum_update(extra["momentum"], wrapped["model"], cfg.momentum)
        losses.append(loss.item())
    states = {k: {n: t.clone() for n, t in x.state_dict().items()} for k, x in trained.items()}
    if method == "esimcse":
        states["momentum"] = extra["momentum"].state_dict()
        states["queue"] = {"rows": torch.stack([*extra["queue"]])}
    return losses, grads, states


def join(rank, port):
    """What torchrun sets for a worker."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(rank),
                      WORLD_SIZE="2")
    torch.set_num_threads(1)


def worker(rank, port, out, config):
    """Both processes: the four methods' steps, a batch that does not split, then a whole train(),
    then the end
    of the process group."""
    join(rank, port)
    assert common.init_distributed(torch.device("cpu")) == torch.device("cpu")
    assert common.world() == (rank, 2)
    results = {method: run_method(method) for method in METHODS}
    simcse_min = importlib.import_module("simcse_min")
    try:
        common.Run(simcse_min.Config(batch_size=7), simcse_min.__file__)
    except common.UserError as e:
        results["error"] = str(e)
    if rank == 0:
        torch.save(results, out)
    simcse_min.train(simcse_min.Config(**config))
    common.leave_distributed()  # what main_guard does after train() under torchrun


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """train() settings on the tiny world, dropout 0; a checkpoint at step 2 of 3."""
    tmp = tmp_path_factory.mktemp("ddp")
    world = make_world(tmp)
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
    return torch.load(tmp / "rank0.pt")


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


def test_batch_not_divisible_by_processes_is_a_user_error(two_processes):
    assert (
        "--batch_size 7 is the global batch and must split evenly over 2 processes"
        in two_processes["error"]
    )


def test_one_process_needs_no_process_group():
    x, linear = torch.arange(12.0).view(6, 2), torch.nn.Linear(2, 2)
    assert torch.equal(common.shard(x, views=2), x) and common.all_gather(x, views=3) is x
    assert common.wrap_ddp(linear,
                           torch.device("cpu")) is linear and common.unwrap(linear) is linear


def test_train_two_processes_end_to_end(tiny_run, two_processes):
    """The whole train() under 2 processes: Run joins the process group, shards, wraps and writes on
    rank 0 alone
    (checkpoints at step 2 and at the last step included); its losses and dev scores are those of
    one process (dropout 0, float32)."""
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
