"""A full-scale stand-in made on any machine, no download [issue 54]: the papers' costs, not their
scores (random weights cannot give those).

1. A corpus of N lines (default 1,000,000, wiki1m_for_simcse.txt's size) whose lengths and words
   follow the head of the real file (--head, 11,914 lines):
   - each line's length in words is drawn from the head's lengths;
   - each word is a word of the head drawn by its frequency there, or, as often as Heaps' law fitted
     on the head says new words appear (distinct words V(n) = K n^beta over the n words so far; the
     head: K ~ 4.3, beta ~ 0.74, so ~1M distinct words at 1M lines), a new word: the first half of
     one head word joined to the second half of another, never seen before. New words cost the
     tokenizer its WordPiece search and a word-cache entry, as a real corpus's rare words do;
   - every line is distinct: a repeated line would make the tokenizer's word cache flatter the time.
2. --model_out DIR (and --generator_out DIR, DiffCSE's): a random-weight model folder of
   bert-base's shape: bert-base-uncased's config.json (recorded below), the bert-base-uncased
   vocabulary (all-MiniLM-L6-v2 uses the same vocab.txt: its SOURCE.md), and model.safetensors
   written by common.write_safetensors, with BERT's init: normal(0, 0.02) weights, zero biases,
   unit LayerNorms [HF BertPreTrainedModel._init_weights].

Deterministic with --seed: the same arguments give the same bytes. An existing file or model is
replaced only with --overwrite, an input (--head, --vocab) never.

    python tests/tools/make_corpus.py --out /tmp/wiki1m_standin.txt \\
        --model_out /tmp/bert-base-random --vocab ../shared/models/all-MiniLM-L6-v2/vocab.txt
"""
import argparse
import hashlib
import os
import stat
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
import common  # noqa: E402

# https://huggingface.co/google-bert/bert-base-uncased/resolve/main/config.json, its content as
# recorded (the hub's file, fetched in a public repository's notes)
BERT_BASE_UNCASED_CONFIG = {
    "architectures": ["BertForMaskedLM"], "attention_probs_dropout_prob": 0.1,
    "gradient_checkpointing": False, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
    "hidden_size": 768, "initializer_range": 0.02, "intermediate_size": 3072,
    "layer_norm_eps": 1e-12, "max_position_embeddings": 512, "model_type": "bert",
    "num_attention_heads": 12, "num_hidden_layers": 12, "pad_token_id": 0,
    "position_embedding_type": "absolute", "transformers_version": "4.6.0.dev0",
    "type_vocab_size": 2, "use_cache": True, "vocab_size": 30522}
BLOCK = 10_000  # lines drawn at a time
MODEL_FILES = ("config.json", "vocab.txt", "tokenizer_config.json", "model.safetensors")


def heaps_law(words):
    """(K, beta) of V(n) = K n^beta, fitted on the distinct-word counts of a stream of words."""
    seen = set()
    ns, vs = [], []
    for n, w in enumerate(words, 1):
        seen.add(w)
        if n % 1000 == 0:
            ns.append(n)
            vs.append(len(seen))
    beta, log_k = np.polyfit(np.log(ns), np.log(vs), 1)
    return float(np.exp(log_k)), float(beta)


