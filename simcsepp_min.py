"""SimCSE++: SimCSE whose negatives come from a dropout-off pass, plus a contrastive loss over the dimensions.

Xu, Shao, Chen and Liu, "SimCSE++: Improving Contrastive Learning for Sentence Embeddings from Two Perspectives",
EMNLP 2023 (arXiv:2305.13192).

Unlike simcse_min.py:
- a third forward pass of the sentences with every dropout off (with gradient, through the head) gives h0, and the
  negatives are cos(h0_i, h0_j), j ≠ i: dropout noise helps the positive pair but hurts the negatives [paper §3];
- m scales the positive logit, which stays in the denominator [official code; paper Eq. 3 writes m on the negatives];
- DCL, an InfoNCE over the H dimensions of the two standardised views, is added with weight λ_DCL [paper §4.3];
- unsupervised only (no NLI CSV).

    h_i, h_i' = MLP(BERT(x_i)[CLS]) under dropout masks z_i, z_i';  h0_i = the same with dropout off          [B, H]
    off = -1/B sum_i log( exp(m cos(h_i, h_i')/τ) / (exp(m cos(h_i, h_i')/τ) + sum_{j≠i} exp(cos(h0_i, h0_j)/τ)) )
    h~ = (h - mean_i h) / sqrt(var_i h + 1e-5) per dimension (biased var),  C = h~ᵀ h~' / B / τ_DCL            [H, H]
    dcl = -1/H sum_c log( exp(C_cc) / sum_d exp(C_cd) )
    loss = off + λ_DCL dcl,   τ = 0.05, m = 0.9, τ_DCL = 5, λ_DCL = 0.1

    python simcsepp_min.py --data wiki1m_for_simcse.txt --device cuda
"""
import contextlib
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
    data: str = "wiki1m_for_simcse.txt"  # sentences, one per line; this name downloads
    model: str = "bert-base-uncased"  # a model folder or known name [paper]
    senteval: str = ""  # SentEval data folder; empty: ./SentEval/data/downstream, the cache, else a download
    device: str = "auto"  # auto, cpu, cuda or mps
    seed: int = 42  # [official run_unsup_example.sh]
    batch_size: int = 64  # sentences per step [paper §5.1]
    max_len: int = 32  # training length in tokens, [CLS] and [SEP] included [official run_unsup_example.sh]
    lr: float = 3e-5  # peak learning rate, linear decay to 0 [paper §5.1]
    epochs: int = 1  # [paper §5.1]
    max_steps: int = 0  # stop after this many steps (0: all epochs)
    temp: float = 0.05  # τ, the softmax temperature [paper]
    eval_every: int = 125  # STS-B dev every this many steps [official code]
    dropout: float = 0.1  # hidden and attention dropout, the only augmentation [SimCSE Table 3]
    out_dir: str = "runs/simcsepp"  # best model, log.txt and results.json
    save_every: int = 500  # steps between checkpoints (out_dir/checkpoint), one also on Ctrl-C/SIGTERM; 0: only then
    resume: str = ""  # continue the run saved in this out_dir, with its configuration; a finished run is left as is
    overwrite: bool = False  # replace the run an existing out_dir holds (else such an out_dir is refused)
    compile: bool = False  # torch.compile the encoder (CUDA graphs on CUDA; the first steps compile)
    m: float = 0.9  # scales the positive logit [paper Table 5; official pos_ratio, 1.0 in its combined script]
    lambda_dcl: float = 0.1  # λ_DCL, the weight of DCL; 0 turns DCL off [paper §5.1; official sw_weight]
    temp_dcl: float = 5.0  # τ_DCL, the temperature of DCL [paper §5.1, Table 5; official sw_temp]
    off_dropout: bool = True  # negatives from a dropout-off pass; 0: SimCSE's in-batch negatives, m unused [paper §3]
    checks = {"m": (lambda v: v > 0, "above 0"), "lambda_dcl": (lambda v: v >= 0, "0 or more"),
              "temp_dcl": (lambda v: v > 0, "above 0")}  # the method's own flags (common: the rest)


# ---- Views

def make_views(ids, mask):
    """[B, 1, L] -> [2*B, L], view-major: the sentence twice, so one forward pass draws two independent dropout
    masks [SimCSE §3]. The dropout-off pass reads the sentences once, ids[:, 0]."""
    ids, mask = ids.expand(-1, 2, -1), mask.expand(-1, 2, -1)  # [B, 2, L]
    return ids.transpose(0, 1).flatten(0, 1), mask.transpose(0, 1).flatten(0, 1)  # [2*B, L]


