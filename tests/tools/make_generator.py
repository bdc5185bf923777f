"""Make a small generator for offline DiffCSE runs: fit an MLM head on top of a FROZEN pretrained
BERT encoder.

DiffCSE needs a masked language model (distilbert-base-uncased in the paper). Offline there is
none, so this fits common.MLMHead (dense, GELU, LayerNorm, bias; the decoder is the frozen
word-embedding matrix, tied) on the frozen all-MiniLM-L6-v2 encoder with BERT's 15% masking
(80/10/10) on the wiki sample, prints the masked-token accuracy on held-out sentences, and saves a
BertForMaskedLM folder. Not a test (pytest collects test_*.py only). About 5 minutes on 2 CPU cores.

Unlike BERT, the loss covers every real token, not only the chosen 15%. DiffCSE labels a token
"replaced" wherever the generator's argmax differs from the original, masked or not, and a
pretrained MLM copies unmasked tokens almost always. The last layer of a sentence-embedding model
keeps token identity poorly: a head trained on the chosen tokens only copied about half of the
unmasked tokens (masked accuracy 0.12). Trained on every real token, it copies about 98% (masked
accuracy 0.16).

    python tests/tools/make_generator.py --model sentence-transformers/all-MiniLM-L6-v2 \
        --data wiki1m_head.txt --out /tmp/minilm-mlm
    python diffcse_min.py --model sentence-transformers/all-MiniLM-L6-v2 --generator /tmp/minilm-mlm
    ...
"""
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
# noqa: E402
from common import (SAVED, Bert, OneLineErrors, Tokenizer, UserError,  # noqa: E402
                    check_file, find_model, main_guard, read_lines, save_pretrained)
from diffcse_min import mask_tokens  # noqa: E402
from make_corpus import check_outputs  # noqa: E402


def with_mlm_head(encoder):
    """A Bert with a fresh MLM head holding the encoder's weights, frozen; exactly the mlm.* tensors
    are new."""
    model = Bert(encoder.cfg, mlm_head=True)
    state = {k: v for k, v in encoder.state_dict().items()  # [HF BertForMaskedLM]: no pooler
             if not k.startswith("pooler.")}  # (all-MiniLM-L6-v2 carries one since issue 41)
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) == {k for k in model.state_dict()
                                               if k.startswith("mlm.")}, \
        (missing, unexpected)
    for name, p in model.named_parameters():
        p.requires_grad_(name.startswith("mlm."))
    return model


def masked_batch(tok, sentences, max_len, gen):
    ids, mask = tok(sentences, max_len)
    masked, chosen = mask_tokens(ids, mask, 0.15, tok.mask_id, len(tok.vocab), (tok.cls_id,
                                                                                tok.sep_id), gen)
    return ids, mask, masked, chosen


@torch.no_grad()
def accuracy(model, tok, sentences, max_len, gen, batch_size=256):
    """Argmax accuracy on the chosen 15%, and how often an unchosen real token is reproduced as it
    is."""
    hits = n = same = m = 0
    for i in range(0, len(sentences), batch_size):
        ids, mask, masked, chosen = masked_batch(tok, sentences[i:i + batch_size], max_len, gen)
        pred = model.mlm_logits(model(masked, mask)).argmax(-1)
        rest = mask.bool() & ~chosen
        hits, n = hits + (pred == ids)[chosen].sum().item(), n + chosen.sum().item()
        same, m = same + (pred == ids)[rest].sum().item(), m + rest.sum().item()
    return hits / n, same / m


