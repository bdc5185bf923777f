"""DiffCSE: SimCSE's dropout positives, plus a discriminator that, given only the sentence vector, must spot the
tokens a masked language model replaced in a corrupted copy, so the vector also learns what an edit changes.

Chuang et al., "DiffCSE: Difference-based Contrastive Learning for Sentence Embeddings", NAACL 2022 (arXiv:2204.10298).

Unlike simcse_min.py:
- the training head is a BatchNorm projector, its statistics taken over both views together;
- each view is 30% masked on its own and filled in by a frozen masked-LM generator (argmax): the corrupted copy x'';
- a second BERT, the discriminator, reads x'' with the view's projector output h in place of its [CLS] embedding and
  labels every token replaced or original; its loss reaches the encoder only through h;
- unsupervised only; lr 7e-6, 2 epochs. The test vector is still the encoder's raw [CLS].

    h_i, h_i' = BNProjector(BERT(x_i)[CLS]) under dropout masks z_i, z_i', one BatchNorm over all 2B rows      [B, H]
    x_i'' = argmax G(mask_30%(x_i)) with [CLS] restored, drawn per view;   y_it = 1(x''_it != x_it)            [B, L]
    RTD = -1/(2B·L) sum_it log softmax(D(x_i'', h_i)_t)[y_it],   D = BERT with h_i at position 0, then Linear(H, 2)
    loss = InfoNCE(h, h'; τ = 0.05) + λ_RTD · RTD,   λ_RTD = 0.005

    python diffcse_min.py --data wiki1m_for_simcse.txt --device cuda
    python diffcse_min.py --data wiki1m_for_simcse.txt --generator path/to/BertForMaskedLM-folder --device cuda
"""
import dataclasses
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from common import (Bert, CheckpointError, Run, Tokenizer, UserError, all_gather, autocast,
                    exit_on_signal, main_guard, make_optimizer, optimizer_step, parse_args, rank0_first,
                    resolve_model, save_checkpoint, shard, signal_received, upcast)


# ---- Config

@dataclasses.dataclass
class Config:
    data: str = "wiki1m_for_simcse.txt"  # sentences, one per line (unsupervised only); this name downloads
    model: str = "bert-base-uncased"  # a model folder or known name [paper]
    senteval: str = ""  # SentEval data folder; empty: ./SentEval/data/downstream, the cache, else a download
    device: str = "auto"  # auto, cpu, cuda or mps
    seed: int = 42  # [official run_unsup_example.sh]
    batch_size: int = 64  # sentences per step [paper App. A]
    max_len: int = 32  # training length in tokens, [CLS] and [SEP] included [official run_unsup_example.sh]
    lr: float = 7e-6  # peak learning rate, linear decay to 0 [paper App. A; official run_diffcse.sh]
    epochs: int = 2  # [paper App. A; official run_diffcse.sh]
    max_steps: int = 0  # stop after this many steps (0: all epochs)
    temp: float = 0.05  # τ, the softmax temperature [paper]
    eval_every: int = 125  # STS-B dev every this many steps [official code]
    dropout: float = 0.1  # hidden and attention dropout, the only augmentation [paper Table 3]
    out_dir: str = "runs/diffcse"  # best model, log.txt and results.json
    save_every: int = 500  # steps between checkpoints (out_dir/checkpoint), one also on Ctrl-C/SIGTERM; 0: only then
    resume: str = ""  # continue the run saved in this out_dir, with its configuration; a finished run is left as is
    overwrite: bool = False  # replace the run an existing out_dir holds (else such an out_dir is refused)
    compile: bool = False  # torch.compile the encoder (CUDA graphs on CUDA; the first steps compile)
    mask_ratio: float = 0.30  # share of real tokens masked for the generator [paper App. A, BERT-base]
    lambda_rtd: float = 0.005  # λ_RTD, the weight of the token-mean RTD loss [paper App. A; official run_diffcse.sh]
    generator: str = "distilbert-base-uncased"  # frozen masked LM with its MLM head [paper §4.1; official code]
    checks = {"mask_ratio": (lambda v: 0 <= v <= 1, "in [0, 1]"),
              "lambda_rtd": (lambda v: v >= 0, "0 or more")}  # the method's own flags (common: the rest)


# ---- Views

def make_views(ids, mask):
    """[B, 1, L] -> [2B, L], view-major: the sentence twice, so one forward pass draws two independent dropout
    masks [SimCSE paper §3]. Unsupervised only: train() refuses a CSV of sentence pairs."""
    ids, mask = ids.expand(-1, 2, -1), mask.expand(-1, 2, -1)  # [B, 2, L]
    return ids.transpose(0, 1).flatten(0, 1), mask.transpose(0, 1).flatten(0, 1)  # [V*B, L]


