"""ESimCSE: the positive is the sentence with a few sub-words repeated; a momentum-encoder queue adds negatives.

Wu, Gao, Zang, Han, Wang and Hu, "ESimCSE: Enhanced Sample Building Method for Contrastive Learning of Unsupervised
Sentence Embedding", COLING 2022 (arXiv:2109.04380).

Unlike simcse_min.py:
- the positive view repeats a few random sub-words in place, so the two views differ in length (repeat_subwords);
- a momentum encoder (an EMA of the encoder, dropout off) queues the last 160 sentence vectors: M more negatives in
  every row's denominator (momentum_encoder, info_nce_with_queue); unsupervised only (no NLI CSV).

    x⁺ = x with dup_len = randrange(min(10, int(dup_rate·L))) of its inner sub-words written twice in place
    h_i, h_i⁺ = MLP(BERT(x_i)[CLS]), MLP(BERT(x_i⁺)[CLS]) under dropout;  q_m = MLP(BERT_m(x)[CLS]) of earlier steps
    loss = -1/B sum_i log( e^{cos(h_i,h_i⁺)/τ} / (sum_j e^{cos(h_i,h_j⁺)/τ} + sum_m e^{cos(h_i,q_m)/τ}) )
    θ_m <- μ·θ_m + (1 - μ)·θ after every step,   τ = 0.05,  μ = 0.995,  M = 160 = 2.5·B

    python esimcse_min.py --data wiki1m_for_simcse.txt --device cuda
"""
import collections
import copy
import dataclasses
import math
import random

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import (Run, all_gather, autocast, exit_on_signal, main_guard, make_optimizer,
                    optimizer_step, parse_args, save_checkpoint, shard, signal_received, upcast)


# ---- Config

@dataclasses.dataclass
class Config:
    data: str = "wiki1m_for_simcse.txt"  # sentences, one per line; this name downloads
    model: str = "bert-base-uncased"  # a model folder or known name [paper]
    senteval: str = ""  # SentEval data folder; empty: ./SentEval/data/downstream, the cache, else a download
    device: str = "auto"  # auto, cpu, cuda or mps
    seed: int = 42  # [official run_unsup_example.sh]
    batch_size: int = 64  # sentences per step [paper §4.2]
    max_len: int = 32  # training length in tokens, [CLS] and [SEP] included [official run_unsup_example.sh]
    lr: float = 3e-5  # peak learning rate, linear decay to 0 [paper §4.2: BERT-base; 1e-5 for the others]
    epochs: int = 1  # [paper §4.2]
    max_steps: int = 0  # stop after this many steps (0: all epochs)
    temp: float = 0.05  # τ, the softmax temperature [paper]
    eval_every: int = 125  # STS-B dev every this many steps [official code]
    dropout: float = 0.1  # hidden and attention dropout [paper §4.2: 0.1 base, 0.15 large]
    out_dir: str = "runs/esimcse"  # best model, log.txt and results.json
    save_every: int = 500  # steps between checkpoints (out_dir/checkpoint), one also on Ctrl-C/SIGTERM; 0: only then
    resume: str = ""  # continue the run saved in this out_dir, with its configuration; a finished run is left as is
    overwrite: bool = False  # replace the run an existing out_dir holds (else such an out_dir is refused)
    compile: bool = False  # torch.compile the encoder (CUDA graphs on CUDA; the first steps compile)
    dup_rate: float = 0.32  # the most sub-words repeated, as a share of the length; 0: no repetition [paper Table 9]
    queue_size: int = 160  # M, queued negatives, 2.5·B; 0: no queue and no momentum encoder [paper Table 10]
    momentum: float = 0.995  # μ of the momentum encoder's EMA; 0: a dropout-off copy of the encoder [paper §4.2]
    checks = {"dup_rate": (lambda v: 0 <= v <= 1, "in [0, 1]"), "queue_size": (lambda v: v >= 0, "0 or more"),
              "momentum": (lambda v: 0 <= v <= 1, "in [0, 1]")}  # the method's own flags (common: the rest)


# ---- Views

