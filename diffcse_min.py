"""DiffCSE: SimCSE's dropout positives, plus a discriminator that, given the sentence vector, spots
the tokens a masked LM replaced in a corrupted copy. Chuang et al., NAACL 2022 (arXiv:2204.10298).

Unlike simcse_min.py: a BatchNorm projector; a frozen generator fills in each view 30% masked: x'';
a second BERT reads x'' with the view's h at position 0 and tells replaced tokens (RTD) [paper §3].

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

from common import (DevSet, LossWatch, Run, all_gather, epoch_batches, evaluate_dev, evaluate_sts,
                    keep_best, main_guard, make_optimizer, optimizer_step, parse_args,
                    save_pretrained, shard, total_steps, upcast)
from common import UserError, gradient_cache, mask_tokens  # DiffCSE


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
    lr: float = 7e-6  # peak learning rate, linear decay to 0 [paper App. A; run_diffcse.sh]
    epochs: int = 2  # passes over the data [paper App. A; official run_diffcse.sh]
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
    mask_ratio: float = 0.30  # share of real tokens masked for the generator [paper App. A]
    lambda_rtd: float = 0.005  # λ_RTD, the weight of the token-mean RTD loss [paper App. A]
    generator: str = "distilbert-base-uncased"  # frozen masked LM with its MLM head [paper §4.1]
    checks = {"mask_ratio": "[0, 1]", "lambda_rtd": "[0, inf)"}  # own ranges


# ---- Views

def make_views(ids, mask):
    """[B, 1, L] -> [2*B, L], view-major: the sentence twice [SimCSE §3]."""
    ids, mask = ids.expand(-1, 2, -1), mask.expand(-1, 2, -1)  # [B, 2, L]
    return ids.transpose(0, 1).flatten(0, 1), mask.transpose(0, 1).flatten(0, 1)  # [V*B, L]


@torch.no_grad()
def corrupt(generator, masked, ids, mask, tok):
    """masked -> (x'', labels [N, L]): the generator's argmax [official; the paper samples], [CLS]
    and pads kept. subtle: a token it reproduces is original (0); an unmasked one it changes, 1."""
    filled = generator.mlm_logits(generator(masked, mask)).argmax(-1)  # [N, L]
    filled[:, 0] = tok.cls_id
    filled = torch.where(mask.bool(), filled, ids)
    return filled, (filled != ids).long()  # pads and [CLS] are 0


# ---- Heads

class BNProjector(nn.Module):
    """Linear(H, 2H) -> BatchNorm -> ReLU -> Linear(2H, H) -> BatchNorm without affine, no biases,
    training only: the test vector is the raw [CLS] [paper App. A; official ProjectionMLP]."""

    def __init__(self, hidden):
        super().__init__()
        H = hidden
        self.net = nn.Sequential(nn.Linear(H, 2 * H, bias=False), nn.BatchNorm1d(2 * H), nn.ReLU(),
                                 nn.Linear(2 * H, H, bias=False), nn.BatchNorm1d(H, affine=False))
        for m in self.net[::3]:
            nn.init.normal_(m.weight, std=0.02)  # [official code: init_weights runs after]

    def forward(self, x):  # [N, H] -> [N, H]
        return self.net(x)


class Discriminator(nn.Module):
    """A second BERT + Linear(H, 2) per token; h replaces the position-0 embedding [official]."""

    def __init__(self, bert):
        super().__init__()
        self.bert = bert
        bert.pooler = None  # the checkpoint's, unused: DDP needs every parameter used [issue 57]
        self.head = nn.Linear(bert.cfg.hidden_size, 2)  # PyTorch's default init [official code]

    def forward(self, ids, mask, h, chunk_size=0):  # ids, mask [N, L], h [N, H] -> [N, L, 2]
        if 0 < chunk_size < len(ids):  # the same logits, chunk_size rows at a time; h's gradient
            return gradient_cache(self, chunk_size, ids, mask, h)  # too [common.gradient_cache]
        x = self.bert.embeddings(ids)  # [N, L, H]
        x = torch.cat([h[:, None].to(x.dtype), x[:, 1:]], dim=1)  # no extra LayerNorm [official]
        return self.head(self.bert.encode(x, mask))


def load_generator(run, tok):
    """The frozen masked LM, never in the optimizer [paper §4.1], with the vocabulary of tok."""
    generator_tok, generator = run.load_model("--generator", mlm_head=True)  # with its MLM head
    if generator_tok.vocab != tok.vocab:  # [official DiffCSE issue #1]
        raise UserError(f"--generator {run.cfg.generator} has another vocabulary (RoBERTa: "
                        f"distilroberta-base)")
    return generator.requires_grad_(False).train()  # subtle: its dropout stays on [official code]


# ---- Loss

def info_nce(h1, h2, temp):
    """Cross-entropy of cos(h1_i, h2_j)/τ over j with target j = i: one direction, j = i in the
    denominator [SimCSE Eq. 1; official code]. h1, h2 [B, H] pair row by row."""
    h1, h2 = F.normalize(h1, dim=-1), F.normalize(h2, dim=-1)  # [B, H] each
    logits = h1 @ h2.T / temp  # [B, B]
    return F.cross_entropy(logits, torch.arange(len(h1), device=h1.device))


def rtd_loss(logits, labels, mask):
    """RTD = mean CE over the N·W positions up to the longest sentence (W; --compile pads past it).
    subtle: padding counts (label 0) as in the official code, which pads to W; paper: real ones."""
    nll = F.cross_entropy(logits.transpose(1, 2), labels, reduction="none")  # [N, L]
    return (nll * mask.any(0)).sum() / (len(nll) * mask.any(0).sum())  # mask.any(0): columns < W


def loss_fn(h, logits, labels, mask, temp, lambda_rtd):
    """h [2, B, H]; logits [2B, L, 2], labels, mask [2B, L] -> (loss, stats with RTD accuracies)."""
    rtd = rtd_loss(logits, labels, mask)
    loss = info_nce(h[0], h[1], temp) + lambda_rtd * rtd
    pred, real = logits.detach().argmax(-1), mask.bool()
    replaced, kept = real & (labels == 1), real & (labels == 0)
    return loss, {"loss": loss.detach(), "rtd": rtd.detach(),
                  "replaced": replaced.sum() / real.sum(),  # the share of real tokens replaced
                  "acc_replaced": (replaced & (pred == 1)).sum() / replaced.sum().clamp(min=1),
                  "acc_kept": (kept & (pred == 0)).sum() / kept.sum().clamp(min=1)}


# ---- Training step

def train_step(model, head, ids, mask, cfg, disc, generator, tok, gen):
    """One encoder pass over both views stacked; each view's corrupted copy is judged given h."""
    B, device = ids.size(0), next(model.parameters()).device  # ids, mask [B, C, L] on the CPU
    ids, mask = (t.to(device) for t in make_views(ids, mask))  # [2B, L]
    masked, _ = mask_tokens(ids, mask, cfg.mask_ratio, tok.mask_id, len(tok.vocab),
                            tok.special_ids, gen)  # [official collator]
    ids, mask, masked = (shard(t, views=2) for t in (ids, mask, masked))  # [2b, L]: this process's
    h = head(all_gather(model(ids, mask, True, cfg.chunk_size), views=2))  # [2B, H], BN over all
    corrupted, labels = corrupt(generator, masked, ids, mask, tok)  # [2b, L]
    logits = disc(corrupted, mask, shard(h, views=2), cfg.chunk_size)  # [2b, L, 2], h's gradient
    logits, labels, mask = (all_gather(t, views=2) for t in (logits, labels, mask))  # [2B, L(, 2)]
    with torch.autocast(h.device.type, enabled=False):  # the loss math in fp32 at least [G-prec]
        h, logits = upcast(h.view(2, B, -1)), upcast(logits)  # [2, B, H], [2B, L, 2]
        loss, stats = loss_fn(h, logits, labels, mask, cfg.temp, cfg.lambda_rtd)
    return loss, stats


