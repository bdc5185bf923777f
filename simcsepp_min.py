"""SimCSE++: SimCSE whose negatives come from a dropout-off pass, plus a contrastive loss
over the dimensions. Xu, Shao, Chen and Liu, EMNLP 2023 (arXiv:2305.13192).

Unlike simcse_min.py: a third pass, dropout off, gives h0 and negatives cos(h0_i, h0_j) [§3];
m scales the positive logit; DCL, InfoNCE over the H standardised dimensions, adds λ_DCL.

    off = -1/B sum_i log(e^{m s_ii} / (e^{m s_ii} + sum_{j!=i} e^{t_ij})), t_ij = cos(h0_i, h0_j)/τ
    dcl = -1/H sum_c log(e^{C_cc}/sum_d e^{C_cd}), C = h~.T h~'/B/τ_DCL, s_ij = cos(h_i, h_j')/τ
    loss = off + λ_DCL dcl,  τ = 0.05, m = 0.9, τ_DCL = 5, λ_DCL = 0.1

    python simcsepp_min.py --data wiki1m.txt --device cuda

Expected (BERT-base): STS-B dev 83.77, test avg 78.05 [paper Tables 3, 5].
A 30-step CPU run on MiniLM lifts STS-B dev by about 3 points (README).
"""
import contextlib
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
    m: float = 0.9  # scales the positive logit [paper Table 5; official pos_ratio]
    lambda_dcl: float = 0.1  # λ_DCL, DCL's weight; 0: off [paper §5.1; official sw_weight]
    temp_dcl: float = 5.0  # τ_DCL, DCL's temperature [paper §5.1, Table 5; official sw_temp]
    off_dropout: bool = True  # negatives from a dropout-off pass; off: SimCSE's, no m [§3]
    checks = {"m": "(0, inf)", "lambda_dcl": "[0, inf)", "temp_dcl": "(0, inf)"}


# ---- Views

def make_views(ids, mask):
    """[B, 1, L] -> the view ids and mask [2*B, L], view-major: the sentence twice [SimCSE §3]."""
    ids, mask = ids.expand(-1, 2, -1), mask.expand(-1, 2, -1)
    return ids.transpose(0, 1).flatten(0, 1), mask.transpose(0, 1).flatten(0, 1)


@contextlib.contextmanager
def dropout_off(model):
    """Every dropout of the encoder off (nn.Dropout and the attention dropout follow
    .training), gradients still on; each module's mode restored afterwards [official: .eval()
    on dropouts]."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for m, training in modes:
            m.training = training


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

def info_nce(h1, h2, temp):
    """Cross-entropy of cos(h1_i, h2_j)/τ over j with target j = i: one direction, j = i
    in the denominator [SimCSE Eq. 1; official code]. h1, h2 [B, H] pair row by row."""
    h1, h2 = F.normalize(h1, dim=-1), F.normalize(h2, dim=-1)  # [B, H] each
    logits = h1 @ h2.T / temp  # [B, B]
    return F.cross_entropy(logits, torch.arange(len(h1), device=h1.device))


def off_dropout_nce(h1, h2, h0, temp, m):
    """InfoNCE whose negatives are cos(h0_i, h0_j)/τ, j ≠ i, both from the dropout-off pass,
    and whose positive m·cos(h1_i, h2_i)/τ is in the denominator too [paper Eq. 3; official
    @899e49b]. Eq. 3 writes m on the negative sum (a constant shift, log m); the official code
    scales the positive logit (a positive-only temperature τ/m), which Table 5's sweep supports."""
    h1, h2, h0 = (F.normalize(h, dim=-1) for h in (h1, h2, h0))
    eye = torch.eye(len(h1), dtype=torch.bool, device=h1.device)
    positive = m * (h1 * h2).sum(-1) / temp  # [B]
    logits = torch.where(eye, torch.diag(positive), h0 @ h0.T / temp)  # [B, B], positives on eye
    return F.cross_entropy(logits, torch.arange(len(h1), device=h1.device))


def dcl_loss(h1, h2, temp_dcl):
    """Dimension-wise contrastive loss: each dimension of h1 picks out the same one of h2
    [paper Eq. 5], as the official code computes it: BatchNorm without affine (biased
    variance, eps 1e-5), C divided by B (correlations in [-1, 1]), a mean over the H rows.
    h1, h2 [B, H]."""
    z1, z2 = ((h - h.mean(0)) / torch.sqrt(h.var(0, unbiased=False) + 1e-5) for h in (h1, h2))
    c = z1.T @ z2 / len(h1) / temp_dcl  # [H, H]
    return F.cross_entropy(c, torch.arange(c.size(0), device=c.device))


def loss_fn(h, temp, m, lambda_dcl, temp_dcl):
    """h [V, B, H], the head outputs of 2 dropout views (3: then the dropout-off pass h0)."""
    nce = off_dropout_nce(h[0], h[1], h[2], temp, m) if len(h) > 2 else info_nce(h[0], h[1], temp)
    dcl = dcl_loss(h[0], h[1], temp_dcl)  # on the dropout views [official code]
    loss = nce + lambda_dcl * dcl
    return loss, {"loss": loss.detach(), "nce": nce.detach(), "dcl": dcl.detach()}


# ---- Training step

def train_step(model, head, ids, mask, cfg, tok=None, gen=None):
    """One forward pass over both views stacked, then a pass with every dropout off, with
    gradient [official code]; the head maps every row of the three.
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
    if cfg.off_dropout:  # h0: the sentences once more, every dropout off, with gradient
        sentences = [shard(x[:, 0]).to(device) for x in (ids, mask)]
        with dropout_off(model):
            off = gradient_cache(model, cfg.chunk_size, *sentences, cls_only=True)  # [b, H]
        h = torch.cat([h, all_gather(head(off))[None]])  # [3, B, H]
    # the loss math in fp32 at least [G-prec]
    with torch.autocast(h.device.type, enabled=False):
        loss, stats = loss_fn(upcast(h), cfg.temp, cfg.m, cfg.lambda_dcl, cfg.temp_dcl)
    # loss + λ·MLM loss, on every view [official cl_forward: mlm_weight]
    if cfg.do_mlm:
        loss, stats = add_mlm(loss, stats, model, view_ids, view_mask, V, tok, gen, cfg)
    return loss, stats


# ---- Training loop

def train(cfg):
    run = Run(cfg, __file__)  # the run's operations: common.py Part 2
    tok, model = run.load_model(mlm_head=cfg.do_mlm)
    data = run.load_data(tok, one_column=True)  # SimCSE++: unsupervised only
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
