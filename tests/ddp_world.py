"""The two-process world of test_ddp.py: the same global batches, models whose vectors differ,
each method's loop pieces run for two steps (and, chunked, for 8 [issue 44]), and the worker that
torch.multiprocessing spawns (importable: spawned processes import this module, not the test
file). Masks: the dropout masks of one run, replayed in another (test_gradient_cache.py)."""
import collections
import copy
import functools
import importlib
import os
import random
import socket

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

import common
from common import Bert, BertConfig
from tiny_world import sentence, tokenizer

METHODS = ["simcse", "esimcse", "simcsepp", "diffcse", "simcse-mlm"]  # the last: --do_mlm
# global batch; a large learning rate so a wrong gradient shows in the parameters
B, STEPS, LR = 8, 2, 1e-3
# chunked = unchunked to 1e-12 [issue 44], but where the gradient is 0 in exact arithmetic: its
# rounding noise (~1e-17), divided by AdamW by its own size, moves the parameter ~lr/1e9. The key
# biases (softmax ignores a shift shared by a row's logits); the last layer's output bias before
# DiffCSE's BatchNorm (it removes a shift shared by all rows).
NOISE_ONLY = ("key.bias", "layers.1.ffn_norm.bias")


def tolerance(name):
    return 1e-11 if name.endswith(NOISE_ONLY) else 1e-12


def assert_same_states(got, want):
    """Every tensor of each module's state in got equals want's, to its tolerance."""
    for module, state in want.items():
        for name, t in state.items():
            torch.testing.assert_close(got[module][name], t, rtol=0, atol=tolerance(name),
                                       msg=f"{module}.{name}")


def batches(tok, columns, batch=B, steps=STEPS):
    """`steps` global batches of `batch` rows x columns sentences: ids, mask [B, C, L], lengths
    varying (padding)."""
    rng = random.Random(0)
    out = []
    for _ in range(steps):
        ids, mask = tok([sentence(rng) for _ in range(batch * columns)])  # [B*C, L]
        out.append((ids.view(batch, columns, -1), mask.view(batch, columns, -1)))
    return out


class Masks:
    """Hidden dropout that records its masks in one run (each chunk's first pass: no graph) and
    replays them in the next, joined along the batch: the unchunked step with the chunked step's
    masks. A Layer calls its dropout twice (attention output, FFN): two streams. recorded: the
    masks of each process of a torchrun run, joined as all_gather joins their vectors (batch: the
    global batch, to tell a call's views)."""

    def __init__(self, recorded=None, batch=None):
        self.saved, self.replay = collections.defaultdict(list), recorded is not None
        self.recorded, self.batch = recorded, batch

    def patch(self, **roots):
        for root, module in roots.items():
            for name, m in module.named_modules():
                if isinstance(m, torch.nn.Dropout):
                    m.calls, m.forward = 0, functools.partial(self.dropout, m, root + "." + name)

    def dropout(self, m, name, x):
        key = (name, m.calls % (2 if ".layers." in name else 1))
        m.calls += 1
        if not m.training or m.p == 0:
            return x
        if self.replay:  # each process's chunks, in order, until they cover its share of x
            sources = self.recorded or [self.saved]
            shares = []
            for saved in sources:
                parts = [saved[key].pop(0)]
                while sum(map(len, parts)) < len(x) // len(sources):
                    parts.append(saved[key].pop(0))
                views = len(x) // self.batch if self.batch else 1
                shares.append(torch.cat(parts).unflatten(0, (views, -1)))  # [views, b, ...]
            keep = torch.cat(shares, dim=1).flatten(0, 1)  # view-major, ranks in order
        else:
            keep = torch.rand_like(x) >= m.p  # from the global generator, as nn.Dropout's
            if not torch.is_grad_enabled():
                self.saved[key].append(keep)
        return x * keep / (1 - m.p)


def no_dropout_bert(tok, mlm_head=False, dropout=0.0, pooler=False):
    """A tiny float64 BERT without dropout (or hidden dropout only: SDPA draws the attention's
    inside, where no test can replay it); weights N(0, 0.3), not BERT's 0.02, so that sentences
    get distinct vectors (with 0.02 every [CLS] is nearly the same and every loss sits at log(2B),
    hiding errors). pooler: BERT's, as the real checkpoints carry it [issue 57]."""
    cfg = BertConfig.tiny(vocab_size=len(tok.vocab), hidden_dropout_prob=dropout,
                          attention_probs_dropout_prob=0.0)
    model = Bert(cfg, mlm_head=mlm_head, pooler=pooler).double()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3)
    return model