def repeat_subwords(ids, mask, dup_rate, rng):
    """ids, mask [B, L] -> [B, L'] with a few sub-words of each sentence written twice in place [paper §3.1].

    The official rule, after truncation [official train.py, dup_type bpe]: L the real length with [CLS] and [SEP];
    if int(dup_rate·L) > 0, dup_len = randrange(min(10, int(dup_rate·L))) positions from 1..L-2, no replacement
    (the paper's Eq. 3 reads [0, max(2, int(dup_rate·L))]). [impl] Drawn every step; the official code draws once."""
    index = []
    for n in mask.sum(1).tolist():
        k = int(dup_rate * n)
        dup = rng.sample(range(1, n - 1), min(rng.randrange(min(10, k)), n - 2)) if k > 0 else []  # never [CLS]/[SEP]
        index.append(sorted([*range(n), *dup]))  # each chosen position twice, side by side: [0, 1, 1, 2, ...]
    width = max(len(i) for i in index)
    new_mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i in index], device=mask.device)  # [B, L']
    index = torch.tensor([i + [0] * (width - len(i)) for i in index], device=ids.device)  # [B, L']
    return ids.gather(1, index) * new_mask, new_mask  # re-padded with 0, BERT's [PAD]


def make_views(ids, mask, dup_rate, rng):
    """[B, 1, L] sentences -> [2B, L'], view-major: the sentences, then their repeated copies (the positives), padded
    to one width so one forward pass draws both dropout masks (padding does not change [CLS])."""
    rep_ids, rep_mask = repeat_subwords(ids[:, 0], mask[:, 0], dup_rate, rng)  # [B, L']
    pad = (0, rep_ids.size(1) - ids.size(2))
    return torch.cat([F.pad(ids[:, 0], pad), rep_ids]), torch.cat([F.pad(mask[:, 0], pad), rep_mask])  # [2B, L']


# ---- Heads

class MLPHead(nn.Module):
    """Linear(H, H) + tanh on [CLS], freshly initialised rather than BERT's NSP pooler, used in training only:
    the test vector is the raw [CLS] [paper §3 fn. 9, Table 6; official code: mlp_only_train]."""

    def __init__(self, hidden):
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        nn.init.normal_(self.dense.weight, std=0.02)  # [official code: init_weights]
        nn.init.zeros_(self.dense.bias)

    def forward(self, x):  # [N, H] -> [N, H]
        return torch.tanh(self.dense(x))


def momentum_encoder(model):
    """The encoder that fills the queue, moved only by momentum_update [paper §3.2]; subtle: dropout off (eval mode)
    [paper §1]. [impl] A copy of the pretrained encoder: the official code copies before the checkpoint loads, so
    its momentum encoder starts from random weights (its logs list momentum_model.* as newly initialized)."""
    return copy.deepcopy(model).eval().requires_grad_(False)


@torch.no_grad()
def momentum_update(momentum, model, mu):
    """θ_m <- μ·θ_m + (1 - μ)·θ [paper Eq. 5], once per step, after the optimizer step."""
    params = list(momentum.parameters())
    torch._foreach_mul_(params, mu)
    torch._foreach_add_(params, torch._foreach_mul(list(model.parameters()), 1 - mu))


# ---- Loss

def info_nce_with_queue(h1, h2, queue, temp):
    """Cross-entropy of [cos(h1_i, h2_j)/τ over j] ++ [cos(h1_i, q_m)/τ over m] with target j = i [paper Eq. 6;
    official code]. h1, h2 [B, H] pair row by row; queue [M, H] (M may be 0) are extra negatives for every row."""
    h1, h2 = F.normalize(h1, dim=-1), F.normalize(h2, dim=-1)  # [B, H] each
    logits = h1 @ h2.T / temp  # [B, B]
    negatives = h1 @ F.normalize(queue, dim=-1).T / temp  # [B, M], constants: the queue has no gradient
    logits = torch.cat([logits, negatives], dim=1)  # [B, B + M]
    return F.cross_entropy(logits, torch.arange(len(h1), device=h1.device))