@contextlib.contextmanager
def dropout_off(model):
    """Every dropout of the encoder off (nn.Dropout and Layer's attention dropout both follow .training), gradients
    still on; each module's mode restored afterwards [official code: the encoder's dropouts set to .eval()]."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for m, training in modes:
            m.training = training


# ---- Heads

class MLPHead(nn.Module):
    """Linear(H, H) + tanh on [CLS], freshly initialised rather than BERT's NSP pooler, used in training only:
    the test vector is the raw [CLS] [SimCSE §3 fn. 9, Table 6; paper §5.1; official code: mlp_only_train]."""

    def __init__(self, hidden):
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        nn.init.normal_(self.dense.weight, std=0.02)  # [official code: init_weights]
        nn.init.zeros_(self.dense.bias)

    def forward(self, x):  # [N, H] -> [N, H]
        return torch.tanh(self.dense(x))


# ---- Loss

def info_nce(h1, h2, temp):
    """Cross-entropy of cos(h1_i, h2_j)/τ over j with target j = i: one direction, j = i in the denominator
    [SimCSE Eq. 1; official code]. h1, h2 [B, H] pair row by row."""
    h1, h2 = F.normalize(h1, dim=-1), F.normalize(h2, dim=-1)  # [B, H] each
    logits = h1 @ h2.T / temp  # [B, B]
    return F.cross_entropy(logits, torch.arange(len(h1), device=h1.device))


def off_dropout_nce(h1, h2, h0, temp, m):
    """InfoNCE whose negatives are cos(h0_i, h0_j)/τ, j ≠ i, both sides from the dropout-off pass, and whose
    positive m·cos(h1_i, h2_i)/τ also sits in the denominator [paper Eq. 3; official code @899e49b].
    The paper's Eq. 3 writes m on the negative sum, a constant shift of log m; the official code scales the positive
    logit (a positive-only temperature τ/m), which is what the paper's Table 5 m-sweep supports. h1, h2, h0 [B, H]."""
    h1, h2, h0 = (F.normalize(h, dim=-1) for h in (h1, h2, h0))
    eye = torch.eye(len(h1), dtype=torch.bool, device=h1.device)
    positive = m * (h1 * h2).sum(-1) / temp  # [B]
    logits = torch.where(eye, torch.diag(positive), h0 @ h0.T / temp)  # [B, B]: the positive on the diagonal
    return F.cross_entropy(logits, torch.arange(len(h1), device=h1.device))


def dcl_loss(h1, h2, temp_dcl):
    """Dimension-wise contrastive loss: each dimension of h1 must pick out the same dimension of h2 among all H
    [paper Eq. 5]. Follows the official code, not the paper's formula: BatchNorm without affine (biased variance,
    eps 1e-5), C divided by B (correlations in [-1, 1]), a mean over the H rows instead of a sum. h1, h2 [B, H]."""
    z1, z2 = ((h - h.mean(0)) / torch.sqrt(h.var(0, unbiased=False) + 1e-5) for h in (h1, h2))  # [B, H] each
    c = z1.T @ z2 / len(h1) / temp_dcl  # [H, H]
    return F.cross_entropy(c, torch.arange(c.size(0), device=c.device))


def loss_fn(h, temp, m, lambda_dcl, temp_dcl):
    """h [V, B, H], the head outputs of the 2 dropout views (3: then the dropout-off pass h0) -> (loss, stats)."""
    nce = off_dropout_nce(h[0], h[1], h[2], temp, m) if len(h) > 2 else info_nce(h[0], h[1], temp)
    dcl = dcl_loss(h[0], h[1], temp_dcl)  # on the dropout views [official code]
    loss = nce + lambda_dcl * dcl
    return loss, {"loss": loss.detach(), "nce": nce.detach(), "dcl": dcl.detach()}


# ---- Training step

def train_step(model, head, ids, mask, cfg):
    """One forward pass over both dropout views stacked, then a pass of the sentences with every dropout off,
    with gradient [official code]; the head (no dropout) maps all 3*B rows. Under torchrun each process encodes its
    share of the batch and the loss sees the whole batch, gathered: negatives and DCL over all B (common.py)."""
    B = ids.size(0)
    ids, mask = shard(ids), shard(mask)  # [b, C, L]: this process's rows of the batch (one process: all B)
    cls = model(*make_views(ids, mask), cls_only=True)[:, 0]  # [2*b, H]
    if cfg.off_dropout:
        with dropout_off(model):
            cls = torch.cat([cls, model(ids[:, 0], mask[:, 0], cls_only=True)[:, 0]])  # [3*b, H]
    h = all_gather(head(cls), views=len(cls) // len(ids)).view(-1, B, cls.size(-1))  # [V, B, H], every process
    with torch.autocast(h.device.type, enabled=False):  # the similarity/softmax math in fp32 [DESIGN]
        return loss_fn(upcast(h), cfg.temp, cfg.m, cfg.lambda_dcl, cfg.temp_dcl)


# ---- Training loop

def train(cfg):
    run = Run(cfg, "simcsepp", __file__)  # checks every input; nothing is written before run.start
    tok, model = run.load_model()
    head = MLPHead(model.cfg.hidden_size).to(run.device)
    data = run.load_data(tok, one_column=True)  # SimCSE++: unsupervised only
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