def run_method(method, chunk_size=0, batch=B, steps=STEPS, masks=None):
    """Two training steps of `method` in this process's world (1 or 2 processes) -> (losses,
    gradients, states); or `steps` steps of `batch` rows, `chunk_size` at a time, with the hidden
    dropout of `masks` (0.1) if given.

    The gradients are taken before clipping: AdamW's first steps and clipping are blind to a
    gradient's scale (a missing factor N in the gather would still move each parameter by about
    ±lr), the gradients are not."""
    name, _, variant = method.partition("-")  # simcse-mlm: supervised SimCSE with --do_mlm
    m, tok, device = importlib.import_module(f"{name}_min"), tokenizer(), torch.device("cpu")
    # the same initial weights in every process (DDP would broadcast rank 0's anyway)
    torch.manual_seed(0)
    dropout = 0.1 if masks else 0.0
    model = no_dropout_bert(tok, variant == "mlm", dropout, pooler=True)  # as real checkpoints
    extra = {}
    if method == "diffcse":
        head = m.BNProjector(model.cfg.hidden_size).double()
        disc = m.Discriminator(copy.deepcopy(model)).double()
        generator = no_dropout_bert(tok, True, dropout).requires_grad_(False)
        # a large weight so the RTD path counts in the check
        cfg = m.Config(dropout=dropout, lambda_rtd=0.5, chunk_size=chunk_size)
        extra = dict(disc=disc, generator=generator, tok=tok, gen=torch.Generator().manual_seed(0))
    else:
        head = m.MLPHead(model.cfg.hidden_size).double()
        cfg = m.Config(dropout=dropout, chunk_size=chunk_size, do_mlm=variant == "mlm",
                       mlm_weight=0.5)
        extra = dict(tok=tok, gen=torch.Generator().manual_seed(0)) if variant else {}
    model.pooler = head  # as train(): the head is the model's pooler, in the model's DDP
    if method == "esimcse":
        cfg = m.Config(dropout=dropout, queue_size=12, momentum=0.9, chunk_size=chunk_size)
        extra = dict(momentum=m.momentum_encoder(model), queue=collections.deque(maxlen=12),
                     rng=random.Random(0))
    trained = {"model": model, **({"disc": extra["disc"]} if "disc" in extra else {})}
    opt, sched = common.make_optimizer([p for x in trained.values() for p in x.parameters()], LR,
                                       10, device)
    syncs, per_step = [], []  # DDP's gradient all-reduces (one a bucket), and their count a step
    ddp = functools.partial(counted, syncs=syncs) if common.world()[1] > 1 else lambda x: x
    wrapped = {k: ddp(x) for k, x in trained.items()}  # as Run.ddp
    args = {**extra, **{k: v for k, v in wrapped.items() if k == "disc"}}
    for x in wrapped.values():
        x.train()
    losses, grads, params = [], [], [p for x in trained.values() for p in x.parameters()
                                     if p.requires_grad]
    # simcse: supervised, hard negatives
    if masks:
        masks.patch(**trained, **{k: v for k, v in extra.items() if k == "generator"})
        torch.manual_seed(1 + common.world()[0])  # each process its own masks, as Run seeds them
    for ids, mask in batches(tok, 3 if name == "simcse" else 1, batch, steps):
        loss, _ = m.train_step(wrapped["model"], head, ids, mask, cfg, **args)
        # common.optimizer_step, with the gradients recorded between backward and clipping
        loss.backward()
        grads.append([p.grad.clone() for p in params])
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step(), sched.step(), opt.zero_grad(set_to_none=True)
        if method == "esimcse":
            m.momentum_update(extra["momentum"], wrapped["model"], cfg.momentum)
        losses.append(loss.item())
        per_step.append(len(syncs) - sum(per_step))
    states = {k: {n: t.clone() for n, t in x.state_dict().items()} for k, x in trained.items()}
    if method == "esimcse":
        states["momentum"] = extra["momentum"].state_dict()
        states["queue"] = {"rows": torch.stack([*extra["queue"]])}
    if syncs:
        states["syncs"] = {"per_step": torch.tensor(per_step)}
    return losses, grads, states


def counted(module, syncs):
    """DistributedDataParallel(module), as Run.ddp wraps it, with each all-reduce of a gradient
    bucket counted (DDP's default hook: the mean over processes)."""
    ddp = torch.nn.parallel.DistributedDataParallel(common.InsideDDP(module))

    def hook(state, bucket):
        syncs.append(bucket.index())
        return default_hooks.allreduce_hook(None, bucket)
    ddp.register_comm_hook(None, hook)
    return ddp


def join(rank, port):
    """What torchrun sets for a worker."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(rank),
                      WORLD_SIZE="2")
    torch.set_num_threads(1)


def worker(rank, port, out, config):
    """Both processes: the four methods' steps, a batch that does not split, then a whole train(),
    then the end of the process group."""
    join(rank, port)
    assert common.init_distributed(torch.device("cpu")) == torch.device("cpu")
    assert common.world() == (rank, 2)
    results = {method: run_method(method) for method in METHODS}
    masks = {method: Masks() for method in METHODS}  # dropout 0.1, recorded for test_ddp.py
    results["chunked"] = {m: run_method(m, 16, 64, 8, masks=masks[m]) for m in METHODS}
    torch.save({m: dict(x.saved) for m, x in masks.items()}, f"{out}.masks{rank}")
    simcse_min = importlib.import_module("simcse_min")
    try:
        common.Run(simcse_min.Config(batch_size=7), simcse_min.__file__)
    except common.UserError as e:
        results["error"] = str(e)
    if rank == 0:
        torch.save(results, out)
    simcse_min.train(simcse_min.Config(**config))
    diffcse_min = importlib.import_module("diffcse_min")  # its discriminator, a second BERT
    diffcse_min.train(diffcse_min.Config(**diffcse_config(config)))  # [issue 57]
    common.leave_distributed()  # what main_guard does after train() under torchrun


def diffcse_config(config):
    """DiffCSE's train() settings on the tiny world: no RTD weight, so that 1 and 2 processes see
    the same loss (the generator's samples are drawn per process) while every part still runs."""
    generator = os.path.join(os.path.dirname(config["model"]), "generator")  # tiny_world's
    return {**config, "out_dir": config["out_dir"] + "-diffcse", "generator": generator,
            "lambda_rtd": 0.0}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
