"""ESimCSE: the positive is the sentence with a few sub-words repeated; a momentum-encoder
queue adds negatives. Wu, Gao, Zang, Han, Wang and Hu, COLING 2022 (arXiv:2109.04380).

Unlike simcse_min.py: the positive repeats sub-words; an EMA encoder queues negatives.

    loss = -1/B sum_i log(e^{s_ii} / (sum_j e^{s_ij} + sum_m e^{t_im})),  M = 160
    s_ij = cos(h_i, h_j⁺)/τ, t_im = cos(h_i, q_m)/τ;  θ_m <- μ·θ_m + (1-μ)·θ, μ = 0.995

    python esimcse_min.py --data wiki1m.txt --device cuda

Expected (BERT-base): STS-B dev 84.85, test avg 78.27 [paper Tables 3, 4].
A 30-step CPU run on MiniLM lifts STS-B dev by about 3 points (README).
"""
import collections
import copy
import dataclasses
import math
import random

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import (DevSet, Run, all_gather, epoch_batches, evaluate_dev, evaluate_sts,
                    gradient_cache, keep_best, main_guard, make_optimizer, optimizer_step,
                    parse_args, save_pretrained, shard, total_steps, upcast)
from common import add_mlm
from common import check_positions, pad_ids


# ---- Config

@dataclasses.dataclass
class Config:
    data: str = "wiki1m.txt"  # one sentence a line (SimCSE: or an NLI CSV); fetched once
    model: str = "bert-base-uncased"  # a model folder, or a known name fetched once
    senteval: str = ""  # SentEval's folder; empty: ./SentEval/data/downstream or fetched
    dev_file: str = ""  # TSV (sentence 1, sentence 2, score) that picks the best step
    device: str = "auto"  # cpu, cuda or mps; auto: cuda, else mps, else cpu
    precision: str = "auto"  # bf16, or fp16 + a loss scaler on older GPUs; CPU: fp32
    seed: int = 42  # dropout, data order, views [official run_unsup_example.sh]
    batch_size: int = 64  # sentences per step [every paper, BERT-base]
    chunk_size: int = 0  # rows encoded at once (0: all); the loss sees the whole batch
    max_len: int = 32  # training length in tokens with [CLS] and [SEP] [official code]
    lr: float = 3e-5  # peak learning rate, linear decay to 0 [every paper but DiffCSE]
    epochs: int = 1  # passes over the data [every paper but DiffCSE]
    max_steps: int = 0  # stop after this many steps (0: all epochs)
    temp: float = 0.05  # τ, the softmax temperature [every paper]
    eval_every: int = 125  # STS-B dev every this many steps [official code]
    test: str = "sts"  # the final table: sts, the 7 STS test sets [papers]; or none
    dropout: float = 0.1  # hidden and attention dropout [SimCSE Table 3]
    out_dir: str = ""  # best model, log.txt and results.json; empty: runs/<method>
    save_every: int = 500  # steps between checkpoints; one also at the end and on a signal
    resume: str = ""  # continue the run saved in this out_dir, with its configuration
    overwrite: bool = False  # replace the run an existing out_dir holds (else refused)
    compile: bool = False  # torch.compile the encoder (slow first steps)
    do_mlm: bool = False  # add the masked-LM loss of --model's MLM head [official]
    mlm_weight: float = 0.1  # λ: loss + λ·MLM loss (--do_mlm) [official train.py]
    dup_rate: float = 0.32  # most sub-words repeated, share of the length [paper Table 9]
    queue_size: int = 160  # M, queued negatives, 2.5·B; 0: no queue [paper Table 10]
    momentum: float = 0.995  # μ of the momentum encoder's EMA [paper §4.2]
    checks = {"dup_rate": "[0, 1]", "queue_size": "[0, inf)", "momentum": "[0, 1]"}


# ---- Views

def repeat_subwords(ids, mask, dup_rate, rng, width=None):
    """ids, mask [B, L] -> [B, L'], dup_len of positions 1..L-2 written twice [paper §3.1;
    official train.py; Eq. 3: randrange(max(2, ...))]. [impl] Drawn each step, not once."""
    index = []
    for n in mask.sum(1).tolist():
        k = int(dup_rate * n)
        dup = rng.sample(range(1, n - 1), min(rng.randrange(min(10, k)), n - 2)) if k > 0 else []
        # each chosen position twice: [0, 1, 1, 2, ...]
        index.append(sorted([*range(n), *dup]))
    index, new_mask = pad_ids(index, 0, width)
    return ids.gather(1, index) * new_mask, new_mask