def new_word(rng, vocab_words, seen):
    """A word not seen yet: the first half of one head word and the second half of another."""
    while True:
        a, b = rng.choice(vocab_words, 2)
        word = a[:max(1, len(a) // 2)] + b[len(b) // 2:]
        if word not in seen:
            seen.add(word)
            return word


def corpus_lines(head, n, seed):
    """Yields n distinct lines drawn as the docstring says."""
    lines = [s.split() for s in head]
    lines = [w for w in lines if w]
    lengths = np.array([len(w) for w in lines])
    words = np.array([w for ws in lines for w in ws], dtype=object)  # by frequency: every token
    if len(words) < 2000:  # heaps_law fits a line through a point every 1,000 words
        raise common.UserError(f"--head holds {len(words)} words: 2,000 at least are needed to "
                               f"fit Heaps' law (wiki1m_head.txt holds ~210,000)")
    K, beta = heaps_law(words)
    vocab_words = np.array(sorted(set(words)), dtype=object)
    seen = set(vocab_words)
    rng = np.random.default_rng(seed)
    done = set()  # 8-byte digests of the lines written
    position = len(words)  # the stream goes on from the head's: V(n) grows at K beta n^(beta - 1)
    made = 0
    while made < n:
        for length in rng.choice(lengths, BLOCK):
            slots = position + np.arange(length)
            fresh = rng.random(length) < K * beta * slots ** (beta - 1.0)
            picks = rng.choice(words, length)
            line = " ".join(new_word(rng, vocab_words, seen) if f else w
                            for f, w in zip(fresh, picks))
            digest = hashlib.blake2b(line.encode(), digest_size=8).digest()
            if digest in done:
                continue  # a repeat: drawn again
            done.add(digest)
            position += length
            made += 1
            yield line
            if made == n:
                return


def write_model(folder, vocab, seed, layers=12, mlm_head=False):
    """bert-base's shape with random weights, in a Hugging Face model folder; mlm_head: also
    BertForMaskedLM's head (cls.predictions.*, the decoder tied to the word embeddings), for
    DiffCSE's --generator (distilbert-base-uncased: 6 layers of bert-base's width)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = BERT_BASE_UNCASED_CONFIG | {"num_hidden_layers": layers}
    common.write_json(folder / "config.json", cfg)
    with common.atomic_write(folder / "vocab.txt", "wb") as f:
        f.write(Path(vocab).read_bytes())
    common.write_json(folder / "tokenizer_config.json", {"do_lower_case": True}, indent=None)
    torch.manual_seed(seed)
    H, I, L, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg[
        "vocab_size"]
    shapes = {"embeddings.word_embeddings.weight": [V, H],
              "embeddings.position_embeddings.weight": [cfg["max_position_embeddings"], H],
              "embeddings.token_type_embeddings.weight": [cfg["type_vocab_size"], H],
              "embeddings.LayerNorm": [H], "pooler.dense.weight": [H, H], "pooler.dense.bias": [H]}
    for i in range(L):
        p = f"encoder.layer.{i}."
        for name in ("attention.self.query", "attention.self.key", "attention.self.value",
                     "attention.output.dense"):
            shapes |= {p + name + ".weight": [H, H], p + name + ".bias": [H]}
        shapes |= {p + "attention.output.LayerNorm": [H], p + "output.LayerNorm": [H],
                   p + "intermediate.dense.weight": [I, H], p + "intermediate.dense.bias": [I],
                   p + "output.dense.weight": [H, I], p + "output.dense.bias": [H]}
    if mlm_head:
        shapes |= {"cls.predictions.transform.dense.weight": [H, H],
                   "cls.predictions.transform.dense.bias": [H],
                   "cls.predictions.transform.LayerNorm": [H], "cls.predictions.bias": [V]}
    tensors = {}
    for name, shape in shapes.items():
        if name.endswith("LayerNorm"):
            tensors[name + ".weight"] = torch.ones(shape)
            tensors[name + ".bias"] = torch.zeros(shape)
        elif name.endswith(".bias"):
            tensors[name] = torch.zeros(shape)
        else:
            tensors[name] = torch.randn(shape) * cfg["initializer_range"]
    common.write_safetensors(folder / "model.safetensors", tensors)
    return sum(t.numel() for t in tensors.values())


def check_outputs(written, inputs, overwrite):
    """Before any work: each (flag, file) written is new, or replaced under --overwrite, in a
    writable folder; never an input, never a file twice, never a folder, link, FIFO or device."""
    reads = {os.path.realpath(p) for p in inputs}
    seen = {}
    for flag, path in written:
        real = os.path.realpath(path)
        if real in reads:
            raise common.UserError(f"{flag} {path} is an input of this command: writing there "
                                   f"would destroy it; pick another {flag}")
        if real in seen:
            raise common.UserError(f"{seen[real]} and {flag} both write {path}: pick another "
                                   f"{flag}")
        seen[real] = flag
        if os.path.lexists(path) and not stat.S_ISREG(os.lstat(path).st_mode):
            raise common.UserError(f"{flag} {path} is not a regular file (a link, folder, FIFO or "
                                   f"device): name a new one")
        if os.path.exists(path) and not overwrite:
            raise common.UserError(f"{flag}: {path} exists; pass --overwrite to replace it, or "
                                   f"pick another {flag}")
        folder = next(p for p in Path(path).absolute().parents if os.path.lexists(p))
        if not (folder.is_dir() and os.access(folder, os.W_OK)):
            raise common.UserError(f"{flag} {path}: {folder} is not a writable folder")


def main(argv=None):
    p = common.OneLineErrors(description=__doc__.split("\n\n")[0],
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, help="the corpus to write (one sentence a line)")
    p.add_argument("--lines", type=int, default=1_000_000)
    p.add_argument("--head", type=Path, default=ROOT.parent / "shared/data/wiki1m_head.txt")
    p.add_argument("--model_out", type=Path, help="also write a random bert-base folder here")
    p.add_argument("--vocab", type=Path,
                   default=ROOT.parent / "shared/models/all-MiniLM-L6-v2/vocab.txt",
                   help="bert-base-uncased's vocab.txt")
    p.add_argument("--generator_out", type=Path,
                   help="also a random 6-layer BertForMaskedLM of bert-base's width (DiffCSE)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true", help="replace files that exist")
    common.main_guard(make, p.parse_args(argv))


def make(args):
    """The corpus and model folders the flags ask for, each checked before any is written."""
    if args.lines < 1:
        raise common.UserError(f"--lines {args.lines}: must be at least 1")
    written = [("--out", args.out)] if args.out else []
    for flag, folder in (("--model_out", args.model_out), ("--generator_out", args.generator_out)):
        written += [(flag, folder / name) for name in MODEL_FILES] if folder else []
    if args.out:
        common.check_file(args.head, "--head")
    if args.model_out or args.generator_out:
        common.check_file(args.vocab, "--vocab")
    check_outputs(written, [args.head, args.vocab], args.overwrite)
    if args.out:
        head = common.read_utf8(Path(args.head).expanduser()).removeprefix("\ufeff").splitlines()
        with common.atomic_write(args.out) as f:  # a new file, whole, or none
            for line in corpus_lines(head, args.lines, args.seed):
                f.write(line + "\n")
        print(f"{args.out}: {args.lines:,} distinct lines, {args.out.stat().st_size:,} bytes")
    if args.model_out:
        n = write_model(args.model_out, args.vocab, args.seed)
        print(f"{args.model_out}: bert-base's shape, {n:,} random parameters")
    if args.generator_out:
        n = write_model(args.generator_out, args.vocab, args.seed + 1, layers=6, mlm_head=True)
        print(f"{args.generator_out}: a 6-layer masked LM, {n:,} random parameters")


if __name__ == "__main__":
    main()
