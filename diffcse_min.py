"""DiffCSE: SimCSE plus a discriminator that, given the sentence vector, spots the tokens
a masked LM replaced in a corrupted copy. Chuang et al., NAACL 2022 (arXiv:2204.10298).

Unlike simcse_min.py: a BatchNorm projector; a frozen generator fills in each view, 30%
masked, as x''; a second BERT reads x'' with h at position 0 and spots replaced tokens.

    loss = InfoNCE(h, h') + λ_RTD mean_it CE(D(x_i'', h_i)_t, 1(x''_it != x_it)),  λ_RTD = 0.005

    python diffcse_min.py --data wiki1m.txt --device cuda

Expected (BERT-base): STS-B dev 84.56, test avg 78.49 [paper Tables 1, 3].
A 30-step CPU run on MiniLM lifts STS-B dev by about 0.4 points at lr 7e-6 (README).
"""
import dataclasses
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import (DevSet, Run, all_gather, epoch_batches, evaluate_dev, evaluate_sts,
                    gradient_cache, keep_best, main_guard, make_optimizer, optimizer_step,
                    parse_args, save_pretrained, shard, total_steps, upcast)
from common import UserError, mask_tokens


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
    lr: float = 7e-6  # peak learning rate, linear decay to 0 [paper App. A; run_diffcse.sh]
    epochs: int = 2  # passes over the data [paper App. A; official run_diffcse.sh]
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
    mask_ratio: float = 0.30  # share of real tokens masked for the generator [paper App. A]
    lambda_rtd: float = 0.005  # λ_RTD, the weight of the token-mean RTD loss [paper App. A]
    generator: str = "distilbert-base-uncased"  # frozen masked LM with its MLM head [§4.1]
    checks = {"mask_ratio": "[0, 1]", "lambda_rtd": "[0, inf)"}


# ---- Views

def make_views(ids, mask):
    """[B, 1, L] -> the view ids and mask [2*B, L], view-major: the sentence twice [SimCSE §3]."""
    ids, mask = ids.expand(-1, 2, -1), mask.expand(-1, 2, -1)
    return ids.transpose(0, 1).flatten(0, 1), mask.transpose(0, 1).flatten(0, 1)


@torch.no_grad()
def corrupt(generator, masked, ids, mask, tok):
    """masked -> (x'', labels [N, L]): the generator's argmax [official; paper: sampled],
    [CLS] and pads kept. subtle: a token it reproduces is original (0); one it changes, 1."""
    filled = generator.mlm_logits(generator(masked, mask)).argmax(-1)
    filled[:, 0] = tok.cls_id
    filled = torch.where(mask.bool(), filled, ids)
    return filled, (filled != ids).long()


# ---- Heads

class BNProjector(nn.Module):
    """Linear(H, 2H) -> BatchNorm -> ReLU -> Linear(2H, H) -> BatchNorm without affine, no
    biases; training only (the test vector: raw [CLS]) [App. A; official ProjectionMLP]."""

    def __init__(self, hidden):
        super().__init__()
        H = hidden
        self.net = nn.Sequential(nn.Linear(H, 2 * H, bias=False), nn.BatchNorm1d(2 * H), nn.ReLU(),
                                 nn.Linear(2 * H, H, bias=False), nn.BatchNorm1d(H, affine=False))
        for m in self.net[::3]:
            nn.init.normal_(m.weight, std=0.02)  # [official code: init_weights runs after]

    def forward(self, x):
        return self.net(x)


class Discriminator(nn.Module):
    """BERT + Linear(H, 2) per token, h in place of the position-0 embedding [official]."""

    def __init__(self, bert):
        super().__init__()
        self.bert = bert
        bert.pooler = None  # unused: DDP needs every parameter used [issue 57]
        self.head = nn.Linear(bert.cfg.hidden_size, 2)

    def forward(self, ids, mask, h):
        """ids, mask [N, L], h [N, H] -> logits [N, L, 2]."""
        x = self.bert.embeddings(ids)
        x = torch.cat([h[:, None].to(x.dtype), x[:, 1:]], dim=1)  # no extra LayerNorm [official]
        return self.head(self.bert.encode(x, mask))


def load_generator(run, tok):
    """The frozen masked LM, not optimized [§4.1], with tok's vocabulary [official issue #1]."""
    generator_tok, generator = run.load_model("--generator", mlm_head=True)
    if generator_tok.vocab != tok.vocab:
        raise UserError(f"--generator {run.cfg.generator} has another vocabulary (RoBERTa: "
                        f"distilroberta-base)")
    return generator.requires_grad_(False).train()  # subtle: its dropout stays on [official]


# ---- Loss

def info_nce(h1, h2, temp):
    """Cross-entropy of cos(h1_i, h2_j)/τ over j with target j = i: one direction, j = i
    in the denominator [SimCSE Eq. 1; official code]. h1, h2 [B, H] pair row by row."""
    h1, h2 = F.normalize(h1, dim=-1), F.normalize(h2, dim=-1)  # [B, H] each
    logits = h1 @ h2.T / temp  # [B, B]
    return F.cross_entropy(logits, torch.arange(len(h1), device=h1.device))