def loss_fn(h, queue, temp):
    """h [2, B, H], the head outputs of the sentences and their repeated copies; queue [M, H] -> (loss, stats)."""
    loss = info_nce_with_queue(h[0], h[1], queue, temp)
    return loss, {"loss": loss.detach()}


# ---- Training step

def train_step(model, head, ids, mask, cfg, momentum, queue, rng):
    """One forward pass over both views stacked, dropout on both; after the loss, the momentum encoder's vectors of
    the batch join the queue (a deque: the oldest drop out), so a step sees earlier steps only [official code]."""
    B = ids.size(0)
    views = [shard(v, views=2) for v in make_views(ids, mask, cfg.dup_rate, rng)]  # [2b, L']: drawn for all B rows
    ids, mask = shard(ids), shard(mask)  # [b, C, L]: this process's rows of the batch (one process: all B)
    cls = model(*views, cls_only=True)[:, 0]  # [2b, H]
    h = all_gather(head(cls), views=len(cls) // len(ids)).view(-1, B, cls.size(-1))  # [V, B, H], every process
    queued = torch.stack([*queue]) if queue else h.new_zeros(0, h.size(-1))  # [M, H]
    with torch.autocast(h.device.type, enabled=False):  # the similarity/softmax math in fp32 [DESIGN]
        loss, stats = loss_fn(upcast(h), upcast(queued), cfg.temp)
    if momentum is not None:  # the B original sentences, through the online head, detached [official models.py]
        queue.extend(all_gather(head(momentum(ids[:, 0], mask[:, 0], cls_only=True)[:, 0]).detach()).unbind())
    return loss, stats


# ---- Training loop

def train(cfg):
    run = Run(cfg, "esimcse", __file__)  # checks every input; nothing is written before run.start
    tok, model = run.load_model()
    head = MLPHead(model.cfg.hidden_size).to(run.device)
    momentum = momentum_encoder(model) if cfg.queue_size > 0 else None  # ESimCSE: none without a queue
    data = run.load_data(tok, one_column=True)  # ESimCSE: unsupervised only
    total = run.total_steps(len(data))
    opt, sched = make_optimizer([*model.parameters(), *head.parameters()], cfg.lr, total, run.device)
    rng, queue = random.Random(cfg.seed), collections.deque(maxlen=cfg.queue_size)  # ESimCSE
    saved = dict(model=model, head=head, opt=opt, sched=sched, momentum=momentum, queue=queue, rng=rng)
    run.compile(model)
    start = run.start(saved)  # 0, or the step of the --resume checkpoint, everything as it was then
    model, head = run.ddp(model), run.ddp(head)
    model.train(), head.train()
    batches, stats = run.batches(data, tok, start), {}
    for step in range(start, total + 1):  # step: optimizer steps done so far
        stop = signal_received(run)  # Ctrl-C or SIGTERM, the same on every process
        if step > start and (stop or cfg.save_every and step % cfg.save_every == 0):
            save_checkpoint(run, step, saved)
        if stop:
            exit_on_signal(run, step)  # exit status 128 + signal; `--resume out_dir` continues
        if step % cfg.eval_every == 0 or step == total:  # STS-B dev: step 0, every eval_every, last
            dev = run.evaluate(step, model, stats)
            if dev > run.best_dev:
                run.keep_best(step, dev, model)  # in memory; the final test table uses it
        if step == total:
            break
        if step % run.per_epoch == 0:  # ESimCSE: the queue starts empty in every epoch [official code]
            queue.clear()
        with autocast(run.device):
            loss, stats = train_step(model, head, *next(batches), cfg, momentum, queue, rng)
        if not math.isfinite(loss.item()):  # stop, keeping the best model so far: exit status 3
            raise run.stop_non_finite(step + 1, loss.item(), model, tok)
        optimizer_step(loss, opt, sched)
        if momentum is not None:  # ESimCSE: θ_m <- μ·θ_m + (1 - μ)·θ, after the step
            momentum_update(momentum, model, cfg.momentum)
        run.log_progress(step + 1, stats)
    return run.finish(model, tok)


# ---- CLI

if __name__ == "__main__":
    main_guard(train, parse_args(Config))