def make_views(ids, mask, dup_rate, rng, fixed=False):
    """[B, 1, L] -> the view ids and mask [2B, L']: the sentences, then their repeats, padded
    to one width (fixed, for --compile: L + 9, the most repeats: every step one shape)."""
    width = ids.size(2) + 9 if fixed else None
    repeated = repeat_subwords(ids[:, 0], mask[:, 0], dup_rate, rng, width)
    pad = (0, repeated[0].size(1) - ids.size(2))
    return tuple(torch.cat([F.pad(x[:, 0], pad), r]) for x, r in zip((ids, mask), repeated))


# ---- Heads

class MLPHead(nn.Module):
    """Linear(H, H) + tanh on [CLS], new in BERT's pooler's place, saved as it. Test
    vector: the raw [CLS] [SimCSE Table 6; mlp_only_train]; supervised, this MLP's
    [official run_sup_example.sh]."""

    def __init__(self, hidden):
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        nn.init.normal_(self.dense.weight, std=0.02)  # [official code: init_weights]
        nn.init.zeros_(self.dense.bias)

    def forward(self, x):
        return torch.tanh(self.dense(x))


def momentum_encoder(model):
    """The encoder that fills the queue [paper §3.2]; subtle: dropout off [paper §1]. [impl] A
    copy of the pretrained one: the official one, copied before loading, starts out random."""
    return copy.deepcopy(model).eval().requires_grad_(False)


@torch.no_grad()
def momentum_update(momentum, model, mu):
    """θ_m <- μ·θ_m + (1 - μ)·θ [paper Eq. 5], once per step, after the optimizer step."""
    torch._foreach_lerp_(list(momentum.parameters()), list(model.parameters()), 1 - mu)

# ---- Loss

def info_nce_with_queue(h1, h2, queue, temp):
    """Cross-entropy of cos(h1_i, h2_j)/τ over j with target j = i: one direction, j = i
    in the denominator [SimCSE Eq. 1; official code]. h1, h2 [B, H] pair row by row.
    The queue [M, H] (M may be 0) adds M more negative logits per row [paper Eq. 6]."""
    h1, h2 = F.normalize(h1, dim=-1), F.normalize(h2, dim=-1)  # [B, H] each
    logits = h1 @ h2.T / temp  # [B, B]
    negatives = h1 @ F.normalize(queue, dim=-1).T / temp  # [B, M]: constants, no gradient
    logits = torch.cat([logits, negatives], dim=1)  # [B, B + M]
    return F.cross_entropy(logits, torch.arange(len(h1), device=h1.device))


def loss_fn(h, queue, temp):
    """h [2, B, H]: the sentences' and their repeats' head outputs; queue [M, H]."""
    loss = info_nce_with_queue(h[0], h[1], queue, temp)
    return loss, {"loss": loss.detach()}


# ---- Training step

def train_step(model, head, ids, mask, cfg, momentum, queue, rng, tok=None, gen=None):
    """One pass over both views stacked; the momentum vectors then join the queue [official].
    --do_mlm: one more pass, over the views 15% masked, adds the masked-LM loss
    [official]. ids, mask [B, C, L], on the CPU."""
    B = ids.size(0)
    device = next(model.parameters()).device
    view_ids, view_mask = make_views(ids, mask, cfg.dup_rate, rng, cfg.compile)
    V = len(view_ids) // B
    # [V*b, L] each: this process's b rows of each view (torchrun; else b = B)
    mine = [shard(x, V).to(device) for x in (view_ids, view_mask)]
    cls = gradient_cache(model, cfg.chunk_size, *mine, cls_only=True)  # [V*b, H]
    h = all_gather(head(cls), V).view(V, B, -1)  # [V, B, H]: every process's rows
    queued = torch.stack([*queue]) if queue else h.new_zeros(0, h.size(-1))
    # the loss math in fp32 at least [G-prec]
    with torch.autocast(h.device.type, enabled=False):
        loss, stats = loss_fn(upcast(h), upcast(queued), cfg.temp)
    # loss + λ·MLM loss, on every view [official cl_forward: mlm_weight]
    if cfg.do_mlm:
        loss, stats = add_mlm(loss, stats, model, view_ids, view_mask, V, tok, gen, cfg)
    # the sentences, through the online head, detached, join the queue [official code]
    if momentum is not None:
        sentences = [shard(x[:, 0]).to(device) for x in (ids, mask)]
        q = head(gradient_cache(momentum, cfg.chunk_size, *sentences, cls_only=True)).detach()
        queue.extend(upcast(all_gather(q)).unbind())
    return loss, stats