def mask_tokens(ids, mask, ratio, mask_id, vocab_size, special_ids, gen):
    """BERT's masking, every row drawn on its own: `ratio` of the real tokens other than `special_ids` are chosen;
    of those 80% become [MASK], 10% a random token, 10% stay as they are [official code: HF's MLM collator].
    ids, mask [N, L] -> (masked ids [N, L], chosen [N, L] bool)."""
    def draw(p):
        return torch.rand(ids.shape, generator=gen, device=ids.device) < p
    maskable = mask.bool() & ~torch.isin(ids, torch.tensor(special_ids, device=ids.device))
    chosen = draw(ratio) & maskable
    to_mask = chosen & draw(0.8)
    to_random = chosen & ~to_mask & draw(0.5)  # half of the remaining 20%
    random_ids = torch.randint(vocab_size, ids.shape, generator=gen, device=ids.device)  # any id, as in HF
    return torch.where(to_random, random_ids, torch.where(to_mask, mask_id, ids)), chosen


@torch.no_grad()
def corrupt(generator, masked, ids, mask, tok):
    """x masked (mask_tokens) -> (x'', labels [N, L]): the frozen generator's argmax at every position, [CLS]
    restored, pads kept [official code: argmax, where the paper says sampling]. subtle: a token the generator
    reproduces is labelled original (0), and an unmasked token it changes is labelled replaced (1)."""
    filled = generator.mlm_logits(generator(masked, mask)).argmax(-1)  # [N, L]
    filled[:, 0] = tok.cls_id
    filled = torch.where(mask.bool(), filled, ids)
    return filled, (filled != ids).long()  # pads and [CLS] are 0


# ---- Heads

class BNProjector(nn.Module):
    """Linear(H, 2H) -> BatchNorm -> ReLU -> Linear(2H, H) -> BatchNorm without affine, no Linear biases, used in
    training only: the test vector is the raw [CLS] [paper App. A; official code: ProjectionMLP, --batchnorm]."""

    def __init__(self, hidden):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(hidden, 2 * hidden, bias=False), nn.BatchNorm1d(2 * hidden), nn.ReLU(),
                                 nn.Linear(2 * hidden, hidden, bias=False), nn.BatchNorm1d(hidden, affine=False))
        for m in self.net[::3]:
            nn.init.normal_(m.weight, std=0.02)  # [official code: init_weights runs after the projector is built]

    def forward(self, x):  # [N, H] -> [N, H]; one call on both views: BatchNorm over all 2B rows [official code]
        return self.net(x)


class Discriminator(nn.Module):
    """A second BERT (same pretrained weights, trained, sharing nothing with the encoder) + Linear(H, 2) per token.
    The sentence vector h replaces the position-0 vector after the embedding layer [official code: cls_input]."""

    def __init__(self, bert):
        super().__init__()
        self.bert = bert
        self.head = nn.Linear(bert.cfg.hidden_size, 2)  # PyTorch's default init [official code: electra_head]

    def forward(self, ids, mask, h):  # ids, mask [N, L], h [N, H] -> logits [N, L, 2] (1 = replaced)
        x = self.bert.embed(ids)  # [N, L, H]
        x = torch.cat([h[:, None].to(x.dtype), x[:, 1:]], dim=1)  # no extra LayerNorm on h [official code]
        return self.head(self.bert.encode(x, mask))


def load_generator(name, tok):
    """The frozen masked LM: no gradient and never in the optimizer [paper §4.1]; it must share tok's vocabulary."""
    try:
        with rank0_first():  # a download happens once
            generator = Bert.from_pretrained(resolve_model(name, "--generator"), mlm_head=True)
    except CheckpointError as e:
        raise CheckpointError(f"--generator {name}: the generator must be a masked language model with its MLM head "
                              f"(e.g. distilbert-base-uncased, or a BertForMaskedLM folder): {e}") from None
    if Tokenizer.from_pretrained(name).vocab != tok.vocab:
        raise UserError(f"--generator {name} does not have the vocabulary of --model: the generator's tokens are "
                        f"fed to the discriminator as they are [official DiffCSE issue #1]")
    return generator.requires_grad_(False)


# ---- Loss

def info_nce(h1, h2, temp):
    """Cross-entropy of cos(h1_i, h2_j)/τ over j with target j = i: one direction, j = i in the denominator
    [SimCSE Eq. 1; official code]. h1, h2 [B, H] pair row by row."""
    h1, h2 = F.normalize(h1, dim=-1), F.normalize(h2, dim=-1)  # [B, H] each
    logits = h1 @ h2.T / temp  # [B, B]
    return F.cross_entropy(logits, torch.arange(len(h1), device=h1.device))


