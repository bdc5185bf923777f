"""SimCSE: a sentence encoded twice, under two dropout masks, is its own positive; the
batch gives the negatives. Gao, Yao and Chen, EMNLP 2021 (arXiv:2104.08821).

The baseline, to read first; `diff -u simcse_min.py X_min.py` shows each other method.
An NLI CSV (sentence, entailment[, contradiction]): supervised SimCSE, batch 512, lr 5e-5.

    h_i, h_i' = MLP(BERT(x_i)[CLS]) under dropout masks z_i, z_i'             [B, H]
    loss = -1/B sum_i log(exp(cos(h_i, h_i')/τ) / sum_j exp(cos(h_i, h_j')/τ))

    python simcse_min.py --data wiki1m.txt --device cuda

Expected (BERT-base): STS-B dev 82.5, test avg 76.25 [paper Tables 3, 5].
A 30-step CPU run on MiniLM lifts STS-B dev by about 3 points (README).
"""
import dataclasses
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import (DevSet, Run, all_gather, epoch_batches, evaluate_dev, evaluate_sts,
                    gradient_cache, keep_best, main_guard, make_optimizer, optimizer_step,
                    parse_args, save_pretrained, shard, total_steps, upcast)
from common import add_mlm


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
    hard_weight: float = 0.0  # supervised: added to own contradiction's logit [official]


# ---- Views

def make_views(ids, mask):
    """[B, C, L] -> the view ids and mask [V*B, L], view-major: V = 2, the sentence twice
    (C = 1); supervised, V = C, the columns."""
    if ids.size(1) == 1:
        ids, mask = ids.expand(-1, 2, -1), mask.expand(-1, 2, -1)
    return ids.transpose(0, 1).flatten(0, 1), mask.transpose(0, 1).flatten(0, 1)


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


# ---- Loss

def info_nce(h1, h2, temp, h3=None, hard_weight=0.0):
    """Cross-entropy of cos(h1_i, h2_j)/τ over j with target j = i: one direction, j = i
    in the denominator [SimCSE Eq. 1; official code]. h1, h2 [B, H] pair row by row.
    Supervised: h3 [B, H] are hard negatives, B more logits per row [SimCSE Eq. 5]."""
    h1, h2 = F.normalize(h1, dim=-1), F.normalize(h2, dim=-1)  # [B, H] each
    logits = h1 @ h2.T / temp  # [B, B]
    if h3 is not None:
        hard = h1 @ F.normalize(h3, dim=-1).T / temp
        # hard_weight on each sentence's own contradiction only
        hard = hard + hard_weight * torch.eye(len(h1), device=h1.device)
        logits = torch.cat([logits, hard], dim=1)  # [B, 2B]
    return F.cross_entropy(logits, torch.arange(len(h1), device=h1.device))


def loss_fn(h, temp, hard_weight=0.0):
    """(loss, stats) of h [V, B, H], the head outputs of V = 2 views (3: contradictions)."""
    loss = info_nce(h[0], h[1], temp, h[2] if len(h) > 2 else None, hard_weight)
    return loss, {"loss": loss.detach()}


# ---- Training step

def train_step(model, head, ids, mask, cfg, tok=None, gen=None):
    """One forward pass over all views stacked; dropout draws a fresh mask for every row.
    --do_mlm: one more pass, over the views 15% masked, adds the masked-LM loss
    [official]. ids, mask [B, C, L], on the CPU."""
    B = ids.size(0)
    device = next(model.parameters()).device
    view_ids, view_mask = make_views(ids, mask)
    V = len(view_ids) // B
    # [V*b, L] each: this process's b rows of each view (torchrun; else b = B)
    mine = [shard(x, V).to(device) for x in (view_ids, view_mask)]
    cls = gradient_cache(model, cfg.chunk_size, *mine, cls_only=True)  # [V*b, H]
    h = all_gather(head(cls), V).view(V, B, -1)  # [V, B, H]: every process's rows
    # the loss math in fp32 at least [G-prec]
    with torch.autocast(h.device.type, enabled=False):
        loss, stats = loss_fn(upcast(h), cfg.temp, cfg.hard_weight)
    # loss + λ·MLM loss, on every view [official cl_forward: mlm_weight]
    if cfg.do_mlm:
        loss, stats = add_mlm(loss, stats, model, view_ids, view_mask, V, tok, gen, cfg)
    return loss, stats


# ---- Training loop

def train(cfg):
    run = Run(cfg, __file__)  # the run's operations: common.py Part 2
    tok, model = run.load_model(mlm_head=cfg.do_mlm)
    data = run.load_data(tok)
    dev_set = DevSet(tok, run.dev_pairs, model.cfg.max_tokens)
    model = model.to(run.device)
    # in BERT's pooler's place: trained, checkpointed and saved with the model
    model.pooler = head = MLPHead(model.cfg.hidden_size).to(run.device)
    total = total_steps(len(data), cfg)
    params = [*model.parameters()]
    opt, sched = make_optimizer(params, cfg.lr, total, run.device)
    gen = torch.Generator(run.device).manual_seed(cfg.seed) if cfg.do_mlm else None
    best = dict(dev=-math.inf, step=0, state=None)
    # what each checkpoint holds (out_dir/checkpoint.pt), and --resume restores:
    checkpointed = dict(model=model, opt=opt, sched=sched, amp=run.amp, best=best, gen=gen)
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
        with run.amp.autocast():
            loss, stats = train_step(ddp_model, head, *next(batches), cfg, tok, gen)
        optimizer_step(loss, opt, sched, run.amp)
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
