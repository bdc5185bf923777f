"""SimCSE: a sentence encoded twice, under two dropout masks, is its own positive; the batch gives
the negatives. Gao, Yao and Chen, EMNLP 2021 (arXiv:2104.08821).

The baseline: read it first; `diff -u simcse_min.py X_min.py` then shows each other method. Given an
NLI CSV (sentence, entailment[, contradiction]) it trains supervised SimCSE (batch 512, lr 5e-5).

    h_i, h_i' = MLP(BERT(x_i)[CLS]) under dropout masks z_i, z_i'                         [B, H]
    loss = -1/B sum_i log( exp(cos(h_i, h_i')/τ) / sum_j exp(cos(h_i, h_j')/τ) ),  τ = 0.05

    python simcse_min.py --data wiki1m.txt --device cuda

Expected (BERT-base): STS-B dev 82.5, test avg 76.25 [paper Tables 3, 5].
A 30-step CPU run on MiniLM lifts STS-B dev by about 3 points (README).
"""
import dataclasses
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import (DevSet, LossWatch, Run, all_gather, epoch_batches, evaluate_dev, evaluate_sts,
                    keep_best, main_guard, make_optimizer, optimizer_step, parse_args,
                    save_pretrained, shard, total_steps, upcast)
from common import add_mlm  # --do_mlm


# ---- Config

@dataclasses.dataclass
class Config:
    data: str = "wiki1m.txt"  # sentences, one a line (SimCSE: or an NLI CSV); this name downloads
    model: str = "bert-base-uncased"  # a model folder, or a known name fetched once [every paper]
    senteval: str = ""  # SentEval folder; empty: ./SentEval/data/downstream, else fetched once
    dev_file: str = ""  # TSV: sentence 1, sentence 2, score; picks the best step (empty: STS-B dev)
    device: str = "auto"  # cpu, cuda or mps; auto: cuda, else mps, else cpu
    precision: str = "auto"  # auto: bf16 where the GPU has it, else fp16 + a loss scaler; CPU: fp32
    seed: int = 42  # dropout masks, data order, views [official run_unsup_example.sh]
    batch_size: int = 64  # sentences per step [every paper, BERT-base]
    chunk_size: int = 0  # sentences at once (0: all): the whole batch's step, other dropout masks
    max_len: int = 32  # training length in tokens, [CLS] and [SEP] included [official code]
    lr: float = 3e-5  # peak learning rate, linear decay to 0 [every paper but DiffCSE]
    epochs: int = 1  # passes over the data [every paper but DiffCSE]
    max_steps: int = 0  # stop after this many steps (0: all epochs)
    temp: float = 0.05  # τ, the softmax temperature [every paper]
    eval_every: int = 125  # STS-B dev every this many steps [official code]
    test: str = "sts"  # the final table: sts, the 7 STS test sets [papers]; none: no table
    dropout: float = 0.1  # hidden and attention dropout [SimCSE Table 3]
    out_dir: str = ""  # best model, log.txt and results.json; empty: runs/<method>
    save_every: int = 500  # steps between checkpoints (checkpoint.pt; also the last step, a signal)
    resume: str = ""  # continue the run saved in this out_dir, with its configuration
    overwrite: bool = False  # replace the run an existing out_dir holds (else it is refused)
    compile: bool = False  # torch.compile the encoder (CUDA graphs on CUDA; slow first steps)
    do_mlm: bool = False  # add BERT's masked-LM loss, its MLM head from --model [official train.py]
    mlm_weight: float = 0.1  # λ: loss + λ·MLM loss (--do_mlm) [official train.py]
    hard_weight: float = 0.0  # supervised: added to each own contradiction's logit [official]


# ---- Views

def make_views(ids, mask):
    """[B, C, L] -> [V*B, L], view-major: the sentence twice (C = 1; supervised: the C columns)."""
    if ids.size(1) == 1:
        ids, mask = ids.expand(-1, 2, -1), mask.expand(-1, 2, -1)  # [B, 2, L]
    return ids.transpose(0, 1).flatten(0, 1), mask.transpose(0, 1).flatten(0, 1)  # [V*B, L]


# ---- Heads

class MLPHead(nn.Module):
    """Linear(H, H) + tanh on [CLS], new in BERT's pooler's place, saved as it. Test vector: the raw
    [CLS] [SimCSE Table 6; mlp_only_train]; supervised, this MLP's [official run_sup_example.sh]."""

    def __init__(self, hidden):
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        nn.init.normal_(self.dense.weight, std=0.02)  # [official code: init_weights]
        nn.init.zeros_(self.dense.bias)

    def forward(self, x):  # [N, H] -> [N, H]
        return torch.tanh(self.dense(x))


# ---- Loss

def info_nce(h1, h2, temp, h3=None, hard_weight=0.0):
    """Cross-entropy of cos(h1_i, h2_j)/τ over j with target j = i: one direction, j = i in the
    denominator [SimCSE Eq. 1; official code]. h1, h2 [B, H] pair row by row.
    Supervised: h3 [B, H] are hard negatives, B more logits per row [SimCSE Eq. 5]."""
    h1, h2 = F.normalize(h1, dim=-1), F.normalize(h2, dim=-1)  # [B, H] each
    logits = h1 @ h2.T / temp  # [B, B]
    if h3 is not None:
        hard = h1 @ F.normalize(h3, dim=-1).T / temp  # [B, B]
        hard = hard + hard_weight * torch.eye(len(h1), device=h1.device)  # own contradiction only
        logits = torch.cat([logits, hard], dim=1)  # [B, 2B]
    return F.cross_entropy(logits, torch.arange(len(h1), device=h1.device))