def rtd_loss(logits, labels, mask):
    """RTD: mean CE over the N·W positions to the longest sentence, W (--compile pads past
    it). subtle: pads count (label 0), as in the official code; the paper: real ones."""
    nll = F.cross_entropy(logits.transpose(1, 2), labels, reduction="none")
    return (nll * mask.any(0)).sum() / (len(nll) * mask.any(0).sum())


def loss_fn(h, logits, labels, mask, temp, lambda_rtd):
    """h [2, B, H]; logits [2B, L, 2]; labels, mask [2B, L] -> loss, RTD stats."""
    rtd = rtd_loss(logits, labels, mask)
    loss = info_nce(h[0], h[1], temp) + lambda_rtd * rtd
    pred, real = logits.detach().argmax(-1), mask.bool()
    replaced, kept = real & (labels == 1), real & (labels == 0)
    return loss, {"loss": loss.detach(), "rtd": rtd.detach(),
                  "replaced": replaced.sum() / real.sum(),
                  "acc_replaced": (replaced & (pred == 1)).sum() / replaced.sum().clamp(min=1),
                  "acc_kept": (kept & (pred == 0)).sum() / kept.sum().clamp(min=1)}


# ---- Training step

def train_step(model, head, ids, mask, cfg, disc, generator, tok, gen):
    """One encoder pass over both views stacked; each view's corrupted copy is judged given
    its h. ids, mask [B, C, L], on the CPU."""
    B = ids.size(0)
    device = next(model.parameters()).device
    view_ids, view_mask = (x.to(device) for x in make_views(ids, mask))
    V = len(view_ids) // B
    masked, _ = mask_tokens(view_ids, view_mask, cfg.mask_ratio, tok.mask_id, len(tok.vocab),
                            tok.special_ids, gen)
    # [V*b, L] each: this process's b rows of each view (torchrun; else b = B)
    mine = [shard(x, V).to(device) for x in (view_ids, view_mask)]
    cls = gradient_cache(model, cfg.chunk_size, *mine, cls_only=True)  # [V*b, H]
    h = head(all_gather(cls, V))  # [V*B, H]: BatchNorm over every process's rows
    corrupted, labels = corrupt(generator, shard(masked, V), *mine, tok)
    # [V*b, L, 2] (mine[1]: this process's mask); h's gradient flows back through it
    logits = gradient_cache(disc, cfg.chunk_size, corrupted, mine[1], shard(h, V))
    logits, labels = (all_gather(x, V) for x in (logits, labels))
    # the loss math in fp32 at least [G-prec]
    with torch.autocast(h.device.type, enabled=False):
        h, logits = upcast(h.view(V, B, -1)), upcast(logits)
        loss, stats = loss_fn(h, logits, labels, view_mask, cfg.temp, cfg.lambda_rtd)
    return loss, stats


# ---- Training loop

def train(cfg):
    run = Run(cfg, __file__, models=("model", "generator"))  # DiffCSE: the generator's checks
    tok, model = run.load_model()  # DiffCSE: without --do_mlm
    data = run.load_data(tok, one_column=True)  # DiffCSE: unsupervised only
    dev_set = DevSet(tok, run.dev_pairs, model.cfg.max_tokens)
    model = model.to(run.device)
    # in BERT's pooler's place: trained, checkpointed and saved with the model
    model.pooler = head = BNProjector(model.cfg.hidden_size).to(run.device)  # DiffCSE: BN MLP
    disc = Discriminator(run.load_model()[1]).to(run.device)  # DiffCSE: its own pretrained copy
    generator = load_generator(run, tok).to(run.device)  # DiffCSE: frozen
    gen = torch.Generator(run.device).manual_seed(cfg.seed)  # DiffCSE: the masking draws
    total = total_steps(len(data), cfg)
    params = [*model.parameters()]
    params += disc.parameters()  # DiffCSE: the discriminator trains too
    opt, sched = make_optimizer(params, cfg.lr, total, run.device)
    best = dict(dev=-math.inf, step=0, state=None)
    # what each checkpoint holds (out_dir/checkpoint.pt), and --resume restores:
    checkpointed = dict(model=model, opt=opt, sched=sched, amp=run.amp, best=best, gen=gen)
    checkpointed.update(disc=disc)  # DiffCSE
    run.compile(model)
    start, stats = run.start(checkpointed, total)  # 0, or the resumed step and its stats
    ddp_model = run.ddp(model).train()  # torchrun: gradients averaged over the processes
    ddp_disc = run.ddp(disc).train()  # DiffCSE
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
            loss, stats = train_step(ddp_model, head, *next(batches), cfg, ddp_disc, generator,
                                     tok, gen)
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