# ---- Training loop

def train(cfg):
    run = Run(cfg, __file__)  # the run's operations: common.py Part 2
    tok, model = run.load_model(mlm_head=cfg.do_mlm)
    check_positions(model, cfg.max_len, extra=9)  # ESimCSE: the repeated view's 9 more tokens
    data = run.load_data(tok, one_column=True)  # ESimCSE: unsupervised only
    dev_set = DevSet(tok, run.dev_pairs, model.cfg.max_tokens)
    model = model.to(run.device)
    # in BERT's pooler's place: trained, checkpointed and saved with the model
    model.pooler = head = MLPHead(model.cfg.hidden_size).to(run.device)
    momentum = momentum_encoder(model) if cfg.queue_size > 0 else None  # ESimCSE: needs a queue
    total = total_steps(len(data), cfg)
    params = [*model.parameters()]
    opt, sched = make_optimizer(params, cfg.lr, total, run.device)
    gen = torch.Generator(run.device).manual_seed(cfg.seed) if cfg.do_mlm else None
    best = dict(dev=-math.inf, step=0, state=None)
    rng, queue = random.Random(cfg.seed), collections.deque(maxlen=cfg.queue_size)  # ESimCSE
    # what each checkpoint holds (out_dir/checkpoint.pt), and --resume restores:
    checkpointed = dict(model=model, opt=opt, sched=sched, amp=run.amp, best=best, gen=gen)
    checkpointed.update(momentum=momentum, queue=queue, rng=rng)  # ESimCSE
    run.compile(model)
    start, stats = run.start(checkpointed, total)  # 0, or the resumed step and its stats
    ddp_model = run.ddp(model).train()  # torchrun: gradients averaged over the processes
    batches = epoch_batches(data, tok, cfg, start, total)
    for step in range(start, total + 1):
        # STS-B dev at step 0, every eval_every steps and after the last step (rank 0)
        if run.rank == 0 and (step % cfg.eval_every == 0 or step == total):
            dev = evaluate_dev(model, dev_set, run.pooler, run.progress("STS-B dev"))
            keep_best(best, step, dev["stsb_dev"], model)
            run.log_dev(step, dev, stats, best)
        if step == total:
            break
        if step % (len(data) // cfg.batch_size) == 0:  # ESimCSE: empty each epoch [official]
            queue.clear()
        with run.amp.autocast():
            loss, stats = train_step(ddp_model, head, *next(batches), cfg, momentum, queue, rng,
                                     tok, gen)
        optimizer_step(loss, opt, sched, run.amp)
        if momentum is not None:  # ESimCSE: θ_m <- μ·θ_m + (1 - μ)·θ, after the step
            momentum_update(momentum, model, cfg.momentum)
        # the log, the checkpoint, a Ctrl-C or SIGTERM (exit 128 + n); True: a non-finite loss
        if run.after_step(step + 1, loss, stats, checkpointed):
            break
    if run.rank > 0:
        return run.release()
    model.load_state_dict(best["state"])  # the best dev state [official]
    test = {} if cfg.test == "none" else evaluate_sts(
        model, tok, run.senteval, "test", run.pooler, progress=run.progress("STS test"))
    save_pretrained(model, run.out, tok, run.pooler)  # as the released models are [official]
    # the test table and results.json; stopped by a non-finite loss: exit status 3
    return run.finish(test, best)


# ---- CLI

if __name__ == "__main__":
    main_guard(train, parse_args(Config))