def rtd_loss(logits, labels):
    """Replaced-token detection: RTD = -1/(N·L) sum_nt log softmax(logits_nt)[labels_nt], logits [N, L, 2],
    labels [N, L] in {0, 1}. subtle: the mean runs over ALL positions, [CLS], [SEP] and padding included (label 0),
    as in the official code, where the paper writes a sum over real tokens; λ_RTD = 0.005 is tuned for this mean."""
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


def loss_fn(h, logits, labels, mask, temp, lambda_rtd):
    """h [2, B, H] projector outputs; logits [2B, L, 2], labels, mask [2B, L] -> (loss, stats).
    loss = InfoNCE(h_1, h_2) + λ_RTD · RTD; stats add the RTD accuracy on replaced and on kept real tokens."""
    rtd = rtd_loss(logits, labels)
    loss = info_nce(h[0], h[1], temp) + lambda_rtd * rtd
    pred, real = logits.detach().argmax(-1), mask.bool()
    replaced, kept = real & (labels == 1), real & (labels == 0)
    return loss, {"loss": loss.detach(), "rtd": rtd.detach(), "replaced": replaced.sum() / real.sum(),
                  "acc_replaced": (replaced & (pred == 1)).sum() / replaced.sum().clamp(min=1),
                  "acc_kept": (kept & (pred == 0)).sum() / kept.sum().clamp(min=1)}


# ---- Training step

def train_step(model, head, ids, mask, cfg, disc, generator, tok, gen):
    """One encoder pass over both views stacked; each view's corrupted copy is judged given that view's h.
    Under torchrun the masks are drawn for the whole batch (the draws of one process), each process encodes and
    judges its share, [CLS] is gathered before the projector (BatchNorm statistics over all 2B rows, as one process)
    and the losses see the whole batch gathered (common.py: Multi-GPU)."""
    B = ids.size(0)
    ids, mask = make_views(ids, mask)  # [2B, L]
    masked, _ = mask_tokens(ids, mask, cfg.mask_ratio, tok.mask_id, len(tok.vocab), (tok.cls_id, tok.sep_id), gen)
    ids, mask, masked = (shard(t, views=2) for t in (ids, mask, masked))  # [2b, L]: this process's rows
    h = head(all_gather(model(ids, mask, cls_only=True)[:, 0], views=2))  # [2B, H], every process
    corrupted, labels = corrupt(generator, masked, ids, mask, tok)  # [2b, L]
    logits = disc(corrupted, mask, shard(h, views=2))  # [2b, L, 2], with gradient into h: the conditioning
    logits, labels, mask = (all_gather(t, views=2) for t in (logits, labels, mask))  # [2B, L(, 2)], every process
    with torch.autocast(h.device.type, enabled=False):  # the similarity/softmax math in fp32 [DESIGN]
        return loss_fn(upcast(h.view(2, B, -1)), upcast(logits), labels, mask, cfg.temp, cfg.lambda_rtd)


# ---- Training loop

def train(cfg):
    run = Run(cfg, "diffcse", __file__, models=("model", "generator"))  # checks every input; nothing is written before run.start
    tok, model = run.load_model()
    head = BNProjector(model.cfg.hidden_size).to(run.device)
    data = run.load_data(tok, one_column=True)  # DiffCSE: unsupervised only
    disc = Discriminator(run.load_model()[1]).to(run.device)  # DiffCSE: its own pretrained copy
    generator = load_generator(cfg.generator, tok).to(run.device)  # DiffCSE: frozen
    gen = torch.Generator(run.device).manual_seed(cfg.seed)  # DiffCSE: the masking draws
    total = run.total_steps(len(data))
    params = [*model.parameters(), *head.parameters(), *disc.parameters()]  # DiffCSE: + discriminator
    opt, sched = make_optimizer(params, cfg.lr, total, run.device)
    saved = dict(model=model, head=head, opt=opt, sched=sched, disc=disc, gen=gen)
    run.compile(model)
    start = run.start(saved)  # 0, or the step of the --resume checkpoint, everything as it was then
    model, head, disc = run.ddp(model), run.ddp(head), run.ddp(disc)
    model.train(), head.train(), disc.train()
    generator.train()  # DiffCSE subtle: frozen, yet its dropout stays on [official code]
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
            loss, stats = train_step(model, head, *next(batches), cfg, disc, generator, tok, gen)
        if not math.isfinite(loss.item()):  # stop, keeping the best model so far: exit status 3
            raise run.stop_non_finite(step + 1, loss.item(), model, tok)
        optimizer_step(loss, opt, sched)
        run.log_progress(step + 1, stats)
    return run.finish(model, tok)  # DiffCSE: the encoder only; projector, discriminator go


# ---- CLI

if __name__ == "__main__":
    main_guard(train, parse_args(Config))