def loss_fn(h, temp, hard_weight=0.0):
    """h [V, B, H], the head outputs of V = 2 views (3 with contradictions) -> (loss, stats)."""
    loss = info_nce(h[0], h[1], temp, h[2] if len(h) > 2 else None, hard_weight)
    return loss, {"loss": loss.detach()}


# ---- Training step

def train_step(model, head, ids, mask, cfg, tok=None, gen=None):
    """One forward pass over all views stacked; dropout samples a fresh mask for every row.
    --do_mlm: one more pass, over the views 15% masked, adds the masked-LM loss [official]."""
    B, device = ids.size(0), next(model.parameters()).device  # ids, mask [B, C, L] on the CPU
    views = make_views(ids, mask)  # [V*B, L] each, the whole batch: --do_mlm masks them
    ids, mask = shard(ids).to(device), shard(mask).to(device)  # [b, C, L]: this process's rows
    sharded = [shard(v, len(v) // B).to(device) for v in views]  # [V*b, L] each: this process's
    cls = model(*sharded, cls_only=True, chunk_size=cfg.chunk_size)  # [V*b, H]
    h = all_gather(head(cls), views=len(cls) // len(ids)).view(-1, B, cls.size(-1))  # [V, B, H]
    with torch.autocast(h.device.type, enabled=False):  # the loss math in fp32 at least [G-prec]
        loss, stats = loss_fn(upcast(h), cfg.temp, cfg.hard_weight)
    if cfg.do_mlm:  # loss + λ·MLM loss, on every view [official cl_forward: mlm_weight]
        loss, stats = add_mlm(loss, stats, model, views, B, tok, gen, cfg)
    return loss, stats


# ---- Training loop

def train(cfg):
    run = Run(cfg, __file__)  # operations (common.py Part 2): checks, log, checkpoints, signals
    tok, model = run.load_model(mlm_head=cfg.do_mlm)  # Tokenizer and Bert (the CPU)
    data = run.load_data(tok)  # the corpus tokenized before the model is on the device (cached)
    dev_set = DevSet(tok, run.dev_pairs, model.cfg.max_tokens)  # picks the best step [SimCSE]
    model = model.to(run.device)
    model.pooler = head = MLPHead(model.cfg.hidden_size).to(run.device)  # saved as BERT's pooler
    total = total_steps(len(data), cfg)
    params = [*model.parameters()]  # the head too: it is the model's pooler
    opt, sched = make_optimizer(params, cfg.lr, total, run.device)
    gen = torch.Generator(run.device).manual_seed(cfg.seed) if cfg.do_mlm else None  # masking
    best, stopped = dict(dev=-math.inf, step=0, state=None), ""  # the best dev score, step, state
    # what each checkpoint holds (out_dir/checkpoint.pt), and --resume restores:
    checkpointed = dict(model=model, opt=opt, sched=sched, amp=run.amp, best=best, gen=gen)
    run.compile(model)
    start, stats = run.start(checkpointed, total)  # 0, or the resumed step, as it was then
    ddp_model = run.ddp(model).train()  # torchrun: gradients averaged (the head's too)
    batches, watch = epoch_batches(data, tok, cfg, start, total), LossWatch()
    for step in range(start, total + 1):  # step: optimizer steps done so far
        stop = run.signal_received(step)  # Ctrl-C or SIGTERM, the same on every process
        due = step == total or cfg.save_every and step % cfg.save_every == 0  # and the last step:
        if stopped := watch.stopped(step, read=due or step % cfg.eval_every == 0):  # exit status 3
            break  # a non-finite loss: stop, keeping the best model so far
        if step > start and (stop or due):  # the final evaluation and save can be resumed
            run.save_checkpoint(step, checkpointed, stats)
        if stop:
            run.exit_on_signal(step)  # exit status 128 + signal; `--resume out_dir` continues
        if run.rank == 0 and (step % cfg.eval_every == 0 or step == total):  # step 0, every, last
            dev = evaluate_dev(model, dev_set, run.pooler, run.progress("STS-B dev"))  # rank 0
            keep_best(best, step, dev["stsb_dev"], model)  # in memory; the test table uses it
            run.log_dev(step, dev, stats, best)
        if step == total:
            break
        with run.amp.autocast():  # bf16 or fp16 autocast, or none (fp32)
            loss, stats = train_step(ddp_model, head, *next(batches), cfg, tok, gen)
        watch.note(loss, step + 1)  # on the device, read above: no host sync per step
        optimizer_step(loss, opt, sched, run.amp)
        run.log_progress(step + 1, stats)
    if run.rank > 0:  # torchrun: rank 0 alone tests and saves
        return run.release()
    if best["state"] is not None:  # the end of the run: back to the best dev state [official]
        model.load_state_dict(best["state"])
    test = {} if cfg.test == "none" else evaluate_sts(  # the test vector, as at dev
        model, tok, run.senteval, "test", run.pooler, progress=run.progress("STS test"))
    save_pretrained(model, run.out, tok, run.pooler)  # as the released models are [official]
    return run.finish(test, best, stopped)  # the log, results.json; stopped: exit 3


# ---- CLI

if __name__ == "__main__":
    main_guard(train, parse_args(Config))