# ---- Training loop

def train(cfg):
    run = Run(cfg, __file__, models=("model", "generator"))  # DiffCSE: the generator checked too
    tok, model = run.load_model()  # DiffCSE: without --do_mlm; Tokenizer and Bert (the CPU)
    data = run.load_data(tok, one_column=True)  # DiffCSE: unsupervised only
    dev_set = DevSet(tok, run.dev_pairs, model.cfg.max_tokens)  # picks the best step [SimCSE]
    model = model.to(run.device)
    model.pooler = head = BNProjector(model.cfg.hidden_size).to(run.device)  # DiffCSE: BN MLP
    disc = Discriminator(run.load_model()[1]).to(run.device)  # DiffCSE: its own pretrained copy
    generator = load_generator(run, tok).to(run.device)  # DiffCSE: frozen
    gen = torch.Generator(run.device).manual_seed(cfg.seed)  # DiffCSE: the masking draws
    total = total_steps(len(data), cfg)
    params = [*model.parameters()]  # the head too: it is the model's pooler
    params += disc.parameters()  # DiffCSE: the discriminator trains too
    opt, sched = make_optimizer(params, cfg.lr, total, run.device)
    best, stopped = dict(dev=-math.inf, step=0, state=None), ""  # the best dev score, step, state
    # what each checkpoint holds (out_dir/checkpoint.pt), and --resume restores:
    checkpointed = dict(model=model, opt=opt, sched=sched, amp=run.amp, best=best, gen=gen)
    checkpointed.update(disc=disc)  # DiffCSE
    run.compile(model)
    start, stats = run.start(checkpointed, total)  # 0, or the resumed step, as it was then
    ddp_model = run.ddp(model).train()  # torchrun: gradients averaged (the head's too)
    ddp_disc = run.ddp(disc).train()  # DiffCSE
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
            loss, stats = train_step(ddp_model, head, *next(batches), cfg, ddp_disc, generator,
                                     tok, gen)
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
