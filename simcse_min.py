"""SimCSE: a sentence encoded twice, under two dropout masks, is its own positive; the batch gives the negatives.

Gao, Yao and Chen, "SimCSE: Simple Contrastive Learning of Sentence Embeddings", EMNLP 2021 (arXiv:2104.08821).

The baseline: read this file first; the other three are diffs of it (`diff -u simcse_min.py esimcse_min.py`).
Given an NLI CSV (sentence, entailment[, contradiction]) instead of plain sentences, it trains supervised SimCSE.

    h_i, h_i' = MLP(BERT(x_i)[CLS]) under dropout masks z_i, z_i'                                     [B, H]
    loss = -1/B sum_i log( exp(cos(h_i, h_i')/τ) / sum_j exp(cos(h_i, h_j')/τ) ),   τ = 0.05,  j = i included
    supervised: h_i' is the entailment, and the B contradictions h_j^- add B more terms to the denominator.

    python simcse_min.py --data wiki1m_for_simcse.txt --device cuda
    python simcse_min.py --data nli_for_simcse.csv --batch_size 512 --lr 5e-5 --epochs 3 --device cuda
"""
import dataclasses
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import (Run, all_gather, autocast, exit_on_signal, main_guard, make_optimizer,
                    optimizer_step, parse_args, save_checkpoint, shard, signal_received, upcast)


# ---- Config

@dataclasses.dataclass
class Config:
    data: str = "wiki1m_for_simcse.txt"  # sentences, one per line, or an NLI CSV (supervised); this name downloads
    model: str = "bert-base-uncased"  # a model folder or known name [paper]
    senteval: str = ""  # SentEval data folder; empty: ./SentEval/data/downstream, the cache, else a download
    device: str = "auto"  # auto, cpu, cuda or mps
    seed: int = 42  # [official run_unsup_example.sh]
    batch_size: int = 64  # sentences per step [paper Table A.1; supervised: 512]
    max_len: int = 32  # training length in tokens, [CLS] and [SEP] included [official run_unsup_example.sh]
    lr: float = 3e-5  # peak learning rate, linear decay to 0 [paper Table A.1; supervised: 5e-5]
    epochs: int = 1  # [paper; supervised: 3]
    max_steps: int = 0  # stop after this many steps (0: all epochs)
    temp: float = 0.05  # τ, the softmax temperature [paper]
    eval_every: int = 125  # STS-B dev every this many steps [official code]
    dropout: float = 0.1  # hidden and attention dropout, the only augmentation [paper Table 3]
    out_dir: str = "runs/simcse"  # best model, log.txt and results.json
    save_every: int = 500  # steps between checkpoints (out_dir/checkpoint), one also on Ctrl-C/SIGTERM; 0: only then
    resume: str = ""  # continue the run saved in this out_dir, with its configuration; a finished run is left as is
    overwrite: bool = False  # replace the run an existing out_dir holds (else such an out_dir is refused)
    compile: bool = False  # torch.compile the encoder (CUDA graphs on CUDA; the first steps compile)
    hard_weight: float = 0.0  # supervised: added to each row's own contradiction logit, log α [official code]
    checks = {"hard_weight": (lambda v: True, "a number")}  # the method's own flags (common: the rest)


# ---- Views

def make_views(ids, mask):
    """[B, C, L] columns -> [V*B, L], view-major. Unsupervised (C = 1): the sentence twice, so one forward pass
    draws two independent dropout masks [paper §3]. Supervised: the C columns are the views."""
    if ids.size(1) == 1:
        ids, mask = ids.expand(-1, 2, -1), mask.expand(-1, 2, -1)  # [B, 2, L]
    return ids.transpose(0, 1).flatten(0, 1), mask.transpose(0, 1).flatten(0, 1)  # [V*B, L]


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


# ---- Loss

def info_nce(h1, h2, temp, h3=None, hard_weight=0.0):
    """Cross-entropy of cos(h1_i, h2_j)/τ over j with target j = i: one direction, j = i in the denominator
    [paper Eq. 1; official code]. h1, h2 [B, H] pair row by row; h3 [B, H] are hard negatives (supervised)."""
    h1, h2 = F.normalize(h1, dim=-1), F.normalize(h2, dim=-1)  # [B, H] each
    logits = h1 @ h2.T / temp  # [B, B]
    if h3 is not None:
        hard = h1 @ F.normalize(h3, dim=-1).T / temp  # [B, B]
        hard = hard + hard_weight * torch.eye(len(h1), device=h1.device)  # weight on the own contradiction only
        logits = torch.cat([logits, hard], dim=1)  # [B, 2B]
    return F.cross_entropy(logits, torch.arange(len(h1), device=h1.device))


def loss_fn(h, temp, hard_weight=0.0):
    """h [V, B, H], the head outputs of V = 2 views (3 with contradictions) -> (loss, stats)."""
    loss = info_nce(h[0], h[1], temp, h[2] if len(h) > 2 else None, hard_weight)
    return loss, {"loss": loss.detach()}


# ---- Training step

def train_step(model, head, ids, mask, cfg):
    """One forward pass over all views stacked; dropout samples a fresh mask for every row. Multi-GPU: common.py."""
    B = ids.size(0)
    ids, mask = shard(ids), shard(mask)  # [b, C, L]: this process's rows of the batch (one process: all B)
    cls = model(*make_views(ids, mask), cls_only=True)[:, 0]  # [V*b, H]
    h = all_gather(head(cls), views=len(cls) // len(ids)).view(-1, B, cls.size(-1))  # [V, B, H], every process
    with torch.autocast(h.device.type, enabled=False):  # the similarity/softmax math in fp32 [DESIGN]
        return loss_fn(upcast(h), cfg.temp, cfg.hard_weight)


# ---- Training loop

def train(cfg):
    run = Run(cfg, "simcse", __file__)  # checks every input; nothing is written before run.start
    tok, model = run.load_model()
    head = MLPHead(model.cfg.hidden_size).to(run.device)
    data = run.load_data(tok)
    total = run.total_steps(len(data))
    opt, sched = make_optimizer([*model.parameters(), *head.parameters()], cfg.lr, total, run.device)
    saved = dict(model=model, head=head, opt=opt, sched=sched)  # what a checkpoint holds
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
        with autocast(run.device):
            loss, stats = train_step(model, head, *next(batches), cfg)
        if not math.isfinite(loss.item()):  # stop, keeping the best model so far: exit status 3
            raise run.stop_non_finite(step + 1, loss.item(), model, tok)
        optimizer_step(loss, opt, sched)
        run.log_progress(step + 1, stats)
    return run.finish(model, tok)


# ---- CLI

if __name__ == "__main__":
    main_guard(train, parse_args(Config))