def main(argv=None):
    about = " ".join(__doc__.split("\n\n")[0].split())  # the first paragraph, whole, one line
    parser = OneLineErrors(description=about)  # common.py's --help layout and one-line errors
    need, train_ = parser.add_argument_group("data and model"), parser.add_argument_group(
        "training"
    )
    need.add_argument("--model", required=True, help="the BERT encoder to freeze: a folder or "
                                                     "known name "
                      "(e.g. sentence-transformers/all-MiniLM-L6-v2); DiffCSE's --model, so the "
                      "vocabularies match")
    need.add_argument("--data", required=True, help="sentences, one per line (e.g. the head of "
                                                    "wiki1m)")
    need.add_argument("--out", required=True, help="folder for the BertForMaskedLM model "
                                                   "(--generator of diffcse_min.py)")
    train_.add_argument("--steps", type=int, default=300, help="optimizer steps on the MLM head")
    train_.add_argument("--batch_size", type=int, default=64, help="sentences per step")
    train_.add_argument("--lr", type=float, default=1e-2, help="peak learning rate (30 warm-up "
                                                               "steps, then linear decay)")
    train_.add_argument("--max_len", type=int, default=32, help="tokens per sentence, [CLS] and "
                                                                "[SEP] included")
    train_.add_argument("--held_out", type=int, default=1000, help="the last sentences, kept for "
                                                                   "the accuracy")
    train_.add_argument("--overwrite", action="store_true", help="replace a model in --out")
    args = parser.parse_args(argv)
    main_guard(make, args)


def make(args):
    for flag in ("steps", "batch_size", "max_len", "held_out"):
        if getattr(args, flag) < 1:
            raise UserError(f"--{flag} {getattr(args, flag)}: must be at least 1")
    check_file(args.data, "--data")
    model_files = [find_model(args.model)[0] / name for name in SAVED]
    check_outputs([("--out", Path(args.out) / name) for name in SAVED],
                  [args.data, *model_files], args.overwrite)
    lines = read_lines(args.data)
    if len(lines) <= args.held_out:
        raise UserError(f"--data {args.data} has {len(lines)} sentences: more than --held_out "
                        f"{args.held_out} needed")
    torch.manual_seed(0)
    tok = Tokenizer.from_pretrained(args.model)
    # dropout off: the encoder is frozen anyway
    model = with_mlm_head(Bert.from_pretrained(args.model)).eval()
    train, held = lines[:-args.held_out], lines[-args.held_out:]
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 30) * (1 - s / args.steps)
    )
    gen, start = torch.Generator().manual_seed(0), time.time()
    acc, _ = accuracy(model, tok, held, args.max_len, torch.Generator().manual_seed(1))
    print(f"untrained head: masked-token accuracy {acc:.3f}")
    for step in range(1, args.steps + 1):
        idx = torch.randint(len(train), (args.batch_size,), generator=gen).tolist()
        ids, mask, masked, _ = masked_batch(tok, [train[i] for i in idx], args.max_len, gen)
        with torch.no_grad():
            h = model(masked, mask)[mask.bool()]  # [M, H]: every real token, see the docstring
        loss = F.cross_entropy(model.mlm_logits(h), ids[mask.bool()])
        loss.backward()
        opt.step(), sched.step(), opt.zero_grad()
        if step % 50 == 0 or step == args.steps:
            print(f"step {step}/{args.steps} | mlm loss {loss.item():.3f} | "
                  f"{time.time() - start:.0f}s", flush=True)
    acc, same = accuracy(model, tok, held, args.max_len, torch.Generator().manual_seed(1))
    print(f"held-out ({len(held)} sentences): masked-token accuracy {acc:.3f}; unmasked tokens "
          f"reproduced {same:.3f}")
    if same < 0.9:  # a pretrained masked LM copies nearly every token it sees (300 steps: 0.977)
        print(f"warning: only {same:.2f} of the unmasked tokens reproduced: DiffCSE counts the "
              f"rest as replaced and its RTD learns little; train the head longer (--steps)")
    save_pretrained(model, args.out, tok)
    again = Bert.from_pretrained(args.out, mlm_head=True)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                 again.state_dict().values()))
    print(f"saved {args.out} (BertForMaskedLM); use it with --generator {args.out}")


if __name__ == "__main__":
    main()
