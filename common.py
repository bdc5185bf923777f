"""common.py: what the four methods share (heads, losses and flags live in each *_min.py).

Part 1, the model and the loop (read this): BERT's tokenizers, a compact BERT that loads Hugging
Face checkpoints, batches, the STS evaluation as SentEval's, the loop pieces; a method's seams into
the rest: Run, save_pretrained and main_guard (Part 2), parse_args (Part 3). Part 2: operations
(safe to skip; DiffCSE's check_generator too). Part 3: `python common.py eval | ...`, figures.

    tok = Tokenizer.from_pretrained("bert-base-uncased")
    model = Bert.from_pretrained("bert-base-uncased")
    ids, mask = tok(["a man is playing a guitar .", "a woman is slicing an onion ."])  # [2, L] each
    cls = model(ids, mask)[:, 0]                                                       # [2, 768]
"""
import collections
import contextlib
import dataclasses
import functools
import math
import re
import time
import unicodedata

import numpy as np
import scipy.stats
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


# ==================================================================================================
# Part 1: the model and the loop (read this). Seams: Run, parse_args, main_guard, save_pretrained
# ==================================================================================================

# --- WordPiece tokenizer (BERT's BasicTokenizer + WordpieceTokenizer, encode-only) ----------------

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
_SPECIAL_SPLIT = re.compile("(" + "|".join(re.escape(s) for s in SPECIAL_TOKENS) + ")")
_ASCII_CLEAN = {c: None for c in range(32)} | {127: None, 9: " ", 10: " ", 13: " "}
_CJK = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
        (0xF900, 0xFAFF), (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0x2F800, 0x2FA1F))  # [HF]


def basic_clean(text):
    """Drop control characters, whitespace -> spaces, spaces around CJK characters, NFC [HF]."""
    if text.isascii():  # fast path: a run's set-up takes 2.2x as long without it [docs/speed.md]
        return text.translate(_ASCII_CLEAN)
    out = []
    for ch in text:
        cat = unicodedata.category(ch)
        if ch in "\t\n\r " or cat == "Zs":
            out.append(" ")
        elif ch not in "\x00\ufffd" and not cat.startswith("C"):  # else: dropped
            out.append(f" {ch} " if any(lo <= ord(ch) <= hi for lo, hi in _CJK) else ch)
    return unicodedata.normalize("NFC", "".join(out))  # [HF BasicTokenizer, transformers >= 4.3x]


def split_punctuation(word):
    """'e-mail!' -> ['e', '-', 'mail', '!']; ASCII symbols are punctuation ('$', '^') [BERT]."""
    pieces = []
    current = ""
    for ch in word:
        cp = ord(ch)
        if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126 or \
                unicodedata.category(ch).startswith("P"):
            pieces += [current, ch] if current else [ch]
            current = ""
        else:
            current += ch
    return pieces + [current] if current else pieces


class Tokenizer:
    """BERT's WordPiece: clean, split, greedy longest-match '##' sub-words; words cached (fast)."""
    max_word_chars = 100  # longer words become [UNK] [HF WordpieceTokenizer]
    specials = SPECIAL_TOKENS
    special_split = _SPECIAL_SPLIT

    def __init__(self, vocab, do_lower_case=True, strip_accents=None):
        self.vocab = vocab  # token -> id
        self.lower = do_lower_case
        self._cache = {}  # word (BPE: pre-token) -> ids
        self.strip_accents = do_lower_case if strip_accents is None else strip_accents  # [HF]
        self.special_ids = tuple(map(vocab.get, self.specials))  # never masked [HF collator]
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = self.special_ids

    @staticmethod
    def from_pretrained(name_or_dir):
        """A folder's (or known name's) tokenizer: WordPiece (vocab.txt) or RoBERTa's BPE."""
        files = read_tokenizer_files(name_or_dir)  # Part 2: found or fetched once, checked
        if "merges" in files:
            return BPETokenizer(files["vocab"], files["merges"])
        return Tokenizer(files["vocab"], files["do_lower_case"], files["strip_accents"])

    def encode_word(self, word):
        """One whitespace-delimited word -> sub-word ids (cached)."""
        ids = self._cache.get(word)  # word cache: set-up 1.5x as long without it [docs/speed.md]
        if ids is None:
            text = word.lower() if self.lower else word
            if self.strip_accents and not text.isascii():
                text = "".join(c for c in unicodedata.normalize("NFD", text)
                               if unicodedata.category(c) != "Mn")
            ids = [i for piece in split_punctuation(text) for i in self.wordpiece(piece)]
            if len(self._cache) < 2_000_000:
                self._cache[word] = ids
        return ids

    def wordpiece(self, piece):
        """Greedy longest-match-first: 'unaffable' -> un ##aff ##able."""
        if len(piece) > self.max_word_chars:
            return [self.unk_id]
        ids = []
        start = 0
        while start < len(piece):
            for end in range(len(piece), start, -1):  # longest match first
                sub = piece[start:end] if start == 0 else "##" + piece[start:end]
                if sub in self.vocab:
                    ids.append(self.vocab[sub])
                    break
            else:
                return [self.unk_id]  # one unknown stretch makes the whole word [UNK], as in BERT
            start = end
        return ids

    def encode(self, text, max_len=None):
        """text -> [CLS] ids [SEP] (RoBERTa: <s> ids </s>), at most max_len tokens; [SEP] kept."""
        ids = [self.cls_id]
        chunks = self.special_split.split(text)  # [text], or text around each special token
        for i, chunk in enumerate(chunks):
            if chunk in self.specials:
                ids.append(self.vocab[chunk])  # special-token strings in the text are kept [HF]
            else:
                ids += self.encode_text(chunk, chunks[i + 1:i + 2])
        keep = len(ids) if max_len is None else max_len - 1
        return ids[:keep] + [self.sep_id]

    def encode_text(self, text, after):  # after: the special token that follows, if any
        return [i for word in basic_clean(text).split() for i in self.encode_word(word)]

    def pad(self, id_lists, width=None):
        """Pad to the longest (or `width`) -> (ids [B, L], mask [B, L]), mask 1 on real tokens."""
        return pad_ids(id_lists, self.pad_id, width)

    def __call__(self, texts, max_len=None):
        return self.pad([self.encode(t, max_len) for t in texts])


# --- Byte-level BPE tokenizer (GPT-2's, as RoBERTa uses it; encode-only) --------------------------

BPE_SPECIALS = ("<pad>", "<unk>", "<s>", "</s>", "<mask>")  # SPECIAL_TOKENS' roles, RoBERTa's names
_BPE_SPECIAL_SPLIT = re.compile("(" + "|".join(BPE_SPECIALS) + ")")
_PRINTABLE = [*range(33, 127), *range(161, 173), *range(174, 256)]  # bytes shown as themselves
BYTE_CHARS = dict(zip(_PRINTABLE + [b for b in range(256) if b not in _PRINTABLE],
                      map(chr, _PRINTABLE + list(range(256, 324)))))  # byte -> one char [GPT-2]
# White_Space as the inside of a regex class [...]: "\t-\r" is the range TAB..CR (\t \n \v \f \r)
_SPACE = "\t-\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"


@functools.cache
def gpt2_pattern():
    r"""GPT-2's pre-tokenizer [GPT-2 encoder.py]:
        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
    with \p{L}, \p{N} (which Python's re lacks) as ranges of the Unicode categories L* and N*, and
    \s as White_Space (the `regex` module's \s: not \x1c-\x1f, which re's \s counts)."""
    cats = "".join(unicodedata.category(chr(cp))[0] for cp in range(0x110000))  # 0.3 s, once
    L, N = ("".join(f"{chr(m.start())}-{chr(m.end() - 1)}" for m in re.finditer(f"{c}+", cats))
            for c in "LN")  # runs of code points whose category is L* (N*) -> class ranges
    S = _SPACE
    return re.compile(rf"'s|'t|'re|'ve|'m|'ll|'d| ?[{L}]+| ?[{N}]+| ?[^{S}{L}{N}]+|[{S}]+(?![^{S}])"
                      rf"|[{S}]+")


class BPETokenizer(Tokenizer):
    """RoBERTa's tokenizer: text -> UTF-8 bytes -> GPT-2 pre-tokens -> merges by rank -> ids, as
    <s> ... </s> [HF RobertaTokenizer, add_prefix_space=False]. Pads and batches like WordPiece."""
    specials = BPE_SPECIALS
    special_split = _BPE_SPECIAL_SPLIT

    def __init__(self, vocab, merges):
        super().__init__(vocab, do_lower_case=False, strip_accents=False)  # its special ids too
        self.merges = merges  # [(a, b)] by rank
        self.ranks = {pair: i for i, pair in enumerate(merges)}

    def bpe(self, word):
        """A pre-token -> ids (cached): join adjacent pairs of the lowest rank while one merges."""
        ids = self._cache.get(word)
        if ids is not None:
            return ids
        parts = [BYTE_CHARS[b] for b in word.encode()]
        while len(parts) > 1:
            best = min(zip(parts, parts[1:]), key=lambda pair: self.ranks.get(pair, math.inf))
            if best not in self.ranks:
                break
            joined = []
            i = 0
            while i < len(parts):  # every occurrence, left to right [GPT-2 encoder.py]
                pair = i + 1 < len(parts) and (parts[i], parts[i + 1]) == best
                joined.append(parts[i] + parts[i + 1] if pair else parts[i])
                i += 2 if pair else 1  # past the pair, or past the one part
            parts = joined
        ids = [self.vocab.get(p, self.unk_id) for p in parts]
        if len(self._cache) < 2_000_000:
            self._cache[word] = ids
        return ids

    def encode_text(self, text, after):  # after: the special token that follows, if any
        if after == ["<mask>"]:
            text = text.rstrip()  # <mask> takes the spaces before it (lstrip) [HF RoBERTa]
        return [i for word in gpt2_pattern().findall(text) for i in self.bpe(word)]


def pad_ids(id_lists, pad_id, width=None):
    """Id lists -> (ids [B, L], mask [B, L]), L the longest (or `width`), mask 1 on real tokens."""
    length = max(width or 0, max(map(len, id_lists)))
    ids = torch.tensor([x + [pad_id] * (length - len(x)) for x in id_lists])  # [B, L]
    mask = torch.tensor([[1] * len(x) + [0] * (length - len(x)) for x in id_lists])  # [B, L]
    return ids, mask


# --- BERT ---------------------------------------------------------------------------------------

@dataclasses.dataclass
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2  # 0: no token-type embeddings (DistilBERT)
    layer_norm_eps: float = 1e-12
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    pad_token_id: int = 0
    model_type: str = "bert"  # "roberta": positions start after the padding index

    @property
    def max_tokens(self):  # the longest input [HF RoBERTa: max_position_embeddings - pad - 1]
        offset = self.pad_token_id + 1 if self.model_type == "roberta" else 0
        return self.max_position_embeddings - offset

    @classmethod
    def tiny(cls, **kw):
        """A 2-layer, 32-wide BERT for tests (minGPT's gpt-nano)."""
        return cls(**{**dict(vocab_size=128, hidden_size=32, num_hidden_layers=2,
                             num_attention_heads=2, intermediate_size=64,
                             max_position_embeddings=64), **kw})


class Embeddings(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        H, types = cfg.hidden_size, cfg.type_vocab_size
        self.word_embeddings = nn.Embedding(cfg.vocab_size, H, padding_idx=cfg.pad_token_id)
        self.roberta_pad = cfg.pad_token_id if cfg.model_type == "roberta" else None
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, H,
                                                padding_idx=self.roberta_pad)
        self.token_type_embeddings = nn.Embedding(types, H) if types else None
        self.LayerNorm = nn.LayerNorm(H, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)

    def forward(self, ids):  # ids [B, L] -> [B, L, H]
        if self.roberta_pad is None:
            positions = self.position_embeddings.weight[:ids.size(1)]  # [L, H]: 0, 1, ...
        else:  # tokens at pad + 1, pad + 2, ...; padding at pad [HF create_position_ids_from_..]
            real = ids.ne(self.roberta_pad).long()  # [B, L]
            positions = self.position_embeddings(real.cumsum(1) * real + self.roberta_pad)
        x = self.word_embeddings(ids) + positions
        if self.token_type_embeddings is not None:
            x = x + self.token_type_embeddings.weight[0]  # one segment: token type 0 everywhere
        return self.dropout(self.LayerNorm(x))


class Layer(nn.Module):
    """Post-LN transformer layer: x = LN(x + Attn(x)); x = LN(x + FFN(x))  [BERT]."""

    def __init__(self, cfg):
        super().__init__()
        H, I, eps = cfg.hidden_size, cfg.intermediate_size, cfg.layer_norm_eps
        self.heads, self.attn_p = cfg.num_attention_heads, cfg.attention_probs_dropout_prob
        self.query, self.key, self.value, self.attn_out = (nn.Linear(H, H) for _ in range(4))
        self.attn_norm = nn.LayerNorm(H, eps=eps)  # registration order = parameter order: keep it
        self.ffn_in, self.ffn_out = nn.Linear(H, I), nn.Linear(I, H)
        self.ffn_norm = nn.LayerNorm(H, eps=eps)
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)
        self.attn_out_dropout = cfg.model_type != "distilbert"  # DistilBERT has none there [HF]

    def forward(self, x, mask, cls_only=False):  # x [B, L, H], mask [B, 1, 1, L] bool: a token
        """-> [B, L, H]; cls_only: [B, 1, H], the [CLS] row alone (its query; keys, values all)."""
        B, L, H = x.shape
        # [B, Q, H]; Q = 1: a step and the dev evaluation ~1.17x as fast [docs/speed.md]
        rows = x[:, :1] if cls_only else x
        q = self.query(rows).view(B, rows.size(1), self.heads, -1).transpose(1, 2)  # [B, h, Q, H/h]
        k, v = (p(x).view(B, L, self.heads, -1).transpose(1, 2) for p in (self.key, self.value))
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                           dropout_p=self.attn_p if self.training else 0.0)
        a = self.attn_out(a.transpose(1, 2).reshape(B, -1, H))  # [B, Q, H]
        x = self.attn_norm(rows + (self.dropout(a) if self.attn_out_dropout else a))
        return self.ffn_norm(x + self.dropout(self.ffn_out(F.gelu(self.ffn_in(x)))))  # erf GELU


class MLMHead(nn.Module):
    """dense -> GELU -> LayerNorm -> logits over the vocabulary with the word embeddings (tied)."""

    def __init__(self, cfg):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))

    def forward(self, h, word_embeddings):  # h [B, L, H] -> [B, L, V]
        return F.linear(self.norm(F.gelu(self.dense(h))), word_embeddings, self.bias)


class Bert(nn.Module):
    def __init__(self, cfg, mlm_head=False, pooler=False):
        super().__init__()
        self.cfg = cfg
        self.name = "the model"  # from_pretrained: its folder or name, for messages
        self.embeddings = Embeddings(cfg)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.num_hidden_layers))
        self.mlm = MLMHead(cfg) if mlm_head else None
        self.pooler = None  # BERT's: tanh(dense([CLS])), `--pooler cls` [HF BertPooler]
        self.apply(self._init)
        if pooler:  # the checkpoint's (a method's MLP head takes its place)
            with torch.random.fork_rng(devices=[]):  # its init's draws undone: same dropout masks
                dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
            self.pooler = nn.Sequential(collections.OrderedDict(dense=dense, activation=nn.Tanh()))

    @staticmethod
    def _init(m):  # BERT's initialisation: N(0, 0.02) weights, zero biases, unit LayerNorms
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear):
            nn.init.zeros_(m.bias)

    def encode(self, x, mask, all_layers=False, cls_only=False):  # x [B, L, H], mask [B, L]
        """The last layer's states [B, L, H] (all_layers: every layer's, embeddings first).
        cls_only: the [CLS] vectors [B, H] alone, the last layer computing that row only."""
        attn_mask = mask.bool()[:, None, None, :]  # [B, 1, 1, L]: True on a token
        states = [x]
        for i, layer in enumerate(self.layers):
            states.append(layer(states[-1], attn_mask, cls_only and i == len(self.layers) - 1))
        if all_layers:
            return states
        if cls_only:
            return states[-1][:, 0]  # [B, H]
        return states[-1]

    def forward(self, ids, mask, cls_only=False):  # ids, mask [B, L]
        """The last layer's states [B, L, H]; cls_only: -> [B, H], the last layer's [CLS]."""
        return self.encode(self.embeddings(ids), mask, cls_only=cls_only)

    def mlm_logits(self, h):  # h [B, L, H] -> [B, L, V]
        return self.mlm(h, self.embeddings.word_embeddings.weight)

    @classmethod
    def from_pretrained(cls, name_or_dir, mlm_head=False, dropout=None, quiet=False):
        """A BERT, DistilBERT or RoBERTa folder or known name; every tensor filled [nanoGPT]."""
        cfg, state = read_weights(name_or_dir, mlm_head, quiet)  # Part 2: checked, in our names
        if dropout is not None:  # the checkpoint's hidden and attention dropout overridden
            cfg.hidden_dropout_prob = cfg.attention_probs_dropout_prob = dropout
        model = cls(cfg, mlm_head, pooler="pooler.dense.weight" in state)
        model.load_state_dict(state, strict=True)
        model.name = str(name_or_dir)
        return model


# --- Data: batches per epoch ----------------------------------------------------------------------

def total_steps(n_rows, cfg):
    """Steps of the whole run: full batches per epoch x epochs, or --max_steps if fewer."""
    per_epoch = n_rows // cfg.batch_size
    if per_epoch == 0:
        raise UserError(f"the data has {n_rows} rows, fewer than one batch of {cfg.batch_size}")
    return min(per_epoch * cfg.epochs, cfg.max_steps or math.inf)


def epoch_batches(data, tok, cfg, start, total):
    """ids, mask [B, C, L] on the CPU for steps start+1..total: the rows shuffled afresh each epoch
    from the seed and the epoch (a resumed run draws the same), full batches only [official:
    drop_last]. --compile pads every batch to max_len, so that every step has one shape."""
    per_epoch = len(data) // cfg.batch_size
    width = cfg.max_len if cfg.compile else None
    for step in range(start, total):
        epoch, position = divmod(step, per_epoch)
        if position == 0 or step == start:
            order = torch.randperm(len(data), generator=torch.Generator().manual_seed(
                cfg.seed * 1000 + epoch)).tolist()
        rows = [data[i] for i in order[position * cfg.batch_size:(position + 1) * cfg.batch_size]]
        ids, mask = tok.pad([x for r in rows for x in r], width)  # [B*C, L]
        shape = (len(rows), len(rows[0]), -1)  # [B, C, L]: C sentences a row (views, NLI columns)
        yield ids.view(shape), mask.view(shape)  # a pair: train() unpacks *next(batches)


# --- STS evaluation (SimCSE's SentEval fork: cosine, Spearman x 100, 'all' for STS12-16) --------

STS_YEARS = {  # task -> subsets, as SentEval reads them [official SentEval sts.py]
    "STS12": ["MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN", "surprise.SMTnews"],
    "STS13": ["FNWN", "headlines", "OnWN"],
    "STS14": ["deft-forum", "deft-news", "headlines", "images", "OnWN", "tweet-news"],
    "STS15": ["answers-forums", "answers-students", "belief", "headlines", "images"],
    "STS16": ["answer-answer", "headlines", "plagiarism", "postediting", "question-question"],
}
TEST_TASKS = [*STS_YEARS, "STSBenchmark", "SICKRelatedness"]
SHORT_NAMES = {"STSBenchmark": "STS-B", "SICKRelatedness": "SICK-R"}
POOLERS = ("cls", "cls_before_pooler", "avg", "avg_top2", "avg_first_last")  # [evaluation.py]


def pool(states, mask, pooler):
    """Sentence vectors [B, H] from all layers' states ([emb, layer 1, ..., layer N], [B, L, H])."""
    chosen = {"avg": [-1], "avg_first_last": [1, -1], "avg_top2": [-2, -1]}[pooler]  # 1: layer 1
    h = sum(states[i] for i in chosen) / len(chosen)  # [B, L, H]
    m = mask.unsqueeze(-1).to(h.dtype)  # [B, L, 1]
    return (h * m).sum(1) / m.sum(1)


def encode_sentences(model, tok, sentences, pooler="cls_before_pooler", batch_size=128,
                     id_lists=None, progress=None, finite=True):
    """Vectors [N, H] (float32, CPU) in eval mode, sorted by length to cut padding; pooler as in
    SimCSE's evaluation.py: cls_before_pooler the raw [CLS] (the unsupervised papers' test vector),
    cls the model's pooler over it. progress(done, total) after each batch. finite: a NaN or inf
    vector is an error (off at a training run's dev step: a NaN score, which keep_best skips)."""
    if pooler not in POOLERS:
        raise UserError(f"unknown pooler {pooler!r}; choose one of {', '.join(POOLERS)}")
    if pooler == "cls" and model.pooler is None:
        raise UserError(f"--pooler cls: {model.name} has no pooler (pooler.dense.* in its weights);"
                        f" --pooler cls_before_pooler is the raw [CLS]")
    id_lists = id_lists or [tok.encode(s, model.cfg.max_tokens) for s in sentences]
    # longest first: each batch pads little, the dev evaluation 1.76x as fast [docs/speed.md]
    order = sorted(range(len(id_lists)), key=lambda i: -len(id_lists[i]))
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out = torch.empty(len(id_lists), model.cfg.hidden_size)
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            ids, mask = (t.to(device) for t in tok.pad([id_lists[i] for i in idx]))  # [b, L]
            if pooler.startswith("cls"):
                cls = model(ids, mask, cls_only=True)  # [b, H], the raw last-layer [CLS]
                out[idx] = (model.pooler(cls) if pooler == "cls" else cls).float().cpu()
            else:
                states = model.encode(model.embeddings(ids), mask, all_layers=True)
                out[idx] = pool(states, mask, pooler).float().cpu()
            if progress:
                progress(start + len(idx), len(order))
    model.train(was_training)
    if finite and not torch.isfinite(out).all():  # a broken model: no table from it [issue 40]
        raise UserError("the model gives non-finite sentence vectors (NaN or inf): its weights are "
                        "broken (a diverged run?); evaluate another model or checkpoint")
    return out


def cosine(a, b):  # a, b [N, H] -> [N]
    a, b = a.double(), b.double()
    return ((a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))).nan_to_num().numpy()


def score_pairs(pred, gold):
    return {"spearman": 100 * scipy.stats.spearmanr(pred, gold)[0],
            "pearson": 100 * scipy.stats.pearsonr(pred, gold)[0], "n": len(gold)}


def evaluate_sts(model, tok, root, mode="test", pooler="cls_before_pooler", batch_size=128,
                 tasks=None, progress=None):
    """Spearman x 100 per task as the papers report it, plus details (Pearson, subsets, 'mean',
    'wmean'). Each distinct sentence is encoded once. STS12-16 report 'all', the subsets joined
    into one Spearman [SimCSE's SentEval fork]; STS-B, SICK-R the mode's split (dev: SICK trial)."""
    start = time.time()
    tasks = tasks or load_sts(root, mode)  # Part 2 reads SentEval's files
    unique = sorted({s for subs in tasks.values() for a, b, _ in subs.values() for s in a + b})
    index = {s: i for i, s in enumerate(unique)}
    vectors = encode_sentences(model, tok, unique, pooler, batch_size, progress=progress)  # [N, H]
    results, details = {}, {}
    for task, subsets in tasks.items():
        preds = {name: cosine(vectors[[index[s] for s in a]], vectors[[index[s] for s in b]])
                 for name, (a, b, _) in subsets.items()}
        scores = {name: score_pairs(preds[name], gold) for name, (_, _, gold) in subsets.items()}
        if task in STS_YEARS:
            all_gold = np.concatenate([gold for _, _, gold in subsets.values()])
            scores["all"] = score_pairs(np.concatenate(list(preds.values())), all_gold)
            sizes = np.array([scores[n]["n"] for n in subsets])
            spearman = np.array([scores[n]["spearman"] for n in subsets])
            scores["mean"] = float(spearman.mean())
            scores["wmean"] = float((spearman * sizes).sum() / sizes.sum())
        results[task] = scores["all" if task in STS_YEARS else mode]["spearman"]
        details[task] = scores
    if mode == "test" and len(results) == len(TEST_TASKS):  # of the printed values [official]
        results["Avg"] = float(np.mean([round(results[t], 2) for t in TEST_TASKS]))
    details.update(seconds=round(time.time() - start, 2), sentences_encoded=len(unique))
    return {**{k: float(v) for k, v in results.items()}, "details": details}


def format_table(results, tasks=TEST_TASKS):
    """The familiar STS12 ... SICK-R | Avg table (two lines)."""
    keys = [k for k in [*tasks, "Avg"] if k in results]
    head = " | ".join(f"{SHORT_NAMES.get(k, k):>7}" for k in keys)
    return head + "\n" + " | ".join(f"{results[k]:7.2f}" for k in keys)


# --- The dev evaluation: STS-B dev Spearman, alignment and uniformity ---------------------------

POSITIVE_GOLD = 4.0  # pairs with gold > 4 are positives [SimCSE §5 fn. 3; DiffCSE Table 11]


def alignment(x, y):  # x, y [N, H] positive pairs -> E ||x - y||^2, L2-normalised (lower is better)
    x, y = F.normalize(x.double(), dim=-1), F.normalize(y.double(), dim=-1)
    return (x - y).pow(2).sum(-1).mean().item()  # [Wang & Isola 2020, Eq. 2]; NaN without a pair


def uniformity(x):  # x [N, H] -> log E exp(-2 ||x_i - x_j||^2) over pairs i != j (lower is better)
    x = F.normalize(x.double(), dim=-1)  # then ||x_i - x_j||^2 = 2 - 2 x_i.x_j: one matmul
    k = (x @ x.T).mul(4).sub(4).exp()  # [N, N] exp(-2 ||x_i - x_j||^2); 1.9x pdist [docs/speed.md]
    n = len(x)  # the mean over i != j equals the mean over i < j [Wang & Isola 2020, Eq. 3]
    return ((k.sum() - k.diagonal().sum()) / (n * (n - 1))).log().item()


class DevSet:
    """STS-B dev (or --dev_file's pairs), tokenized once at the model's length (max_len: its
    positions): the score that picks the best step in training [SimCSE App. B]."""

    def __init__(self, tok, pairs, max_len):  # pairs: (sentences A, B, gold)
        a, b, self.gold = pairs
        self.tok = tok
        self.ids = [tok.encode(s, max_len) for s in a + b]
        first = {}  # sentence -> its first index: uniformity counts a repeated sentence once
        for i, s in enumerate(a + b):
            first.setdefault(s, i)
        self.distinct = sorted(first.values())


def evaluate_dev(model, dev, pooler="cls_before_pooler", progress=None):
    """STS-B dev Spearman x 100 of the test vectors' cosines, and the alignment (pairs with gold
    > 4) and uniformity (distinct sentences) of the same vectors [Wang & Isola 2020]."""
    vectors = encode_sentences(model, dev.tok, None, pooler, 256, dev.ids, progress,  # [3k, H]
                               finite=False)  # weights gone NaN: the loss check stops the run
    distinct = vectors[dev.distinct].to(next(model.parameters()).device)  # the model's device
    a, b = vectors.chunk(2)  # [1500, H] each: the first and the second sentence of each pair
    positive = torch.as_tensor(dev.gold > POSITIVE_GOLD)  # [1500] bool
    return {"stsb_dev": float(100 * scipy.stats.spearmanr(cosine(a, b), dev.gold)[0]),
            "align": alignment(a[positive], b[positive]),
            "uniform": uniformity(distinct)}


def keep_best(best, step, dev, model):
    """The best STS-B dev score so far, its step and the model's state, in memory, for the test
    table and the saved model [official: load_best_model_at_end]. The first evaluation is kept
    whatever it scores, then a higher score only: a tie or a NaN keeps the first [issue 52]."""
    first = best["state"] is None
    defined = math.isnan(best["dev"]) and not math.isnan(dev)  # a score beats an undefined one
    if first or defined or dev > best["dev"]:
        best.update(dev=dev, step=step, state={k: v.detach().clone()
                                               for k, v in model.state_dict().items()})


# --- Loop pieces: precision, optimizer, one global batch over processes ------------------------

class MixedPrecision:
    """--precision: autocast in bf16 or fp16 around the encoder, or none (fp32). fp16 adds a
    gradient scaler, as the official --fp16 runs do [HF Trainer]; bf16 needs none (Part 2 picks)."""

    def __init__(self, name, device):
        self.name = name  # bf16, fp16 or fp32
        self.device_type = device.type
        self.scaler = torch.amp.GradScaler(device.type, enabled=name == "fp16")  # else a no-op

    def autocast(self):
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.name)
        return torch.autocast(self.device_type, dtype) if dtype else contextlib.nullcontext()

    def state_dict(self):  # for the checkpoint
        return {"name": self.name, "scaler": self.scaler.state_dict()}

    def load_state_dict(self, state):  # saved in another precision: the scaler starts afresh
        if self.scaler.is_enabled() and state["scaler"]:
            self.scaler.load_state_dict(state["scaler"])


def upcast(x):
    """x in float32 at least (float64 stays float64): the loss math never runs in bf16 [G-prec]."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def make_optimizer(params, lr, total_steps, device):
    """AdamW (wd 0, betas 0.9/0.999, eps 1e-8), linear decay to 0, no warm-up [official Trainer]."""
    opt = torch.optim.AdamW([p for p in params if p.requires_grad], lr=lr, betas=(0.9, 0.999),
                            eps=1e-8, weight_decay=0.0, fused=device.type == "cuda")
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1 - s / total_steps))


def optimizer_step(loss, opt, sched, amp, max_grad_norm=1.0):
    """backward, clip the global gradient norm at 1.0 [official: HF Trainer], step, zero. fp16: the
    loss is scaled for backward and the gradients unscaled before clipping; a step whose gradients
    overflowed is skipped and the scale halves [torch.amp recipe]. Else no-ops. Nothing here
    reads a GPU value: the CPU queues the next step while the GPU runs this one."""
    amp.scaler.scale(loss).backward()
    amp.scaler.unscale_(opt)  # the true gradients, before clipping
    nn.utils.clip_grad_norm_([p for g in opt.param_groups for p in g["params"]], max_grad_norm)
    amp.scaler.step(opt)  # fp16: skipped if a gradient is inf or NaN (AdamW's count stays)
    amp.scaler.update()
    sched.step()  # the schedule follows the step count, skipped or not [official: HF Trainer 4.2]
    opt.zero_grad(set_to_none=True)


# torchrun: each process encodes its share of the batch (shard), the losses see it all (all_gather)

def shard(x, views=1):
    """[views*B, ...] view-major -> this rank's [views*b, ...]: rows r*b..(r+1)*b of each block."""
    rank, size = world()  # Part 2: (this process's rank, the number of processes)
    blocks = x.unflatten(0, (views, -1))  # [views, B, ...]
    b = blocks.size(1) // size
    return blocks[:, rank * b:(rank + 1) * b].flatten(0, 1)


def all_gather(x, views=1):
    """The inverse of shard, with gradient: [views*b, ...] -> [views*B, ...] on every process."""
    if world()[1] == 1:
        return x
    return AllGather.apply(x.unflatten(0, (views, -1))).flatten(0, 1)


class AllGather(torch.autograd.Function):
    """[views, b, ...] on each rank -> [views, N*b, ...], rank order, everywhere. Backward: each
    rank's loss is the whole-batch loss L, so rank r's gradient is its slice of dL summed over the
    ranks; DDP then averages the parameter gradients over N, which the sum cancels: one step equals
    one process's step on the whole batch (tests/test_ddp.py)."""

    @staticmethod
    def forward(ctx, x):
        parts = [torch.empty_like(x) for _ in range(world()[1])]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=1)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()  # all_reduce works in place: not on autograd's buffer
        dist.all_reduce(grad)  # sum over ranks
        rank, size = world()
        b = grad.size(1) // size
        return grad[:, rank * b:(rank + 1) * b]


# Large batches on small GPUs: gradient caching [Gao et al. 2021, arXiv:2101.06983], --chunk_size.

def gradient_cache(module, chunk_size, *inputs, **kwargs):
    """module(*inputs, **kwargs), inputs [N, ...], chunk_size rows at a time (0: all at once):
    the whole batch's exact step in one chunk's activation memory. Gradient accumulation would
    change the method: each micro-batch would see only its own negatives. The loss sees them all:
      1. forward: each chunk encoded without a graph, its random state kept -> the vectors [N, ...]
      2. the loss, and autograd's gradient of it with respect to those vectors: the cache
      3. backward: each chunk encoded again with its graph, replaying step 1 (random state, so the
         same dropout masks; autocast; module modes), as torch.utils.checkpoint does, and its rows
         of the cached gradient back-propagated into the parameters and float inputs (DiffCSE's h).
    The parameter gradients leave summed, as one result: DDP syncs them once per step."""
    if isinstance(module, nn.parallel.DistributedDataParallel):  # torchrun: see Run.ddp
        return module(gradient_cache, chunk_size, *inputs, **kwargs)  # inside DDP's forward
    if not 0 < chunk_size < len(inputs[0]):
        return module(*inputs, **kwargs)
    params = [p for p in module.parameters() if p.requires_grad]
    return GradientCache.apply(module, chunk_size, kwargs, len(inputs), *inputs, *params)


class GradientCache(torch.autograd.Function):
    @staticmethod
    def forward(ctx, module, chunk_size, kwargs, n_inputs, *tensors):  # the inputs, parameters
        ctx.module, ctx.kwargs, ctx.chunk_size = module, kwargs, chunk_size
        ctx.inputs = tensors[:n_inputs]  # [N, ...] each
        ctx.params = tensors[n_inputs:]
        ctx.device = tensors[0].device
        kind = ctx.device.type  # step 1's autocast, for step 3:
        ctx.autocast = torch.autocast(kind, torch.get_autocast_dtype(kind),
                                      enabled=torch.is_autocast_enabled(kind))
        ctx.modes = [(m, m.training) for m in module.modules()]  # SimCSE++'s dropout-off pass
        ctx.states, vectors = [], []
        for chunk in zip(*(x.split(chunk_size) for x in ctx.inputs)):  # no graph in a forward
            ctx.states.append(random_states(ctx.device))
            vectors.append(module(*chunk, **kwargs))
        return torch.cat(vectors)  # [N, ...]

    @staticmethod
    def backward(ctx, grad):  # grad [N, ...]: the loss's gradient w.r.t. the vectors, cached
        # forward's arguments, in order: module, chunk_size, kwargs, n_inputs (no gradient), the
        # inputs (one where autograd asks: DiffCSE's h), the parameters; needs_input_grad likewise
        wants = ctx.needs_input_grad[4:4 + len(ctx.inputs)]
        inputs = [x.detach().requires_grad_(want) for x, want in zip(ctx.inputs, wants)]
        wanted = [x for x in inputs if x.requires_grad] + list(ctx.params)
        sums = [torch.zeros_like(x) for x in wanted]  # wanted's gradients, summed over the chunks
        states = random_states(ctx.device)
        modes = [(m, m.training) for m, _ in ctx.modes]
        for m, training in ctx.modes:  # eval, say, in step 1: eval now
            m.training = training
        with torch.enable_grad(), ctx.autocast:
            chunks = zip(*(x.split(ctx.chunk_size) for x in inputs))  # views: h's gradient [N, H]
            for chunk, state, g in zip(chunks, ctx.states, grad.split(ctx.chunk_size)):
                set_random_states(state, ctx.device)  # the first pass's dropout masks again
                vectors = ctx.module(*chunk, **ctx.kwargs)  # [n, ...], with its graph
                got = torch.autograd.grad(vectors, wanted, g, materialize_grads=True)  # 0: unused
                # a private torch API, kept for its gain over a loop of add_ (chunk 64, an H200):
                torch._foreach_add_(sums, got)  # one fused add: 957 -> 637 ms a step [impl]
        set_random_states(states, ctx.device)  # as they were: the next draws are new ones
        for m, training in modes:
            m.training = training
        # sums: the gradients of the inputs that want one, in order, then the parameters'
        n = sum(wants)
        given = iter(sums[:n])
        input_grads = [next(given) if want else None for want in wants]
        return (None,) * 4 + tuple(input_grads) + tuple(sums[n:])


def random_states(device):  # what dropout draws from: the CPU's generator and the GPU's
    gpu = getattr(torch, device.type) if device.type != "cpu" else None
    return torch.get_rng_state(), gpu.get_rng_state(device) if gpu else None


def set_random_states(states, device):
    torch.set_rng_state(states[0])
    if states[1] is not None:
        getattr(torch, device.type).set_rng_state(states[1], device)


# --- The masked-LM loss: --do_mlm's auxiliary loss, and DiffCSE's masking ------------------------

def mask_tokens(ids, mask, ratio, mask_id, vocab_size, special_ids, gen):
    """BERT's masking, per row: `ratio` of the real tokens but `special_ids` chosen, 80% of them
    -> [MASK], 10% random, 10% kept [official: HF's MLM collator] -> (masked [N, L], chosen)."""
    def draw(p):
        return torch.rand(ids.shape, generator=gen, device=ids.device) < p
    maskable = mask.bool() & ~torch.stack([ids == s for s in special_ids]).any(0)  # no host copy
    chosen = draw(ratio) & maskable
    to_mask = chosen & draw(0.8)
    to_random = chosen & ~to_mask & draw(0.5)  # half of the remaining 20%
    random_ids = torch.randint(vocab_size, ids.shape, generator=gen, device=ids.device)  # [HF]
    return torch.where(to_random, random_ids, torch.where(to_mask, mask_id, ids)), chosen


def mlm_loss(model, ids, mask, tok, gen, V=1, chunk_size=0, ratio=0.15):
    """The MLM head's loss on ids, mask [V*B, L], the whole batch, every view 15% masked as
    BERT's: the mean cross-entropy at the chosen tokens [official collator, cl_forward]. Each
    process encodes its rows; the mean is the whole batch's (all_gather), as one process's."""
    ids, mask = ids.to(gen.device), mask.to(gen.device)  # drawn whole: the same masks under DDP
    masked, chosen = mask_tokens(ids, mask, ratio, tok.mask_id, len(tok.vocab), tok.special_ids,
                                 gen)
    masked, ids, mask = (shard(t, V) for t in (masked, ids, mask))  # [V*b, L]: this process's
    states = gradient_cache(model, chunk_size, masked, mask)  # [V*b, L, H]
    # the MLM head, on every row at once; torchrun: model is DDP(InsideDDP(bert)) (Run.ddp)
    bert = model.module.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    logits = bert.mlm_logits(states)  # [V*b, L, vocabulary]
    nll = F.cross_entropy(upcast(logits).transpose(1, 2), ids, reduction="none")  # [V*b, L]
    nll = all_gather(nll, V)  # [V*B, L]
    return (nll * chosen).sum() / chosen.sum().clamp(min=1)  # none chosen: 0 [official: NaN]


def add_mlm(loss, stats, model, view_ids, view_mask, V, tok, gen, cfg):
    """--do_mlm: loss + λ·the MLM loss over the V views of the batch, view_ids and view_mask
    [V*B, L] [official cl_forward: mlm_weight]; the log shows both."""
    mlm = mlm_loss(model, view_ids, view_mask, tok, gen, V, cfg.chunk_size)
    loss = loss + cfg.mlm_weight * mlm
    return loss, {**stats, "loss": loss.detach(), "mlm": mlm.detach()}


# ==================================================================================================
# Part 2: operations, safe to skip when learning, one guarantee a section (docs/reliability.md).
# ==================================================================================================
import argparse
import datetime
import difflib
import errno
import gc
import hashlib
import http.client
import inspect
import io
import itertools
import json
import multiprocessing
import os
import secrets
import shutil
import signal
import stat
import sys
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import warnings
from pathlib import Path


# --- Errors: one line and an exit status, never a traceback ---------------------------------------
# A user's mistake is one line on stderr and a non-zero exit status; a crash keeps its traceback.

class UserError(Exception):
    """A problem with the user's input: one line on stderr, exit status 2, no traceback."""
    exit_code = 2


class CheckpointError(UserError):
    """A model folder or checkpoint file that cannot be loaded as it is."""


class RunFinished(UserError):
    """--resume of a run that already finished: said in one line, exit status 0, nothing done."""
    exit_code = 0


class TrainingStopped(UserError):
    """The run stopped itself (a non-finite loss) after writing the best model so far: exit 3."""
    exit_code = 3


def main_guard(fn, *args):
    """Run a command-line entry point: a UserError is one line on stderr and its exit status (2),
    never a traceback. Under torchrun the process group ends after a normal return."""
    # a Spearman of constant input (a collapsed model, one gold score) is NaN: logged, never best
    warnings.filterwarnings("ignore", category=scipy.stats.ConstantInputWarning)
    # fp16: a first step skipped for overflow still steps the schedule, as HF Trainer 4.2 does
    warnings.filterwarnings("ignore", re.escape("Detected call of `lr_scheduler.step()` before"))
    CAUGHT.clear()  # a new command: nothing caught yet
    try:
        result = fn(*args)
    except BrokenPipeError:  # `search --json | head -n 1`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # [Python docs: SIGPIPE]
        sys.exit(1)
    except OSError as e:  # on a path: the one line of every file a user names [issue 63]
        full = e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
        if not (full or e.filename):  # no file named: a crash keeps its traceback
            raise
        what = "no room to write" if full else "cannot read or write"
        fix = "the disk or quota is full; what was saved before is intact: free space, then run " \
            "again (training: --resume)" if full else "check that file and its disk"
        print(f"error: {what} {e.filename or 'a file'} ({e.strerror}): {fix}", file=sys.stderr)
        sys.exit(2)
    except UserError as e:
        if e.exit_code == 0:  # --resume of a finished run: said once, not an error
            leave_distributed()
        if e.exit_code or int(torchrun_env().get("RANK", 0)) == 0:  # before the process group
            print(f"error: {e}" if e.exit_code else e, file=sys.stderr)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as e:  # after a caught Ctrl-C/SIGTERM, what it interrupted failed: a cold
        if CAUGHT:  # --compile's g++ killed with the process group [issue 40]
            print(f"error: stopped by {signal.Signals(CAUGHT[-1]).name}, which broke what was "
                  f"running ({type(e).__name__}); the last checkpoint, if any, is kept: run again "
                  f"or --resume", file=sys.stderr)
            sys.exit(128 + CAUGHT[-1])
        if "not used in producing loss" not in str(e):  # else a crash, but DDP's reducer's
            raise  # [torch reducer.cpp]: a parameter unused in the step [issue 57]
        unused = re.search(r"did not receive grad for rank \d+: ([\d ]+)", str(e))
        indices = unused.group(1).strip() if unused else "?"
        print(f"error: under torchrun a parameter of the model got no gradient (indices {indices}"
              f" in module.parameters()), which DistributedDataParallel cannot average: a bug "
              f"here; TORCH_DISTRIBUTED_DEBUG=INFO names them; please report it", file=sys.stderr)
        sys.exit(1)
    leave_distributed()  # on an error torchrun stops every process
    return result


# --- Files: atomic writes, UTF-8, JSON, safetensors -----------------------------------------------
# A file is whole or absent; text is UTF-8 or one line; a hostile safetensors header allocates none.

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
          "I64": torch.int64, "I32": torch.int32, "U8": torch.uint8}


def temporaries(paths):
    """The temporary files (atomic_write's) a kill left beside `paths`: the only names a command
    cleans up, never a user's look-alike (.notes.20261128.tmp) nor a folder [issue 63]."""
    left = []
    for path in paths:
        shape = rf"\.{re.escape(path.name)}\.[0-9a-f]{{8}}\.tmp"
        found = path.parent.iterdir() if path.parent.is_dir() else []
        left += [p for p in found if re.fullmatch(shape, p.name) and p.is_file()]
    return left


@contextlib.contextmanager
def naming(path):
    """An OSError while `path` is read names it (EIO has no file name): main_guard's line does."""
    try:
        yield
    except OSError as e:
        if e.filename is None:
            e.filename = str(path)
        raise


@contextlib.contextmanager
def atomic_write(path, mode="w"):
    """Write a file with no name (Linux's O_TMPFILE: a SIGKILL leaves nothing [open(2)]), else a
    temporary name beside `path`; then rename it over: no reader sees a partial file [issue 52]."""
    path = Path(path)
    tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"  # as temporaries() knows them
    named = False  # tmp is ours once made: only then removed
    try:
        fd = os.open(path.parent, os.O_TMPFILE | os.O_WRONLY, 0o666)  # the umask applies
    except (AttributeError, OSError):  # not Linux, or a file system without unnamed files
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        named = True
    try:  # naming: a full disk says which file
        with naming(path), os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
            if not named:  # a name for a moment, beside `path` (temporaries() clears it)
                fd = f.fileno()  # a dir_fd makes CPython call linkat(AT_SYMLINK_FOLLOW), which
                os.link(f"/proc/self/fd/{fd}", tmp, src_dir_fd=fd)  # an absolute path ignores
                named = True
        os.replace(tmp, path)
    except BaseException:
        if named:
            tmp.unlink(missing_ok=True)
        raise


def write_json(path, obj, indent=2, through=False):
    """Strict JSON, written atomically (`through`: into a pipe or device, as it is): NaN and
    infinities (an undefined score) become null."""
    obj = json.loads(json.dumps(obj), parse_constant=lambda name: None)  # NaN, Infinity -> None
    place = open(path, "w", encoding="utf-8") if through else atomic_write(path)
    with place as f:
        f.write(json.dumps(obj, indent=indent, allow_nan=False) + "\n")  # text: a last newline


def read_utf8(path, error=UserError):
    """A UTF-8 text file, or one line (an `error`) saying where its first bad byte is. Every text
    file is read here: the data, vocab.txt, merges.txt, JSON, SentEval's files [SentEval: utf8]."""
    with naming(path):
        raw = Path(path).read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise error(f"{path} is not UTF-8 (line {line}, byte {e.start}); convert it, e.g. "
                    f"iconv -t UTF-8") from None


def read_json(path, what):
    """A JSON file, or one line (CheckpointError): missing, no file, over 100 MB, not JSON."""
    why = path_problem(path)
    if not why and os.stat(path).st_size > 10**8:  # ours and a model's: a few MB; read whole
        why = f"is {os.stat(path).st_size:,} bytes, too large for one"
    if why:
        raise CheckpointError(f"{what} ({path}) {why}")
    try:
        return json.loads(read_utf8(path, CheckpointError))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CheckpointError(f"{what} ({path}) is not valid JSON ({type(e).__name__})") from None


def read_safetensors(path):
    """A .safetensors file -> {name: tensor}: the header's dtypes, shapes and offsets must tile the
    data bytes exactly, checked before any tensor is made (a hostile header allocates nothing)."""
    def bad(why):
        return CheckpointError(f"{path}: not a valid safetensors file: {why}")
    data = Path(path).read_bytes()  # 8 bytes: the header's size, the JSON header, the tensors
    n = int.from_bytes(data[:8], "little")
    if len(data) < 8:
        raise bad(f"{len(data)} bytes, too short to hold the 8-byte header size (truncated?)")
    if n > min(len(data) - 8, 100_000_000):  # the safetensors library's limit
        raise bad(f"the header claims {n} bytes but the file has {len(data) - 8} after the size "
                  f"field (truncated?)")
    body = memoryview(data)[8 + n:]
    spans = {}
    end = 0  # where the next tensor must start
    try:
        header = json.loads(data[8:8 + n].decode("utf-8"))
        header.pop("__metadata__", None)
        for name, info in sorted(header.items(), key=lambda item: item[1]["data_offsets"]):
            lo, hi = info["data_offsets"]
            dtype = DTYPES[info["dtype"]]
            shape = info["shape"]
            if not (type(shape) is list and len(shape) <= 64 and lo == end and all(
                    type(d) is int and 0 <= d < 2**62 for d in [*shape, lo, hi]) and
                    hi - lo == math.prod(shape) * dtype.itemsize):
                raise bad(f"tensor {name[:80]!r}: dtype, shape or data offsets {repr(info)[:120]} "
                          f"do not follow on at byte {end} of the {len(body)} data bytes")
            spans[name] = (lo, hi, dtype, shape)
            end = hi
    except (ValueError, RecursionError, TypeError, KeyError, AttributeError) as e:  # bad UTF-8 too
        raise bad(f"the header is not a JSON object of tensors ({type(e).__name__})") from None
    if end != len(body):
        cut = " (truncated?)" if end > len(body) else ""
        raise bad(f"the tensors span {end} data bytes but the file holds {len(body)}{cut}")
    return {name: torch.frombuffer(bytearray(body[lo:hi]), dtype=dtype).reshape(shape) if hi > lo
            else torch.empty(shape, dtype=dtype) for name, (lo, hi, dtype, shape) in spans.items()}


def write_safetensors(path, tensors, metadata=None):
    """{name: tensor} -> a .safetensors file (header padded to 8 bytes), written atomically."""
    tensors = {k: t.detach().contiguous().cpu() for k, t in tensors.items()}
    names = {v: k for k, v in DTYPES.items()}
    offset = 0
    header = {"__metadata__": {"format": "pt", **(metadata or {})}}
    for name, t in tensors.items():
        size = t.numel() * t.element_size()
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with atomic_write(path, "wb") as f:
        f.write(len(blob).to_bytes(8, "little") + blob)
        for t in tensors.values():  # reshape: a 0-dim tensor has no byte view
            f.write(t.reshape(-1).view(torch.uint8).numpy().tobytes())


# --- Hugging Face model folders: read and saved ---------------------------------------------------
# Loaded with every tensor as config.json says, or one line; saved as transformers loads it.

MODEL_FILES = ("config.json", "vocab.txt", "vocab.json", "merges.txt", "tokenizer_config.json",
               "model.safetensors", "pytorch_model.bin")  # what loading a model folder reads
SAVED = ("model.safetensors", "config.json", "vocab.txt", "vocab.json", "merges.txt",
         "tokenizer_config.json", "special_tokens_map.json", "modules.json",
         "sentence_bert_config.json", "1_Pooling/config.json", "2_Dense/config.json",
         "2_Dense/model.safetensors")  # what save_pretrained writes (2_Dense: supervised runs')
OUTPUTS = ("log.txt", "checkpoint.pt", "results.json", *SAVED)  # what a run writes in out_dir


def special_file(folder):
    """'' or 'NAME is ...': a model file that is a FIFO, device or folder (a read hangs, fails)."""
    for name in MODEL_FILES:
        if os.path.lexists(folder / name) and path_problem(folder / name):
            return f"{name} {path_problem(folder / name)}"
    return ""


def folder_problem(folder):
    """What keeps `folder` from being a model folder we can read ("" if nothing)."""
    if special_file(folder):
        return f"is unreadable: its {special_file(folder)}"
    if not (folder / "config.json").is_file():
        return "has no config.json: not a Hugging Face model folder"
    if not any((folder / v).is_file() for v in ("vocab.txt", "merges.txt")):
        return "has no vocab.txt (BERT's WordPiece) or merges.txt (RoBERTa's BPE): no tokenizer"
    if not any((folder / w).is_file() for w in ("model.safetensors", "pytorch_model.bin")):
        return "has neither model.safetensors nor pytorch_model.bin"
    return ""


def read_vocab(folder):
    """A folder's vocab.txt (token -> line number) and tokenizer_config.json ({} if absent)."""
    if not (folder / "vocab.txt").is_file():
        raise CheckpointError(f"{folder} has no vocab.txt: not a BERT (WordPiece) model folder")
    text = read_utf8(folder / "vocab.txt", CheckpointError)
    vocab = {line.rstrip("\r"): i for i, line in enumerate(text.removesuffix("\n").split("\n"))}
    if any(t not in vocab for t in SPECIAL_TOKENS):
        raise CheckpointError(f"{folder}/vocab.txt lacks BERT's special tokens {SPECIAL_TOKENS}")
    path = folder / "tokenizer_config.json"
    config = read_json(path, "tokenizer_config.json") if path.exists() else {}
    if not isinstance(config, dict):
        raise CheckpointError(f"{path} is not a JSON object")
    for k in ("do_lower_case", "strip_accents"):  # a string "false" would count as true
        if type(config.get(k, False)) is not bool and config[k] is not None:
            raise CheckpointError(f"{path}: {k} is {config[k]!r}; it must be true or false")
    return vocab, config


def read_bpe(folder):
    """A RoBERTa folder's vocab.json (token -> id) and merges.txt (pairs by rank), checked."""
    vocab = read_json(folder / "vocab.json", "the tokenizer's vocab.json")
    if not (isinstance(vocab, dict) and all(type(i) is int and i >= 0 for i in vocab.values())):
        raise CheckpointError(f"{folder}/vocab.json is not a JSON object of token -> id")
    if any(t not in vocab for t in BPE_SPECIALS):
        raise CheckpointError(f"{folder}/vocab.json lacks RoBERTa's special tokens {BPE_SPECIALS}")
    lines = read_utf8(folder / "merges.txt", CheckpointError).splitlines()
    merges = [tuple(line.split(" ")) for line in lines if line and not line.startswith("#version")]
    bad = next((i for i, m in enumerate(merges) if len(m) != 2 or "".join(m) not in vocab), None)
    if bad is not None:
        raise CheckpointError(f"{folder}/merges.txt: merge {bad + 1} ({' '.join(merges[bad])!r}) "
                              f"is not two tokens whose join is in vocab.json")
    return vocab, merges


def read_tokenizer_files(name_or_dir):
    """A folder's (or known name's) tokenizer files, checked: RoBERTa's BPE, else WordPiece's."""
    folder = resolve_model(name_or_dir)
    if special_file(folder):
        raise CheckpointError(f"{folder}/{special_file(folder)}")
    if (folder / "merges.txt").exists():
        return dict(zip(("vocab", "merges"), read_bpe(folder)))
    vocab, config = read_vocab(folder)
    return {"vocab": vocab, "do_lower_case": config.get("do_lower_case", True),
            "strip_accents": config.get("strip_accents")}


DISTILBERT_CONFIG = {"dim": "hidden_size", "n_layers": "num_hidden_layers", "n_heads":
                     "num_attention_heads", "hidden_dim": "intermediate_size", "dropout":
                     "hidden_dropout_prob", "attention_dropout": "attention_probs_dropout_prob",
                     "activation": "hidden_act", "sinusoidal_pos_embds": "sinusoidal"}
RENAMES = {  # our module: (Hugging Face BERT's, DistilBERT's); one table, read both ways
    "layers": ("encoder.layer", "transformer.layer"),
    "query": ("attention.self.query", "attention.q_lin"),
    "key": ("attention.self.key", "attention.k_lin"),
    "value": ("attention.self.value", "attention.v_lin"),
    "attn_out": ("attention.output.dense", "attention.out_lin"),
    "attn_norm": ("attention.output.LayerNorm", "sa_layer_norm"),
    "ffn_in": ("intermediate.dense", "ffn.lin1"),
    "ffn_out": ("output.dense", "ffn.lin2"),
    "ffn_norm": ("output.LayerNorm", "output_layer_norm"),
    "mlm.dense": ("cls.predictions.transform.dense", "vocab_transform"),
    "mlm.norm": ("cls.predictions.transform.LayerNorm", "vocab_layer_norm"),
    "mlm": ("cls.predictions", "vocab_projector"),  # the MLM bias
}
ROBERTA_MLM = {"mlm.dense": "lm_head.dense", "mlm.norm": "lm_head.layer_norm", "mlm": "lm_head"}
TIED = {"cls.predictions.decoder.weight", "vocab_projector.weight", "lm_head.decoder.weight"}
SKIPPED = {"embeddings.position_ids", "cls.predictions.decoder.bias", "lm_head.decoder.bias"}


def read_weights(name_or_dir, mlm_head=False, quiet=False):
    """A model folder or known name -> (BertConfig, its weights in our names). Every tensor the
    model needs, shaped as config.json says: compared with a model built on the meta device (no
    memory), so a hostile config.json allocates nothing; the vocabulary must fit the embeddings.
    The tensors left out are noted unless quiet; quiet="heads": all but the pretraining heads."""
    folder = resolve_model(name_or_dir)
    cfg = read_config(folder)
    tensors = read_tensors(folder)  # with BERT's pooler, if any: --pooler cls [evaluation.py]
    pooler = any(re.fullmatch(r"((bert|roberta)\.)?pooler\.dense\.weight", k) for k in tensors)
    with torch.device("meta"):
        expected = Bert(cfg, mlm_head, pooler).state_dict()
    state, unused = rename_checkpoint(tensors, cfg.model_type, expected, mlm_head)
    has_vocab = (folder / "vocab.txt").exists() or (folder / "merges.txt").exists()
    words = max(read_tokenizer_files(folder)["vocab"].values()) + 1 if has_vocab else 0
    if words > cfg.vocab_size:  # a token id past the embedding rows would fail mid-training
        raise CheckpointError(f"{folder}: its vocabulary has {words} tokens, its embeddings "
                              f"{cfg.vocab_size} rows (config.json vocab_size): two models mixed")
    if unused and quiet is not True:
        note_unused(folder, tuple(sorted(unused)), heads_too=not quiet)
    return cfg, state


def read_config(folder):
    """config.json -> a checked BertConfig: BERT, DistilBERT (its names mapped) or RoBERTa."""
    if not (folder / "config.json").is_file():
        raise CheckpointError(f"{folder} has no config.json: not a Hugging Face model folder")
    hf = read_json(folder / "config.json", "the model's config.json")
    kind = hf.get("model_type", "bert") if isinstance(hf, dict) else None
    if kind == "distilbert":
        hf = {DISTILBERT_CONFIG.get(k, k): v for k, v in hf.items()} | {"type_vocab_size": 0}
    if kind not in ("bert", "distilbert", "roberta") or hf.get("hidden_act", "gelu") != "gelu" or \
            hf.get("sinusoidal") or hf.get("position_embedding_type", "absolute") != "absolute":
        raise CheckpointError(f"{folder}: model_type {kind!r}: only BERT/DistilBERT/RoBERTa with "
                              f"GELU and learned absolute positions is supported")
    cfg = BertConfig(**{f.name: hf[f.name] for f in dataclasses.fields(BertConfig) if f.name in hf})
    cfg.model_type = kind
    values = dataclasses.asdict(cfg)
    bad = [k for k, v in values.items() if k.endswith(("_size", "_layers", "_heads", "_embeddings"))
           and not (type(v) is int and v >= (k != "type_vocab_size"))]  # 0 types: DistilBERT
    bad += [k for k, v in values.items() if k.endswith(("_prob", "_eps")) and not (
        type(v) in (int, float) and 0 <= v < 1 and (v > 0 or k.endswith("_prob")))]
    if not bad and cfg.hidden_size % cfg.num_attention_heads:  # the heads must split the width
        bad = ["hidden_size", "num_attention_heads"]
    if not bad and not (type(cfg.pad_token_id) is int and 0 <= cfg.pad_token_id < cfg.vocab_size):
        bad = ["pad_token_id"]
    if not bad and cfg.max_tokens < 3:  # RoBERTa's positions start after pad_token_id
        bad = ["max_position_embeddings", "pad_token_id"]
    if bad:
        raise CheckpointError(f"{folder}: config.json has unusable values: "
                              + ", ".join(f"{k}={values[k]!r}" for k in bad[:4]))
    return cfg


def read_tensors(folder):
    """model.safetensors, else pytorch_model.bin read with weights_only (never unpickling code)."""
    if (folder / "model.safetensors").exists():
        return read_safetensors(folder / "model.safetensors")
    if not (folder / "pytorch_model.bin").exists():
        raise CheckpointError(f"{folder} has neither model.safetensors nor pytorch_model.bin")
    try:
        tensors = torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    except Exception as e:  # weights_only refuses anything but tensors and plain containers
        if "Weights only load failed" not in str(e):  # [torch.load's refusal] else a cut file
            raise CheckpointError(f"{folder}/pytorch_model.bin is truncated or corrupt ("
                                  f"{type(e).__name__}): delete it and download it again") from None
        raise CheckpointError(f"{folder}/pytorch_model.bin cannot be loaded safely (weights only; "
                              f"{type(e).__name__}): convert it to model.safetensors") from None
    if not (isinstance(tensors, dict) and all(type(k) is str and isinstance(v, torch.Tensor)
                                              for k, v in tensors.items())):
        raise CheckpointError(f"{folder}/pytorch_model.bin is not a flat dict of named tensors "
                              f"(a training checkpoint?): save the model's state_dict instead")
    return tensors


def hf_name(name, kind="bert"):
    """Our parameter name -> the Hugging Face BERT (DistilBERT, RoBERTa) one, without 'bert.'."""
    module, _, param = name.rpartition(".")
    parts = re.fullmatch(r"(layers)\.(\d+)\.(\w+)", module)
    names = [parts[1], parts[2], parts[3]] if parts else [module]  # embeddings.*: as they are
    table = {k: v[kind == "distilbert"] for k, v in RENAMES.items()}
    table |= ROBERTA_MLM if kind == "roberta" else {}  # RoBERTa: BERT's names, its own MLM head
    return ".".join(table.get(n, n) for n in names) + f".{param}"


def rename_checkpoint(tensors, model_type, expected, mlm_head):
    """Checkpoint tensors -> (state_dict in our names, unused keys); every tensor of `expected` (our
    names: shapes, dtypes) filled, else a CheckpointError naming the missing or mismatched ones."""
    state = {}
    unused = set()
    ours = {hf_name(k, model_type): k for k in expected}
    words = next((v for k, v in tensors.items() if k.endswith("embeddings.word_embeddings.weight")),
                 None)
    for key, t in tensors.items():
        bare = re.sub(r"^(bert|distilbert|roberta)\.", "", key)
        bare = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", bare)  # legacy names [HF #11809]
        bare = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", bare)
        if bare in TIED and mlm_head and (words is None or not torch.equal(t, words)):
            raise CheckpointError(f"{key} is not tied to the word embeddings; this BERT ties them")
        if bare in ours and ours[bare] in state:  # X and bert.X: which one is meant is unclear
            raise CheckpointError(f"{key}: the checkpoint holds this tensor twice (with and "
                                  f"without the model prefix); keep one")
        if bare in ours:
            state[ours[bare]] = t
        elif bare not in TIED | SKIPPED:
            unused.add(key)
    missing = [k for k in expected if k not in state]
    if missing:
        hint = ""
        if all(k.startswith("mlm.") for k in missing):
            hint = (" (the checkpoint has no masked-LM head: a masked language model is needed "
                    "here, for --do_mlm or DiffCSE's --generator, e.g. bert-base-uncased)")
        raise CheckpointError(f"checkpoint is missing {len(missing)} tensors{hint}: "
                              f"{', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}")
    bad = [f"{k} {tuple(state[k].shape)} != {tuple(v.shape)}" for k, v in expected.items()
           if state[k].shape != v.shape]
    if bad:
        raise CheckpointError("checkpoint tensors do not match config.json: " + "; ".join(bad[:4]))
    return {k: t.to(expected[k].dtype) for k, t in state.items()}, unused


@functools.cache  # said once a process: DiffCSE loads the same model twice
def note_unused(folder, unused, heads_too=True):
    """The checkpoint's tensors the model leaves out (`unused`: their names, sorted); only
    heads_too notes a checkpoint's pretraining heads alone."""
    heads = all(re.match(r"(bert\.|roberta\.)?(pooler|cls|lm_head|vocab_\w+)\.", k)
                for k in unused)  # BERT's pooler and MLM/NSP heads, RoBERTa's, DistilBERT's
    if heads and not heads_too:
        return
    why = " (pretraining heads: each method trains its own)" if heads else ""
    parts = {}  # first name -> its keys: a training model's other parts (DiffCSE's release)
    for key in unused:
        parts.setdefault(key.split(".")[0], []).append(key)
    whole = max(len(keys) for keys in parts.values()) > 8  # a second encoder, say: one line still
    shown = []
    for part, keys in parts.items():
        if whole and len(keys) > 1:  # e.g. discriminator.* (198 tensors)
            shown.append(f"{part}.* ({len(keys)} tensors)")
        else:
            shown.extend(keys)
    if whole and not heads:
        why = " (a training model's other parts: its encoder alone is read)"
    print(f"{folder.name}{why}: not used from the checkpoint: {', '.join(shown)}", file=sys.stderr)


def save_pretrained(model, folder, tokenizer, pooler="cls_before_pooler", dtype=torch.float32):
    """A folder that BertModel (RobertaModel) and sentence-transformers load with our vectors; the
    model's pooler (a method's MLP) saved as transformers' (pooler_output), as the released SimCSE
    models are [official simcse_to_huggingface.py]. sentence-transformers gives the test vector
    `pooler`: the raw [CLS] (CLS pooling); `cls` (supervised SimCSE): then the MLP (Dense)."""
    folder = Path(folder)
    cfg = model.cfg
    mlm = model.mlm is not None
    kind = "roberta" if cfg.model_type == "roberta" else "bert"  # DistilBERT is saved as BERT
    (folder / "1_Pooling").mkdir(parents=True, exist_ok=True)
    prefix = f"{kind}." if mlm else ""  # *ForMaskedLM keys: bert.<encoder>, cls.* as they are
    tensors = {}
    for n, t in model.state_dict().items():
        name = hf_name(n, kind) if n.startswith("mlm.") else prefix + hf_name(n, kind)
        tensors[name] = t.to(dtype)
    if mlm and kind == "roberta":  # transformers 4.x ties RoBERTa's MLM bias from this copy
        tensors["lm_head.decoder.bias"] = tensors["lm_head.bias"]
    write_safetensors(folder / "model.safetensors", tensors)
    write_json(folder / "config.json", {
        "architectures": [kind.title() + ("ForMaskedLM" if mlm else "Model")],
        **dataclasses.asdict(cfg), "model_type": kind, "hidden_act": "gelu",
        "position_embedding_type": "absolute", "initializer_range": 0.02,
        "torch_dtype": str(dtype).removeprefix("torch.")})
    st = "sentence_transformers.models."
    modules = [{"idx": 0, "name": "0", "path": "", "type": st + "Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": st + "Pooling"}]
    if pooler == "cls":  # the MLP after the CLS pooling, as sentence-transformers' Dense module
        # saves itself [UKPLab/sentence-transformers models/Dense.py @13b4da2, save()]: Tanh by
        # its fullname(), linear.* as 6.2.0 reads them (pooler_ref.json "dense_format")
        dense = model.pooler.dense
        (folder / "2_Dense").mkdir(exist_ok=True)
        write_json(folder / "2_Dense/config.json", {
            "in_features": dense.in_features, "out_features": dense.out_features, "bias": True,
            "activation_function": "torch.nn.modules.activation.Tanh"})
        write_safetensors(folder / "2_Dense/model.safetensors", {
            "linear.weight": dense.weight.to(dtype), "linear.bias": dense.bias.to(dtype)})
        modules.append({"idx": 2, "name": "2", "path": "2_Dense", "type": st + "Dense"})
    write_json(folder / "modules.json", modules)
    write_json(folder / "sentence_bert_config.json",
               {"max_seq_length": cfg.max_tokens, "do_lower_case": False})
    write_json(folder / "1_Pooling/config.json", {"word_embedding_dimension": cfg.hidden_size, **{
        f"pooling_mode_{m}": m == "cls_token"
        for m in ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens")}})
    save_tokenizer(tokenizer, folder, cfg.max_tokens)


def save_tokenizer(tokenizer, folder, max_tokens):
    """The tokenizer's files as transformers' RobertaTokenizer (BertTokenizer) reads them."""
    bpe = isinstance(tokenizer, BPETokenizer)
    specials = {f"{n}_token": t for n, t in zip("pad unk cls sep mask".split(),
                                                BPE_SPECIALS if bpe else SPECIAL_TOKENS)}
    write_json(folder / "special_tokens_map.json", specials)
    if bpe:
        config = {"tokenizer_class": "RobertaTokenizer", "add_prefix_space": False,
                  "bos_token": "<s>", "eos_token": "</s>"}
        write_json(folder / "vocab.json", tokenizer.vocab)
        with atomic_write(folder / "merges.txt") as f:
            f.write("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in tokenizer.merges))
    else:
        strip = None if tokenizer.strip_accents == tokenizer.lower else tokenizer.strip_accents
        config = {"tokenizer_class": "BertTokenizer", "do_lower_case": tokenizer.lower,
                  "strip_accents": strip}
        lines = [""] * (max(tokenizer.vocab.values()) + 1)  # line i holds token i, as it was read
        for token, i in tokenizer.vocab.items():
            lines[i] = token
        if any("\n" in t or "\r" in t for t in lines):  # vocab.txt has one token a line
            raise CheckpointError(f"{folder}/vocab.txt cannot hold a token with a line break")
        with atomic_write(folder / "vocab.txt") as f:
            f.write("".join(token + "\n" for token in lines))
    write_json(folder / "tokenizer_config.json",
               config | specials | {"model_max_length": max_tokens})


# --- Resolving and downloading models and data ----------------------------------------------------
# A name means one folder to the checks and the loading; a download is whole (as the hub states).

HF_ENDPOINT = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
CACHE = Path(os.environ.get("SIMCSE_CACHE") or Path.home() / ".cache" / "simcse-min").expanduser()
_FILES = ["config.json", "vocab.txt", "tokenizer_config.json", "model.safetensors"]  # weights last
_BPE_FILES = ["config.json", "vocab.json", "merges.txt", "model.safetensors"]
_BIN_FILES = ["config.json", "vocab.txt", "pytorch_model.bin"]  # no safetensors in these
_BPE_BIN_FILES = ["config.json", "vocab.json", "merges.txt", "pytorch_model.bin"]
KNOWN_MODELS = {  # name -> the files we read (what each repository holds: tests/fixtures/hub_facts)
    "bert-base-uncased": _FILES, "bert-large-uncased": _FILES, "distilbert-base-uncased": _FILES,
    "sentence-transformers/all-MiniLM-L6-v2": _FILES,
    "google/bert_uncased_L-4_H-256_A-4": _BIN_FILES,
    "roberta-base": _BPE_FILES, "roberta-large": _BPE_FILES, "distilroberta-base": _BPE_FILES}
_SIZES = ("bert-base-uncased", "bert-large-uncased", "roberta-base", "roberta-large")
RELEASED = {  # the papers' released models -> their test vector, eval's default --pooler [SimCSE
    # simcse/tool.py: "unsup" in the name -> cls_before_pooler, else cls; DiffCSE README's commands
    # and tool.py since f724b2c (its issue #2): cls_before_pooler]. DiffCSE's file is its whole
    # training model, of which only the encoder, bert.* (roberta.*), is read (note_unused)
    **{f"princeton-nlp/unsup-simcse-{size}": "cls_before_pooler" for size in _SIZES},
    **{f"princeton-nlp/sup-simcse-{size}": "cls" for size in _SIZES},
    **{f"voidism/diffcse-{size}-{task}": "cls_before_pooler"
       for size in ("bert-base-uncased", "roberta-base") for task in ("sts", "trans")}}
KNOWN_MODELS |= {name: _BPE_BIN_FILES if "roberta" in name else _BIN_FILES for name in RELEASED}
_DATA = "datasets/princeton-nlp/datasets-for-simcse/resolve/main/"
KNOWN_DATA = {f: _DATA + f for f in ("wiki1m_for_simcse.txt", "nli_for_simcse.csv", "senteval.tar")}
DATA_ALIASES = {"wiki1m.txt": "wiki1m_for_simcse.txt"}  # the name the papers' READMEs use
HOW_TO_GET = {"--generator": " (or make one: python tests/tools/make_generator.py --help)"}
HUB_ERRORS = {  # X-Error-Code -> what it means [huggingface_hub hf_raise_for_status]
    "EntryNotFound": "no such file", "RepoNotFound": "no such repository, or a private one",
    "GatedRepo": "accept its terms on the hub, then `huggingface-cli download` it: its cache is "
                 "used from there"}
MAX_REDIRECTS = 10  # urllib's own limit [urllib.request.HTTPRedirectHandler.max_redirections]
LOW_SPEED = (1024, 60)  # bytes/s, seconds: slower for that long is cut [curl --speed-limit/-time]


def known_names():
    """The known model names, the released ones summed up: for a message or --help."""
    plain = [name for name in KNOWN_MODELS if name not in RELEASED]
    return ", ".join(plain) + ", princeton-nlp/{unsup,sup}-simcse-*, voidism/diffcse-*"


def default_pooler(name):
    """The test vector of a released model (RELEASED), else the raw [CLS] (unsupervised runs')."""
    return RELEASED.get(str(name), "cls_before_pooler")


def hub_cache():
    """Where huggingface_hub keeps its downloads [huggingface_hub constants.py]."""
    home = os.environ.get("HF_HOME") or \
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
    return Path(os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
                or Path(home) / "hub").expanduser()


def hub_snapshot(name):
    """The complete snapshot of `name` that the Hugging Face cache's refs/main names (else any
    complete one), or None: models--org--name/snapshots/<commit>/ [huggingface_hub]."""
    repo = hub_cache() / ("models--" + str(name).replace("/", "--"))  # no glob: '*' is itself
    ref = repo / "refs" / "main"
    snapshots = repo / "snapshots"
    named = ref.read_bytes().decode("ascii", "replace").strip() if ref.is_file() else ""
    commits = [named] if re.fullmatch(r"[0-9a-f]{40}", named) else []  # else: passed over
    commits += sorted(p.name for p in snapshots.iterdir()) if snapshots.is_dir() else []
    return next((snapshots / c for c in commits if c and not folder_problem(snapshots / c)), None)


def find_model(name_or_dir, flag="--model"):
    """(folder, files to download first): a local folder, else the Hugging Face cache, else our
    cache, else a known name's files. The checks and the loading both ask here: they agree."""
    folder = Path(name_or_dir).expanduser()
    if folder.is_dir():
        return folder, []
    cached = hub_snapshot(name_or_dir)
    if cached:
        return cached, []
    files = KNOWN_MODELS.get(str(name_or_dir))
    if files is None:
        raise UserError(f"{flag or 'the name'} {name_or_dir!r} is neither a folder nor a known "
                        f"name ({known_names()}); pass a Hugging Face model folder"
                        f"{HOW_TO_GET.get(flag, '')}")
    ours = CACHE / "models" / str(name_or_dir)
    missing = [f for f in files if not (ours / f).exists()]
    return ours, files if missing else []  # one missing: fetch all (each checked as it comes)


def resolve_model(name_or_dir, flag="--model"):
    """The model's folder (find_model), its files downloaded first if they are not there yet."""
    folder, to_download = find_model(name_or_dir, flag)
    for f in to_download:
        download(f"{HF_ENDPOINT}/{name_or_dir}/resolve/main/{f}", folder / f, flag=flag)
    return folder


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args):  # a 3xx comes back as it is: open_url follows it
        return None


def open_url(url, method="GET", headers=None, follow=lambda old, new: True):
    """-> (the answer, its address), redirects followed by one rule for the hub and the CDN: to
    http or https only (urllib's rule: never file: or data:), at most MAX_REDIRECTS, and only
    where follow(old, new). Nothing from a redirect refused was written."""
    opener = urllib.request.build_opener(_NoRedirect)
    for _ in range(MAX_REDIRECTS + 1):
        if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
            raise UserError(f"a download was redirected to {url[:60]!r}: only http and https are "
                            f"followed; nothing was saved (is HF_ENDPOINT right?)")
        try:
            r = opener.open(urllib.request.Request(url, headers=headers or {}, method=method),
                            timeout=LOW_SPEED[1])  # nothing new for that long: a cut
        except urllib.error.HTTPError as e:
            if not 300 <= e.code < 400:
                raise
            r = e
        new = redirect_of(url, r)
        if new is None or not follow(url, new):
            return r, url
        r.close()
        url = new
    raise UserError(f"a download was redirected more than {MAX_REDIRECTS} times (a loop), last to "
                    f"{url[:60]!r}; nothing was saved: try again later")


def redirect_of(url, answer):
    """Where a 3xx `answer` to `url` sends us (its Location), else None: the one redirect rule."""
    if 300 <= answer.status < 400 and "Location" in answer.headers:
        return urllib.parse.urljoin(url, answer.headers["Location"])
    return None


def same_host(old, new):
    return urllib.parse.urlsplit(old).netloc == urllib.parse.urlsplit(new).netloc


def header_int(headers, name):
    """A size header as a number, or None: ASCII digits only ('\u00b2'.isdigit(), not int())."""
    value = (headers.get(name) or "").strip()
    return int(value) if value.isascii() and value.isdigit() else None


def hub_answer(url):
    """HEAD url on the hub -> (where the bytes are, size or None, SHA-256 or None). A file in git:
    200, an ETag that is its git-SHA1 (no checksum of ours); a large (LFS/Xet) file: 302 to the CDN,
    its SHA-256 in X-Linked-Etag, its size in X-Linked-Size; the CDN's ETag is no SHA-256. A
    redirect on the hub (a renamed repository) is followed, the one to the CDN read: only the hub's
    own answer states them [huggingface_hub get_hf_file_metadata]."""
    r, url = open_url(url, "HEAD", follow=same_host)
    with r:
        h = r.headers
        where = redirect_of(url, r) or url
        sha256 = (h.get("X-Linked-Etag") or "").removeprefix("W/").strip('"')
        size = header_int(h, "X-Linked-Size")
        if size is None and r.status < 300:  # a 302's Content-Length is its own body's
            size = header_int(h, "Content-Length")
    return where, size, sha256 if re.fullmatch(r"[0-9a-f]{64}", sha256) else None


def download(url, dest, flag=None):
    """url -> dest through a .part file (fetch_checked). One writer at a time: the folder's lock,
    the others wait and use the finished file. A failed download leaves no empty folder."""
    dest = Path(dest)
    part = Path(f"{dest}.part")
    created = [p for p in dest.parents if not p.exists()]  # removed again if left empty
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # SIMCSE_CACHE a file, a read-only disk
        raise UserError(f"cannot make the folder {dest.parent} ({e.strerror}): SIMCSE_CACHE (now "
                        f"{CACHE}) must name a writable folder") from None
    waiting = f"{dest.name}: another process is downloading into {dest.parent}; waiting for it"
    lock, waited = hold_lock(dest.parent, waiting)
    try:
        if waited and dest.is_file():  # the other process finished it: checked as it came
            return dest
        for p in (dest, part):
            if os.path.lexists(p) and path_problem(p):  # a folder, a link loop: never written
                raise UserError(f"{p} {path_problem(p)}: move it away, then run again")
        fetch_checked(url, part, flag)
        os.replace(part, dest)
    finally:
        release_lock(lock)
        for p in created:
            with contextlib.suppress(OSError):
                p.rmdir()  # only if empty: a folder holding a .part or the file stays
    return dest


def fetch_checked(url, part, flag):
    """The hub's answer, then the bytes into part (resumed where they stopped), then the checks:
    the size and SHA-256 the hub states. Cut: the .part kept (the same command resumes it); more
    bytes than the stated size or the wrong SHA-256: deleted (no rerun could make it right)."""
    total = None  # the size the hub states, once asked
    try:
        where, total, sha256 = hub_answer(url)
        have = part.stat().st_size if part.exists() else 0
        if total is not None and have > total:  # can never match: start over
            part.unlink()
            have = 0
        if total is None or have != total:  # else the .part is whole already
            fetch(where, part, have, total)
        size = part.stat().st_size
        if total is not None and size > total:
            part.unlink()
            raise UserError(f"download of {url} sent {size} bytes where the hub states {total}; "
                            f"deleted it: run again later")
        if total is not None and size < total:
            raise OSError("short read")
    except urllib.error.HTTPError as e:
        if e.code == 416:  # the .part reaches the file's real end, short of the stated size
            part.unlink()
        code = e.headers.get("X-Error-Code")
        meaning = f": {HUB_ERRORS[code]}" if code in HUB_ERRORS else ""
        why = f" ({code}{meaning})" if code else ""
        raise UserError(f"download of {url} failed: HTTP {e.code} {e.reason}{why}") from None
    except urllib.error.URLError as e:
        how = f"pass its path with {flag}" if flag else f"put it at {part.with_suffix('')}"
        raise UserError(f"cannot download {url} ({e.reason}): you seem to be offline; fetch it "
                        f"where there is internet and {how}{HOW_TO_GET.get(flag, '')}") from None
    except (OSError, http.client.HTTPException) as e:  # reset, timed out, stalled or cut
        if getattr(e, "errno", None) in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            part.unlink(missing_ok=True)
            raise UserError(f"no room to write {part} ({e.strerror}): the disk is full; deleted "
                            f"the partial download: free space, then run again") from None
        size = part.stat().st_size if part.exists() else 0
        raise UserError(f"download of {url} was cut at {size} of {total or '?'} bytes "
                        f"({str(e)[:60] or type(e).__name__}); run the same command again to "
                        f"resume") from None
    if sha256 and sha256_file(part) != sha256:
        part.unlink()
        raise UserError(f"download of {url} is corrupt (SHA-256 mismatch); deleted it, run again")


def fetch(url, part, have, total):
    """GET url into part from byte `have` on (a Range request), with a progress line; the part
    appended to is the one measured under the lock (never created anew). Slower than LOW_SPEED:
    a TimeoutError; more than `total` bytes: stops reading."""
    response, _ = open_url(url, headers={"Range": f"bytes={have}-"} if have else {})
    resumed = response.status == 206  # else the server ignored the range: from the start
    if response.status != 200 and not resumed:  # a redirect without a Location
        raise http.client.HTTPException(f"HTTP {response.status} instead of the file")
    flags = os.O_WRONLY | os.O_APPEND if resumed else os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    with response, open(os.open(part, flags, 0o666), "wb") as f:
        done = os.fstat(f.fileno()).st_size
        if done != (have if resumed else 0):
            raise OSError(f"{part} changed while resuming it")
        length = header_int(response.headers, "Content-Length")  # None: chunked, or to the end
        total = total or (None if length is None else done + length)  # None: no size stated
        progress = Progress(part.name.removesuffix(".part"), "bytes")
        window = (time.time(), done)  # when the low-speed window began, the bytes then
        while chunk := response.read1(1 << 16):
            f.write(chunk)
            done += len(chunk)
            if total is not None:  # else read to the end [RFC 9112 §6.3]
                progress(done, max(total, done))
                if done > total:  # a size that lies: no more is read
                    break
            if time.time() - window[0] >= LOW_SPEED[1]:
                if done - window[1] < LOW_SPEED[0] * LOW_SPEED[1]:
                    raise TimeoutError(f"stalled: under {LOW_SPEED[0]} bytes/s for "
                                       f"{LOW_SPEED[1]} s")
                window = (time.time(), done)


def sha256_file(path):
    """The SHA-256 of a file, read in 1 MB pieces."""
    h = hashlib.sha256()
    with naming(path), open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def known_data(path):
    """The SimCSE file a bare name means (wiki1m.txt: wiki1m_for_simcse.txt), else None."""
    p = Path(path).expanduser()
    name = DATA_ALIASES.get(p.name, p.name)
    return name if name in KNOWN_DATA and p.parent == Path(".") else None


def resolve_data(path, flag="--data"):
    """A local file, else a known SimCSE file from our cache, downloaded once."""
    p = Path(path).expanduser()
    name = known_data(p)
    if p.exists() or name is None:
        return p
    cached = CACHE / "data" / name
    once = "" if cached.exists() else " (downloading it once)"
    print(f"note: no {path} here: using SimCSE's {name} from {cached.parent}{once}",
          file=sys.stderr)
    if not cached.exists():
        download(f"{HF_ENDPOINT}/{KNOWN_DATA[name]}", cached, flag=flag)
    return cached


def load_model(run, flag="--model", mlm_head=False):
    """Tokenizer and Bert.from_pretrained of the flag's model, on the CPU (--dropout applies to
    --model's). Rank 0 downloads it once, the others read what it wrote."""
    with rank0_first(f"the model of {flag}"):
        folder = resolve_model(getattr(run.cfg, flag[2:]), flag)
    dropout = run.cfg.dropout if flag == "--model" else None
    model = Bert.from_pretrained(folder, mlm_head, dropout, quiet=run.rank > 0)
    check_positions(model, run.cfg.max_len, flag=flag)  # --max_len against the model
    return Tokenizer.from_pretrained(folder), model


# --- SentEval's files: senteval.tar and the STS files ---------------------------------------------
# SentEval's files read as SentEval reads them; a missing, cut or unsafe one is one line.

SENTEVAL_TASKS = ("STS", "SICK",  # the STS table; then the transfer tasks [SentEval]
                  "CR", "MPQA", "MR", "MRPC", "SST", "SUBJ", "TREC")
SPLIT_FILES = {"STSBenchmark": {s: f"STS/STSBenchmark/sts-{s}.csv"
                                for s in ("train", "dev", "test")},
               "SICKRelatedness": {"train": "SICK/SICK_train.txt", "dev": "SICK/SICK_trial.txt",
                                   "test": "SICK/SICK_test_annotated.txt"}}


def download_senteval(dest=None, flag="--senteval"):
    """SimCSE's senteval.tar (once) -> dest/downstream/{STS,SICK,CR,...}: its members at the top
    (the official script untars it in SentEval/data/downstream) or under downstream/. A member
    that would land outside dest, or a link, refuses the archive."""
    dest = Path(dest or CACHE / "senteval")
    tar_path = CACHE / "data" / "senteval.tar"
    if not tar_path.is_file():  # a whole file: download() renames it into place at the end
        download(f"{HF_ENDPOINT}/{KNOWN_DATA['senteval.tar']}", tar_path, flag=flag)
    dest.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest, prefix=".unpacking-"))
    try:
        with tarfile.open(tar_path) as tar:
            for member in tar:
                unpack_task_file(tar, member, tmp)
        if path_problem(tmp / "STS", folder=True):
            raise UserError(f"{tar_path} holds no STS/ folder (at its top or under downstream/): "
                            f"not SimCSE's senteval.tar; delete it and run again")
        shutil.rmtree(dest / "downstream", ignore_errors=True)
        os.replace(tmp, dest / "downstream")
    except (OSError, tarfile.TarError) as e:
        raise UserError(f"cannot unpack {tar_path} ({type(e).__name__}: {e}); delete it and run "
                        f"again") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest / "downstream"


def unpack_task_file(tar, member, root):
    """A member of senteval.tar in a task folder we read -> root/TASK/..., the rest skipped."""
    parts = Path(member.name).parts
    refuse = f"{tar.name}: member {member.name!r} "
    if member.name.startswith("/") or ".." in parts:
        raise UserError(refuse + "would land outside its folder: refusing this archive")
    task = next((i for i, p in enumerate(parts)
                 if p in SENTEVAL_TASKS and (i == 0 or parts[i - 1] == "downstream")), None)
    if task is None or member.isdir():
        return
    if not member.isfile():
        raise UserError(refuse + "is a link or a device: refusing this archive")
    target = root.joinpath(*parts[task:])
    target.parent.mkdir(parents=True, exist_ok=True)
    with tar.extractfile(member) as src, open(target, "wb") as f:
        shutil.copyfileobj(src, f)


def resolve_senteval(path, mode="test"):
    """The given SentEval folder (or its downstream/), else ./SentEval/data/downstream or our
    cache, else a download."""
    if path:
        root = Path(path).expanduser()
        if (root / "downstream").is_dir():
            root = root / "downstream"
        check_senteval(root, mode)
        return root
    for root in (Path("SentEval/data/downstream"), CACHE / "senteval" / "downstream"):
        if root.is_dir():
            check_senteval(root, mode)
            return root
    print("no SentEval data given (--senteval): downloading SimCSE's senteval.tar once",
          file=sys.stderr)
    return download_senteval()


def scored(rows, a, b, y):  # a Spearman needs 2 pairs at least: else a traceback at the run's end
    if len(rows) < 2:
        raise ValueError(f"{len(rows)} scored pair(s); a correlation needs 2 at least")
    # a, b: sentence columns (SentEval splits on whitespace; its batcher re-joins with spaces)
    return ([" ".join(r[a].split()) for r in rows], [" ".join(r[b].split()) for r in rows],
            np.array([float(r[y]) for r in rows]))  # column y: the gold score


def load_sts_subset(root, year, subset):
    """(sentences A, B, gold) of one STS12-16 subset; pairs with an empty gold score dropped."""
    folder = Path(root) / "STS" / f"{year}-en-test"
    with malformed_file(folder / f"STS.{{input,gs}}.{subset}.txt"):  # one line naming it
        lines = read_utf8(folder / f"STS.input.{subset}.txt").splitlines()
        pairs = [r.split("\t") for r in lines]
        gold = read_utf8(folder / f"STS.gs.{subset}.txt").splitlines()
        if len(gold) != len(pairs):  # SentEval's not_empty_idx then fails: never score fewer
            raise ValueError(f"{len(pairs)} sentence pairs but {len(gold)} gold scores")
        rows = [(p[0], p[1], g) for p, g in zip(pairs, gold) if g != ""]  # [SentEval not_empty_idx]
        return scored(rows, 0, 1, 2)


def load_sts_split(root, task, split):
    """STS-B (score in column 4, sentences 5-6) or SICK-R (a header; sentences 1-2, score 3)."""
    path = Path(root) / SPLIT_FILES[task][split]
    with malformed_file(path):
        lines = read_utf8(path).splitlines()
        rows = [r.strip().split("\t") for r in (lines if task == "STSBenchmark" else lines[1:])]
        a, b, y = (5, 6, 4) if task == "STSBenchmark" else (1, 2, 3)
        return scored(rows, a, b, y)


def load_sts(root, mode="test"):
    """{task: {subset or split: (A, B, gold)}} for the tasks a mode reports."""
    tasks = {} if mode != "test" else {year: {s: load_sts_subset(root, year, s) for s in subsets}
                                       for year, subsets in STS_YEARS.items()}
    return {**tasks, **{task: {mode: load_sts_split(root, task, mode)} for task in SPLIT_FILES}}


def sts_files(mode):
    """Relative paths the evaluation reads in 'test' or 'dev' mode."""
    years = [f"STS/{y}-en-test/STS.{kind}.{s}.txt" for y, subsets in STS_YEARS.items()
             for s in subsets for kind in ("input", "gs")]
    return (years if mode == "test" else []) + [SPLIT_FILES[t][mode] for t in SPLIT_FILES]


def check_senteval(root, mode="test"):
    """A missing or incomplete SentEval folder -> one line: what is missing, how to get it."""
    fix = "run `python common.py download senteval` and use --senteval ~/.cache/simcse-min/senteval"
    if path_problem(root, folder=True):
        raise UserError(f"SentEval folder {root} {path_problem(root, folder=True)}; {fix}")
    files = TRANSFER_FILES if mode == "transfer" else sts_files(mode)
    missing = [f for f in files if not (Path(root) / f).is_file()]
    if missing:
        more = f" and {len(missing) - 4} more" if len(missing) > 4 else ""
        raise UserError(f"SentEval folder {root} is incomplete: missing {', '.join(missing[:4])}"
                        f"{more}; {fix}")


def run_senteval(cfg):
    """A training run's SentEval folder, its test files parsed now (a malformed one fails before
    training); None where the run reads no SentEval file: --dev_file with --test none [issue 55]."""
    if cfg.test == "none" and cfg.dev_file:
        return None
    with rank0_first("the SentEval data"):  # rank 0 downloads, the others read what it wrote
        root = resolve_senteval(cfg.senteval)
    if cfg.test != "none":
        load_sts(root, "test")
    return root


@contextlib.contextmanager
def malformed_file(path):
    """A cut or edited SentEval file (a short row, a score that is not a number) -> one line."""
    try:
        yield
    except (IndexError, ValueError) as e:
        raise UserError(f"SentEval file {path} is malformed ({type(e).__name__}: {str(e)[:80]}); "
                        f"get a fresh copy with `python common.py download senteval`") from None


# --- Devices, precision, input checks -------------------------------------------------------------
# Every flag and input checked before any work, one line naming the flag; no device swapped.

PRECISIONS = ("auto", "bf16", "fp16", "fp32")
SHARED_CHECKS = {  # flag -> its interval ('[' includes the bound, '(' excludes it)
    "seed": "[0, 4294967296)", "batch_size": "[2, inf)", "max_len": "[3, inf)", "lr": "(0, 1)",
    "epochs": "[1, inf)", "max_steps": "[0, inf)", "temp": "(0, inf)", "eval_every": "[1, inf)",
    "dropout": "[0, 1)", "save_every": "[0, inf)", "chunk_size": "[0, inf)",
    "mlm_weight": "[0, inf)", "hard_weight": "(-inf, inf)"}  # and Config.checks
WHY = {"seed": " (numpy's seed range)", "batch_size": " (a batch of one has no negatives)",
       "max_len": " ([CLS], one token, [SEP])", "max_steps": " (0: all epochs)",
       "save_every": " (0: only at the end and on a signal)", "chunk_size": " (0: the whole batch)"}
MAX_DATA_BYTES = 16 << 30  # [impl] read into memory whole: a bound (wiki1m is 120 MB)
PROJECT = Path(__file__).resolve().parent  # this project's folder: never an out_dir
NAME_MAX = 255  # bytes in one name of a path [POSIX limits.h; ext4, xfs, btrfs, tmpfs]


def resolve_device(name):
    """'auto' -> cuda, mps or cpu; a device asked for but absent is an error, never a fallback."""
    mps = bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
    available = {"cpu": True, "cuda": torch.cuda.is_available(), "mps": mps}
    name = next(d for d in ("cuda", "mps", "cpu") if available[d]) if name == "auto" else name
    if not available.get(name):  # a typo too: one line, never a fallback
        raise UserError(f"--device {name}: torch {torch.__version__} sees no such device here (of "
                        f"cpu, cuda, mps); use --device auto or cpu, or a torch built for your GPU")
    if name == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True  # fast fp32
    return torch.device(name)


def choose_precision(asked, device):
    """--precision -> (bf16, fp16 or fp32, why). auto: bf16 where the GPU computes it natively
    (Ampere on); fp16 with a loss scaler on older GPUs (T4, V100, P100), which emulate bf16 slowly
    or not at all (torch < 2.3) [official: --fp16]; fp32 off CUDA, as a CPU gains nothing."""
    if device.type != "cuda":
        return ("fp32", f"auto on {device.type}") if asked == "auto" else (asked, "asked for")
    gpu = torch.cuda.get_device_name(device)
    if torch.cuda.is_bf16_supported(including_emulation=False):
        return ("bf16", f"auto: {gpu} has native bf16") if asked == "auto" else (asked, "asked for")
    if asked == "bf16":
        raise UserError(f"--precision bf16: the {gpu} has no native bf16 (torch would emulate it, "
                        f"slowly, or fail); use --precision fp16 or auto")
    why = f"auto: the {gpu} has no native bf16, so fp16 with a loss scaler (the official recipe)"
    return ("fp16", why) if asked == "auto" else (asked, "asked for")


def check_compile(asked, device):
    """--compile on a GPU below compute capability 7.0 (P100, K80), which Triton cannot target,
    fails at the first step [torch._inductor GPUTooOldForTriton]: one line before any work."""
    major, minor = torch.cuda.get_device_capability(device) if device.type == "cuda" else (9, 0)
    if asked and (major, minor) < (7, 0):
        raise UserError(f"--compile: torch.compile's GPU code (Triton) needs compute capability "
                        f"7.0 or newer, the {torch.cuda.get_device_name(device)} has "
                        f"{major}.{minor}: leave --compile out")


def in_interval(value, interval):
    """value in '[lo, hi)'-style interval notation; NaN and infinity are in no interval."""
    left, lo, hi, right = re.fullmatch(r"([\[(])(\S+), (\S+)([\])])", interval).groups()
    lo, hi = float(lo), float(hi)
    return math.isfinite(value) and (lo < value or left == "[" and value == lo) and \
        (value < hi or right == "]" and value == hi)


def check_inputs(cfg, models, world_size=1):
    """Every flag, input path and out_dir, checked before any work starts: the first problem stops
    the run in one line naming its flag. `models`: the fields that hold models (DiffCSE: +1)."""
    checks = {**SHARED_CHECKS, **getattr(cfg, "checks", {})}
    for k, v in {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}.items():
        if k in checks and not in_interval(v, checks[k]):
            raise UserError(f"--{k} {v}: must be in {checks[k]}{WHY.get(k, '')}")
    for k, choices in {"precision": PRECISIONS, "test": ("sts", "none")}.items():
        if getattr(cfg, k) not in choices:
            raise UserError(f"--{k} {getattr(cfg, k)}: choose {', '.join(choices)}")
    if cfg.compile and cfg.chunk_size:  # measured on an H200: docs/large-batches.md
        raise UserError("--compile and --chunk_size: compiled chunks redraw dropout; leave one out")
    if cfg.batch_size % world_size:
        raise UserError(f"--batch_size {cfg.batch_size} is the global batch and must split evenly "
                        f"over {world_size} processes")
    check_file(cfg.data)
    if cfg.dev_file:
        check_file(cfg.dev_file, "--dev_file")
    for field in models:
        check_model(getattr(cfg, field), f"--{field}")
    inputs = [cfg.data, cfg.senteval, cfg.dev_file, *(getattr(cfg, f) for f in models)]
    check_out_dir(Path(cfg.out_dir), cfg.overwrite, inputs, cfg.resume)


def path_problem(path, folder=False):
    """'' if `path` is a regular file (or a folder), else what it is instead."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        return "is a symlink loop" if e.errno == errno.ELOOP else "does not exist"
    if folder:
        return "" if stat.S_ISDIR(mode) else "is a file, not a folder"
    if stat.S_ISDIR(mode):
        return "is a directory"
    return "" if stat.S_ISREG(mode) else "is not a regular file (a FIFO, device or socket)"


def check_file(path, flag="--data", whole=True):
    """The one rule of inputs [issue 63], before a file a flag names is read, hashed or locked:
    missing, a folder, a FIFO or device (whose read never ends), or too big to read whole (`whole`)
    is one line naming the flag (unreadable: main_guard's). A known SimCSE file: fetched later."""
    p = Path(path).expanduser()
    if known_data(p) and not os.path.lexists(p):
        return  # fetched when the run starts
    why = path_problem(p)
    if not why and whole and p.stat().st_size > MAX_DATA_BYTES:
        why = (f"is {p.stat().st_size / 2**30:.0f} GiB, over the {MAX_DATA_BYTES >> 30} GiB read "
               f"into memory; split it")
    if why:
        raise UserError(f"{flag} {path} {why}: name a readable file")


def check_model(name, flag):
    """A model that is neither a usable folder nor a name we can fetch (find_model): one line."""
    folder, to_download = find_model(name, flag)
    why = "" if to_download else folder_problem(folder)
    if why:
        raise UserError(f"{flag} {name} {why}")


def check_out_dir(out, overwrite, inputs=(), resumed=False):
    """The one check of a run's folder and every name a run writes there (OUTPUTS), before any work:
    never /, home or the project; a fresh run's needs --overwrite over another run or others' files;
    each name not an input nor another's (check_output), nor a link to a folder [issue 63]."""
    if Path(os.path.realpath(out)) in {Path("/"), Path.home().resolve(), PROJECT}:
        raise UserError(f"--out_dir {out} is /, the home folder or the project's folder, never a "
                        f"run's: pick a new folder, such as runs/NAME")
    left = temporaries([out / n for n in OUTPUTS])  # a killed write's, ours to clear
    ours = {n.split("/")[0] for n in OUTPUTS} | {p.name for p in left}
    others = sorted(p.name for p in out.iterdir() if p.name not in ours) if out.is_dir() else []
    whose, held = held_by(out)  # a model with weights a run never writes: said next, as others
    if held and not overwrite and not resumed and (whose == "training run" or not others):
        resume = f"--resume {out} to continue it, " if held == ["checkpoint.pt"] else ""
        raise UserError(f"--out_dir {out} already holds a {whose} ({', '.join(held)}); pass "
                        f"{resume}--overwrite to replace it, or another --out_dir")
    if others and not overwrite and not resumed:  # another model's folder: not ours to write in
        raise UserError(f"--out_dir {out} holds files that are not a run's ({', '.join(others[:3])}"
                        f"); pass --overwrite to write beside them, or pick another --out_dir")
    check_output("--out_dir", out, inputs, own=out)  # the model folder, say
    for name in OUTPUTS:
        place = out / name.split("/")[0]  # the file, or the folder it goes in (1_Pooling)
        folder = "/" in name
        if folder and place.is_symlink():  # a link at a file: replaced, never followed
            raise UserError(f"--out_dir {out}: {place.name} is a link, and a run never writes "
                            f"through one: move it away, or pick another --out_dir")
        if place.exists() and place.is_dir() != folder:
            what = "file, where the saved model needs a folder" if folder else \
                "folder, where the run writes a file"
            raise UserError(f"--out_dir {out}: {place.name} is a {what}: move it away, or pick "
                            f"another --out_dir")
        check_output("--out_dir", out / name, inputs, own=out)
    parent = next(p for p in (out, *out.absolute().parents) if os.path.lexists(p))
    if not (parent.is_dir() and os.access(parent, os.W_OK)):
        raise UserError(f"--out_dir {out}: {parent} is not a writable folder")


def check_name(flag, path):
    """A path with a name the file system cannot hold (over NAME_MAX bytes) or not UTF-8 (the log
    and the JSON files hold it): one line naming the flag before any work, not an OSError later."""
    for part in Path(path).expanduser().parts:
        raw = part.encode("utf-8", "surrogatepass")  # a byte not UTF-8 is a surrogate [PEP 383]
        if len(raw) > NAME_MAX or raw.decode("utf-8", "replace") != part:
            shown = str(path).encode("utf-8", "backslashreplace").decode()  # printable
            raise UserError(f"{flag} {shown} has a name of {len(raw)} bytes or not UTF-8; the "
                            f"file system holds {NAME_MAX} bytes of UTF-8: rename it")


def check_names(args, flags):
    """Every path flag's name (check_name), before any file or folder is looked at [issue 52]."""
    for flag in flags:
        check_name(f"--{flag}", getattr(args, flag, "") or "")


def check_output(flag, path, inputs=(), own=None, through=False):
    """The one rule of every output (--json, --out, out_dir's files; `own`: the run's folder), one
    line before any work [issue 40, 52]: never an input of the command, a file a run or a model
    folder holds (OUTPUTS), anything under SentEval; a link, FIFO or device is written through
    (`through`: a pipe, /dev/null) or refused, never replaced. -> True: write through it."""
    if not own:  # a run's names are ours, its folder's checked once (Run: check_names)
        check_name(flag, path)
    p = Path(path).expanduser().absolute()
    real = Path(os.path.realpath(p))  # links resolved; a loop stays as it is
    read = [Path(os.path.realpath(Path(i).expanduser())) for i in inputs if i]
    if any(real == i or real in [i / n for n in MODEL_FILES] for i in read):
        raise UserError(f"{flag}: {path} is one of this command's inputs (a model, the data or "
                        f"SentEval); writing there would destroy it: pick another {flag}")
    for folder in (f for f in real.parents if not own or f != Path(os.path.realpath(own))):
        if what := owner(folder, real.relative_to(folder)):
            raise UserError(f"{flag} {path}: {what} {folder}, not this command's to write: "
                            f"pick another {flag}")
    if os.path.lexists(p) and not own and not stat.S_ISREG(os.lstat(p).st_mode):
        kind = os.stat(p).st_mode if os.path.exists(p) else 0
        if through and (stat.S_ISFIFO(kind) or stat.S_ISCHR(kind)):
            return True
        raise UserError(f"{flag} {path} is not a regular file (a link, folder, FIFO or device), "
                        f"which would be replaced: name a new file")
    return False


def owner(folder, name):
    """Whose `name` in `folder` is: SentEval's, a run's or a model's (OUTPUTS), or '' (yours)."""
    if all((folder / d).is_dir() for d in ("STS", "SICK")) or (folder / "downstream/STS").is_dir():
        return "a file in SentEval's folder"  # downstream/ or the folder above [senteval.tar]
    if str(name) not in OUTPUTS:  # a file of the user's own there (eval.json): theirs to write
        return ""
    whose, held = held_by(folder)
    return f"a file of the {whose} in" if held else ""


RUN_FILES = ("results.json", "checkpoint.pt")  # a folder holding one is a training run's


def held_by(folder):
    """What makes `folder` one that only --overwrite replaces -> (whose, those files): a training
    run's (RUN_FILES: a run writes checkpoint.pt before its model, results.json before it removes
    checkpoint.pt), else a model's (config.json and its weights), else ('', [])."""
    run = [n for n in RUN_FILES if (folder / n).is_file()]
    if run:
        return "training run", run
    model = [n for n in ("config.json", "model.safetensors", "pytorch_model.bin")
             if (folder / n).is_file()]
    if "config.json" in model and len(model) > 1:
        return "model folder", model
    return "", []


def check_positions(model, max_len, extra=0, flag="--model"):
    """--max_len, + `extra` tokens a method adds (ESimCSE's repeats), against the positions of the
    flag's model (vocab.txt vs the embedding rows: in read_weights)."""
    if max_len + extra > model.cfg.max_tokens:
        more = f" + {extra} (the most tokens a view adds)" if extra else ""
        raise UserError(f"--max_len {max_len}{more} exceeds the {model.cfg.max_tokens} positions "
                        f"of the {flag[2:]} ({flag}): lower --max_len")


# --- Training data: text and CSV, tokenized once, a cache on disk ---------------------------------
# Training data read as UTF-8 text or CSV, streamed into 4-byte ids once; a cache keyed by content.

MAX_SENTENCE_CHARS = 10_000  # [impl] longer ones are cut: 512 tokens fit ~10x over, and a stray
# megabyte-long line (a file without newlines) would take minutes; training keeps max_len anyway
TOKENIZE_CHUNK = 10_000  # rows tokenized at a time, in a worker or not
TOKENIZE_POOL_BYTES = 8 << 20  # [impl] a smaller file in this process: the pool's start-up and
# its workers' empty word caches outweigh the second core there [docs/speed.md: 5 % on 1.3 MB]
TOKENIZING = {}  # this process's (or worker's) tokenizer and max_len: its word cache lives on


def read_lines(path):
    """Non-blank lines of a UTF-8 text file, stripped (tests and tools)."""
    return [row[0] for row in sentence_rows(path, text_lines(path))]


def text_lines(path, progress=None, read=None):
    """A UTF-8 file's lines, streamed (1M lines: the text is never whole in memory [issue 54]):
    each ends at \\n, \\r or \\r\\n, as in StringIO(newline=""); a byte-order mark dropped; a bad
    byte: read_utf8's one-line error. progress(MB read, MB in all), every 10,000 lines; `read`, a
    hashlib object, takes the bytes as they are read."""
    path = Path(path).expanduser()  # checked by the command (check_file)
    size = max(path.stat().st_size // 10**6, 1)
    try:
        with naming(path), open(path, encoding="utf-8", newline="") as f:
            for i, line in enumerate(f):
                if read:  # UTF-8 decoded with no newline translation: encoded, the same bytes
                    read.update(line.encode())
                if i == 0:
                    line = line.removeprefix("\ufeff")
                if progress and i % 10_000 == 0:
                    progress(min(f.buffer.tell() // 10**6, size - 1), size)  # done: below
                yield line
    except UnicodeDecodeError:
        read_utf8(path)  # raises the error in one line: where the first bad byte is
        raise
    if progress:
        progress(size, size)


def training_rows(path, progress=None, read=None):
    """Sentences (one a line), or CSV rows (sentence, positive[, hard negative]) for supervised
    SimCSE, streamed: tuples of 1-3 strings, each cut to MAX_SENTENCE_CHARS (said once, at the end,
    not an error). `read`: see text_lines."""
    if Path(path).suffix.lower() == ".tsv":  # its tabs would join a pair into one "sentence"
        raise UserError(f"{path}: a .tsv is not read; sentence pairs go in a .csv (sent0,sent1"
                        f"[,hard_neg]), else one sentence a line in a .txt")
    rows_of = csv_rows if Path(path).suffix.lower() == ".csv" else sentence_rows
    rows = rows_of(path, text_lines(path, progress, read))
    cut = 0
    for row in rows:
        cut += sum(len(s) > MAX_SENTENCE_CHARS for s in row)
        yield tuple(s[:MAX_SENTENCE_CHARS] for s in row)
    if cut:
        print(f"note: {cut} sentence(s) in {path} longer than {MAX_SENTENCE_CHARS:,} characters "
              f"were cut to that length", file=sys.stderr)


def sentence_rows(path, lines):
    """Non-blank lines, stripped, as 1-tuples (a line's \\v, \\f, \\x1c-\\x1e, \\x85, \\u2028 and
    \\u2029 end one too, as in str.splitlines)."""
    found = False
    for piece in lines:
        for line in piece.splitlines():
            sentence = line.strip()
            if sentence:
                found = True
                yield (sentence,)
    if not found:
        raise UserError(f"data file {path} holds no sentences")


def csv_rows(path, lines):
    """CSV rows of 2 or 3 stripped cells: quoted commas, quotes and newlines; blank rows skipped;
    a header sent0,sent1 or sentence,positive skipped [official nli_for_simcse.csv: sent0,sent1,
    hard_neg]."""
    import csv
    bad = (f"{path}: a supervised CSV needs 2 or 3 columns on every row (sentence, positive"
           f"[, hard negative])")
    width = None  # the first row's (after a header: 0 until the next row), every row's
    for row in csv.reader(lines):
        row = tuple(c.strip() for c in row)
        if not any(row):
            continue
        header = [c.lower() for c in row][:2] in (["sent0", "sent1"], ["sentence", "positive"])
        if width is None and header:
            width = 0
            continue
        if not width:
            width = len(row)
        if len(row) != width or width not in (2, 3):
            raise UserError(bad)
        yield row
    if not width:
        raise UserError(bad)


def start_tokenizing(tok, max_len):
    """A tokenizing worker's start: Ctrl-C is the parent's, SIGTERM ends it: no traceback each.
    Both were blocked while it forked (tokenize_rows); one sent since arrives now."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    mask_stops(signal.SIG_UNBLOCK)
    TOKENIZING.update(tok=tok, max_len=max_len)


def mask_stops(how):
    """Block or unblock Ctrl-C and SIGTERM in this thread (POSIX; elsewhere nothing)."""
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(how, {signal.SIGINT, signal.SIGTERM})


def tokenize_chunk(rows):
    """Rows of C sentences -> (ids [T] int32, lengths [R', C] int64, rows skipped): a row with a
    sentence that holds no token once cleaned (only [CLS] [SEP]) is skipped."""
    tok = TOKENIZING["tok"]
    ids = [tok.encode(s, TOKENIZING["max_len"]) for row in rows for s in row]
    lengths = np.fromiter(map(len, ids), np.int64, len(ids)).reshape(len(rows), -1)  # [R, C]
    keep = (lengths > 2).all(1)  # [R]
    kept = itertools.compress(ids, np.repeat(keep, lengths.shape[1]))
    flat = np.fromiter(itertools.chain.from_iterable(kept), np.int32, int(lengths[keep].sum()))
    return flat, lengths[keep], int((~keep).sum())


def tokenize_rows(tok, rows, max_len, workers):
    """Rows -> (ids [T] int32, lengths [N, C] int64, rows skipped), TOKENIZE_CHUNK rows at a time:
    only the ids are kept, 4 bytes a token (id lists: ~60 [issue 54]). With workers > 1, chunks go
    to a process pool a wave at a time (a pool's map would read the whole file ahead)."""
    chunks = iter(lambda: list(itertools.islice(rows, TOKENIZE_CHUNK)), [])
    before = signal.signal(signal.SIGTERM, signal.default_int_handler)  # as Ctrl-C: one line
    try:
        if workers > 1:
            # blocked while the workers fork: one arriving then met a worker not yet started,
            # with this process's handler, and printed its traceback
            mask_stops(signal.SIG_BLOCK)
            with multiprocessing.Pool(workers, start_tokenizing, (tok, max_len)) as pool:
                mask_stops(signal.SIG_UNBLOCK)  # one pending: raised here, the pool then ended
                parts = []
                while wave := list(itertools.islice(chunks, 2 * workers)):
                    parts += pool.map(tokenize_chunk, wave)
        else:
            TOKENIZING.update(tok=tok, max_len=max_len)
            parts = list(map(tokenize_chunk, chunks))
    finally:
        mask_stops(signal.SIG_UNBLOCK)
        signal.signal(signal.SIGTERM, before)
    flat, lengths, skipped = zip(*parts)
    return np.concatenate(flat), np.concatenate(lengths), sum(skipped)


class TokenizedRows:
    """Rows of C id lists in one flat int32 array + offsets (1M sentences: ~130 MB, not ~1 GB)."""

    def __init__(self, flat, offsets, cols, sha256):
        self.flat, self.offsets, self.cols = flat, offsets, cols  # [T] int32, [N*C + 1] int64
        self.sha256 = sha256  # of the file they come from

    def __len__(self):
        return (len(self.offsets) - 1) // self.cols

    def __getitem__(self, i):
        o, c = self.offsets, self.cols
        return tuple(self.flat[o[i * c + j]:o[i * c + j + 1]].tolist() for j in range(c))


def tokenizer_sha256(tok):
    """What the token ids depend on: tokens and their ids, merges, lower-casing, accents."""
    return hashlib.sha256("\n".join([*map(repr, tok.vocab.items()),  # the ids too [issue 27]
                                     *map(" ".join, getattr(tok, "merges", []))])
                          .encode() + bytes([tok.lower, tok.strip_accents])).hexdigest()


def tokenize_file(tok, path, max_len):
    """A training file tokenized once, cached on disk by its content, the vocabulary and max_len (a
    repeat run's set-up: 2.2x as fast [docs/speed.md]) -> (TokenizedRows, seconds, cache hit?)."""
    start = time.time()
    path = Path(path)  # checked by the command (check_file): a FIFO would hang the hash
    digest = sha256_file(path)
    key = f"{digest} {path.suffix} {tokenizer_sha256(tok)} {max_len}"
    cached = CACHE / "tokens" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.npz"
    try:
        if cached.exists():
            with np.load(cached) as z:  # no pickles: allow_pickle is off
                data = TokenizedRows(z["flat"], z["offsets"], int(z["cols"]), digest)
            o, ids = data.offsets, data.flat
            if not (data.cols in (1, 2, 3) and (len(o) - 1) % data.cols == 0 and o[0] == 0 and
                    o[-1] == len(ids) and (np.diff(o) >= 0).all() and (ids < len(tok.vocab)).all()
                    and (ids >= 0).all()):
                raise ValueError("inconsistent arrays")
            return data, time.time() - start, True
    except Exception as e:  # a cut or edited cache file: not fatal
        print(f"note: the token cache {cached} is unreadable ({type(e).__name__}): tokenizing "
              f"again", file=sys.stderr)
    read = hashlib.sha256()  # of the bytes tokenized, as they are read: the file may change
    rows = training_rows(path, Progress("corpus", "MB tokenized"), read)
    workers = 1
    if path.stat().st_size >= TOKENIZE_POOL_BYTES:  # the cores at work [issue 54, docs/speed.md]
        workers = min(os.cpu_count() or 1, 4)  # each holds its own word cache
    flat, lengths, skipped = tokenize_rows(tok, rows, max_len, workers)
    if skipped:
        print(f"note: {skipped} row(s) of {path} hold no token once cleaned (only control or "
              f"zero-width characters): skipped", file=sys.stderr)
    offsets = np.concatenate([[0], np.cumsum(lengths.reshape(-1))])  # [N*C + 1]
    data = TokenizedRows(flat, offsets, lengths.shape[1], read.hexdigest())
    if read.hexdigest() == digest:  # else changed since hashed: not the tokens of `key`
        with contextlib.suppress(OSError):  # a read-only cache: the next run tokenizes again
            cached.parent.mkdir(parents=True, exist_ok=True)
            with atomic_write(cached, "wb") as f:
                np.savez(f, flat=data.flat, offsets=data.offsets, cols=data.cols)
    return data, time.time() - start, False


# --- out_dir: a lock, exclusive creation, a log never written through a link ----------------------
# Two runs never share an out_dir; nothing is written there before the inputs pass.

def hold_lock(folder, waiting=None):
    """An exclusive flock on the folder itself, held until release_lock or the process ends (a
    crash leaves no stale lock) -> (its descriptor, whether it was waited for). Held elsewhere:
    BlockingIOError, or with `waiting` that line said, then the wait. Not POSIX: (None, False)."""
    try:
        import fcntl
    except ImportError:
        return None, False
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd, False
    except BlockingIOError:
        if waiting is None:
            os.close(fd)
            raise
    print(waiting, file=sys.stderr, flush=True)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd, True


def release_lock(fd):
    if fd is not None:
        os.close(fd)


def lock_folder(out, flag="--out_dir"):
    """out_dir's lock, taken before out_dir is checked (two runs started together cannot both
    pass) -> its descriptor; None: no folder yet (open_out_dir), not POSIX, or a rank above 0."""
    if int(torchrun_env().get("RANK", 0)) > 0 or not out.is_dir():
        return None
    try:
        return hold_lock(out)[0]
    except BlockingIOError:
        raise UserError(f"{flag} {out} is in use by another run or encode that is still going: "
                        f"wait for it, or pick another {flag}") from None


def out_dir_of(cfg, method):
    """The run's folder: --resume's (or its checkpoint.pt's), else --out_dir, else runs/METHOD."""
    if cfg.resume:
        out = Path(cfg.resume).expanduser()
        return out.parent if out.name == "checkpoint.pt" else out
    return Path(cfg.out_dir or f"runs/{method}").expanduser()


def open_out_dir(run):
    """Make out_dir if it was absent (exclusively, then lock it), clear a killed write's temporary
    files (--overwrite: the old run's outputs), start log.txt -> (log.txt, out_dir's lock)."""
    if run.rank > 0:
        return None, None
    lock = run.lock  # taken in Run.__init__ if the folder was there
    if not run.out_existed:
        run.out.parent.mkdir(parents=True, exist_ok=True)
        try:
            run.out.mkdir()  # atomic: of two runs that found no folder, one gets here
        except FileExistsError:
            raise UserError(f"--out_dir {run.out} appeared after this run checked it (another "
                            f"run starting?): pick another --out_dir") from None
        lock = lock_folder(run.out)
    overwritten = [run.out / n for n in OUTPUTS if run.cfg.overwrite]  # checked: no link there
    for path in temporaries([run.out / n for n in OUTPUTS]) + overwritten:
        path.unlink(missing_ok=True)  # a link at a file's name is removed, never followed
    log = run.out / "log.txt"
    if not run.resumed:
        log.unlink(missing_ok=True)  # a link is removed, never followed
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)  # a link:
    log_file = open(os.open(log, flags, 0o666), "a", encoding="utf-8")  # ELOOP, one line
    log_file.write(run.log_file.getvalue())  # the lines logged so far
    log_file.flush()
    return log_file, lock


# --- Resumable runs: checkpoint.pt, Ctrl-C and SIGTERM --------------------------------------------
# A resumed run continues as the uninterrupted one would; a signal stops it with a checkpoint.

def read_resumed_run(cfg, method):
    """--resume DIR -> DIR/checkpoint.pt, its configuration copied into cfg (a flag given now that
    contradicts it is an error); None without --resume."""
    if not cfg.resume:
        return None
    if cfg.overwrite:
        raise UserError("--resume continues a run and --overwrite replaces one: pass just one")
    out = out_dir_of(cfg, method)
    if cfg.out_dir and Path(cfg.out_dir).expanduser().absolute() != out.absolute():
        raise UserError(f"--out_dir {cfg.out_dir}: a resumed run stays in its folder {out}; "
                        f"leave --out_dir out")
    if (out / "results.json").exists():
        raise RunFinished(f"the run in {out} has finished (results.json is there): nothing to do")
    ckpt = load_checkpoint(out / "checkpoint.pt")
    if ckpt.get("method") != method:
        raise UserError(f"--resume {cfg.resume} holds a {ckpt.get('method')} run, not {method}")
    for f in dataclasses.fields(cfg):  # device, precision, SentEval folder, save_every may change
        given = getattr(cfg, f.name)
        saved = ckpt["config"].get(f.name, f.default)
        if type(saved) is not type(f.default) and {type(saved), type(f.default)} != {int, float}:
            raise CheckpointError(f"{out / 'checkpoint.pt'}: its config has {f.name}={saved!r}, "
                                  f"not a {type(f.default).__name__}")
        typed = given != f.default or f.name in getattr(cfg, "typed", ())  # [issue 52: --test]
        if f.name in ("resume", "overwrite", "out_dir") or (
                f.name in ("device", "precision", "senteval", "save_every") and typed):
            continue
        if typed and given != saved:
            raise UserError(f"--{f.name} {given} contradicts the resumed run's {saved}: a resumed "
                            f"run keeps its configuration (leave the flag out)")
        setattr(cfg, f.name, saved)
    return ckpt


def load_checkpoint(path):
    """checkpoint.pt as saved by save_checkpoint; never runs pickled code (weights_only)."""
    if not path.is_file():
        raise CheckpointError(f"--resume: there is no checkpoint {path}: name the folder of a "
                              f"run that saved one")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated, corrupt, or holding anything but tensors and plain data
        raise CheckpointError(f"{path} is not a readable checkpoint ({type(e).__name__})") from None
    if not (isinstance(ckpt, dict) and isinstance(ckpt.get("config"), dict)):
        raise CheckpointError(f"{path} is not a checkpoint of this program")
    if ckpt.get("format") != 6:  # 6: the dev file's SHA-256 too
        raise CheckpointError(f"{path} was written by an older simcse-min (format "
                              f"{ckpt.get('format')!r}); start the run again")
    return ckpt


def state_of(obj):
    """A checkpointed thing's state; a dict (the best score, step, state) copied, a deque listed."""
    if isinstance(obj, dict):
        return dict(obj)
    for get in ("state_dict", "get_state", "getstate"):  # torch, torch.Generator, random.Random
        if hasattr(obj, get):
            return getattr(obj, get)()
    return list(obj)


def restore_state(obj, state, device, model, seed):
    """The inverse of state_of, in place -> '', or a note on what could not be restored (a masking
    generator saved on another kind of device: seeded from `seed`). Misfits are a ValueError."""
    if isinstance(obj, torch.Generator) and state.shape != obj.get_state().shape:
        obj.manual_seed(seed)  # deterministic: the same resume draws the same
        return f"the generator state saved is not a {obj.device.type} one: seeded from {seed}"
    fused = [g.get("fused") for g in getattr(obj, "param_groups", [])]  # this device's choice
    for put in ("load_state_dict", "set_state", "setstate", "update"):
        if hasattr(obj, put):
            getattr(obj, put)(state)
            break
    else:  # ESimCSE's queue of [H] sentence vectors
        if not all(t.shape == (model.cfg.hidden_size,) for t in state):
            raise ValueError("a queue entry is not a vector of the model's width")
        obj.clear()
        obj.extend(t.to(device) for t in state)
    for group, f in zip(getattr(obj, "param_groups", []), fused):
        group["fused"] = f  # not the saving device's: a CPU checkpoint keeps fused AdamW on CUDA
    for p, values in getattr(obj, "state", {}).items():  # an optimizer: moments shaped as params
        if any(torch.is_tensor(v) and v.dim() and v.shape != p.shape for v in values.values()):
            raise ValueError("optimizer moments that do not fit the parameters")
    return ""


def rng_states():
    """torch's and every CUDA device's generator state (dropout draws from them; Python's and
    numpy's are never drawn from during training: the data order and views have their own)."""
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def set_rng_states(states, device, seed):
    """The inverse of rng_states -> '' or a note: a GPU with no saved state (saved on the CPU or
    on fewer GPUs) draws from `seed` (the same resume draws the same, a new run would not)."""
    torch.set_rng_state(states["torch"])
    for i, state in enumerate(states["cuda"][:torch.cuda.device_count()]):  # 0 without CUDA
        torch.cuda.set_rng_state(state, i)
    if device.type != "cuda":
        return ""
    index = torch.cuda.current_device() if device.index is None else device.index
    if index < len(states["cuda"]):
        return ""
    torch.cuda.manual_seed(seed)
    return (f"{len(states['cuda'])} GPU generator state(s) saved, none for {device}: its dropout "
            f"is drawn from seed {seed}")


def restore_checkpoint(run, checkpointed):
    """Every object in `checkpointed` and the RNGs as they were after the checkpoint's step -> (that
    step, its stats, the histories up to it)."""
    ckpt = run.resumed
    path = run.out / "checkpoint.pt"
    started = {"data_sha256": f"the data file {run.cfg.data}",  # the files the run started on
               "tokenizer_sha256": f"the tokenizer of {run.cfg.model} (vocabulary, ids, merges)",
               "dev_sha256": f"the --dev_file {run.cfg.dev_file}"}  # the pairs that pick the best
    for key, what in started.items():
        if ckpt.get(key) != getattr(run, key):
            raise UserError(f"--resume {run.out}: {what} changed since the run started (its "
                            f"SHA-256 differs); resume with the one it was started on")
    seed = run.cfg.seed + 1000 * ckpt.get("step", 0)  # for what must be reseeded
    was = ckpt.get("device")
    notes = [f"saved on {was}, continued on {run.device.type}: the arithmetic and random draws "
             f"differ from an uninterrupted run's"] if was != run.device.type else []
    try:  # every value checked here, before any training: a bad one is one line, not a traceback
        for name, obj in checkpointed.items():
            if obj is not None:
                notes.append(restore_state(obj, ckpt["objects"][name], run.device,
                                           checkpointed["model"], seed))
        if ckpt["objects"]["amp"]["name"] != run.amp.name:
            notes.append(f"saved in {ckpt['objects']['amp']['name']}, continued in {run.amp.name}")
        best = checkpointed["best"]
        if not (type(ckpt["step"]) is int and 0 < ckpt["step"] <= run.total and
                type(best["dev"]) is float and type(best["step"]) is int and
                0 <= best["step"] <= ckpt["step"] and json.dumps(ckpt["histories"]) and
                all(type(v) is float for v in ckpt["stats"].values())):
            raise ValueError("a step, the best score or a history is out of range")
        shapes = {k: (v.shape, v.dtype) for k, v in checkpointed["model"].state_dict().items()}
        if best["state"] is not None and {k: (v.shape, v.dtype)
                                          for k, v in best["state"].items()} != shapes:
            raise ValueError("the best state does not fit the model")
        best["state"] = best["state"] and {k: v.to(run.device) for k, v in best["state"].items()}
        dev_history, stats_history, align_uniform = ckpt["histories"]
        notes.append(set_rng_states(ckpt["rng"], run.device, seed))  # last: nothing after it draws
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as e:
        raise CheckpointError(f"{path} does not fit this run ({type(e).__name__}: "
                              f"{str(e).splitlines()[0][:200] if str(e) else ''})") from None
    if run.rank > 0:  # the checkpoint holds rank 0's RNG states: the others draw their own masks
        torch.manual_seed(run.cfg.seed + run.rank + 1000 * ckpt["step"])
    run.log(f"resumed from {path} at step {ckpt['step']}/{run.total} (best {best['dev']:.2f} @ "
            f"{best['step']})")
    for note in filter(None, notes):
        run.log(f"note: {note}")
    return ckpt["step"], ckpt.get("stats", {}), (dev_history, stats_history, align_uniform)


CAUGHT = []  # the signals catch_signals caught during main_guard's command: it reads them


# --- The run: the operations a train() calls, its log lines ---------------------------------------
# One object holds a run's life; its log shows every wait and reads the GPU only when it prints.

PROGRESS_EVERY = 10.0  # seconds between progress lines in a log (not a terminal)
TEST_SENTENCES = 26_083  # the distinct sentences of the 7 STS test sets, each encoded once


class Progress:
    """progress(done, total) -> a line on stderr: in place on a terminal (erased at the end: what
    follows says it), else one every PROGRESS_EVERY seconds (a log, and its last); rank 0 only."""

    def __init__(self, what, unit="sentences encoded"):
        self.what, self.unit = what, unit  # "corpus", "sentences tokenized"
        self.start = self.shown = time.time()  # shown: when the last line was
        self.tty = sys.stderr.isatty()

    def __call__(self, done, total):
        now = time.time()
        last = done >= total
        due = now - self.shown >= (0.5 if self.tty else PROGRESS_EVERY)
        if world()[0] > 0 or not (last or due):
            return
        spent = now - self.start
        long = self.shown > self.start  # a line was shown: the last one is shown too
        eta = "done" if last else f"eta {spent / max(done, 1) * (total - done):.0f} s"
        line = f"{self.what}: {done:,}/{total:,} {self.unit} | {spent:.0f} s | {eta}"
        self.shown = now
        if self.tty:
            print("\r" + (line if not last else "") + "\033[K", end="", file=sys.stderr, flush=True)
        elif not last or long:
            print(line, file=sys.stderr, flush=True)


class LossWatch:
    """A non-finite loss stops the run (exit status 3), keeping the best model so far. Its first
    step is noted on the device, read every 10 steps and before an evaluation or save [issue 30]."""

    def __init__(self):
        self.first, self.value = torch.tensor(0), torch.tensor(0.0)  # the first bad step; its loss

    def note(self, loss, step):  # on the loss's device (a 0-dim CPU tensor joins it): no sync
        bad = (self.first == 0) & ~torch.isfinite(loss.detach())  # [] bool
        self.first = torch.where(bad, step, self.first)
        self.value = torch.where(bad, loss.detach().float(), self.value)

    def stopped(self, step, read):  # read: an evaluation or save comes next -> "" or why
        if not (read or step % 10 == 0) or not int(self.first):
            return ""
        return (f"the loss became {self.value.item()} at step {int(self.first)}: stopping "
                f"(lower --lr?)")


def skipped_steps(opt, sched):
    """The steps fp16 skipped because a gradient overflowed: the schedule counts every step,
    AdamW only those it took. Read when logged, never per step: no host sync [issue 30]."""
    taken = opt.state.get(opt.param_groups[0]["params"][0], {}).get("step", 0)
    return sched.last_epoch - int(taken)  # the first parameter: the word embeddings, always used


def format_stats(run, stats):  # "loss 0.1234 | rtd 0.5678"; no training yet: "loss -"
    """fp16 adds "| skipped 2": the steps skipped so far because a gradient overflowed."""
    text = " | ".join(f"{k} {float(v):.4f}" for k, v in stats.items()) or "loss -"
    fp16 = run.amp.scaler.is_enabled()
    return text + (f" | skipped {skipped_steps(run.opt, run.sched)}" if fp16 else "")


def check_generator(run, stats):
    """DiffCSE's first step: more real tokens replaced than masked means a weak generator (a
    pretrained masked LM copies what it sees [DiffCSE §4.1]), and RTD learns little [issue 55]."""
    masked = getattr(run.cfg, "mask_ratio", None)
    if masked is None or "replaced" not in stats:  # another method; or a resumed last step
        return
    replaced = float(stats["replaced"])  # one host sync, once
    if replaced > masked:
        run.log(f"warning: the generator replaced {replaced:.2f} of the real tokens, more than the "
                f"{masked} masked: a weak one (tests/tools/make_generator.py: train it longer)")


def seconds_left(run, step, per_step):
    """The seconds after `step`: the steps at `per_step`, the evaluations at their mean so far."""
    every = run.cfg.eval_every  # dev at its multiples and the last step; then the test table
    evals = sum(s % every == 0 or s == run.total for s in range(step + 1, run.total + 1))
    table = TEST_SENTENCES / (2 * len(run.dev_pairs[0])) if run.cfg.test == "sts" else 0
    each = sum(run.eval_times) / max(len(run.eval_times), 1)
    return (run.total - step) * per_step + each * (evals + table)


class Run:
    """A training run's operations, which train() calls by name; the loop stays in train(). Run
    owns its state: each attribute is set in __init__ first, then by its methods alone."""

    def __init__(self, cfg, script, models=("model",)):
        self.cfg = cfg
        self.method = method = Path(script).stem.removesuffix("_min")  # simcse, ..., diffcse
        self.lock = None  # out_dir's, once locked
        self.log_file = io.StringIO()  # log.txt once start() opens it; till then, the log here
        self.old_handlers = {}  # catch_signals: the handlers it replaced
        self.data_sha256 = self.tokenizer_sha256 = None  # load_data: for --resume
        self.pooler = "cls_before_pooler"  # the test vector; load_data: supervised, "cls"
        self.total = self.opt = self.sched = None  # start(): the steps; skipped_steps reads these
        self.signal = self.signals = 0  # the signal caught (its number); how many so far
        self.saving, self.evaluating = False, None  # a checkpoint being written; an evaluation's
        self.watch = LossWatch()  # a non-finite loss, noted on the device
        self.stopped = ""  # why the run stopped early: a non-finite loss
        check_names(cfg, ["out_dir", "resume", "data", "dev_file", "senteval", *models])
        self.out = out_dir_of(cfg, method)
        self.out_existed = self.out.is_dir()
        self.lock = lock_folder(self.out)  # before any check
        self.resumed = read_resumed_run(cfg, method)  # --resume: the checkpoint; its cfg into cfg
        cfg.out_dir = str(self.out)
        self.device = init_distributed(resolve_device(cfg.device))  # under torchrun: this rank's
        self.rank, self.world_size = world()
        check_inputs(cfg, models, self.world_size)  # the first bad flag or input: one line
        check_compile(cfg.compile, self.device)
        torch.manual_seed(cfg.seed + self.rank)  # dropout; data order and views have their own RNGs
        self.first_step = 0  # this process's first step (--resume: the checkpoint's)
        procs = f" x {self.world_size} processes" if self.world_size > 1 else ""
        self.log(f"{method} | {script} sha256 {sha256_file(script)[:16]} | torch "
                 f"{torch.__version__} | {self.device}{procs}")
        self.log("config " + json.dumps(dataclasses.asdict(cfg)))
        precision, why = choose_precision(cfg.precision, self.device)
        self.amp = MixedPrecision(precision, self.device)
        self.log(f"precision {precision}: {why}")
        self.senteval = run_senteval(cfg)  # None: --dev_file and --test none read none
        # the pairs that pick the best step (sentences A, B, gold); --dev_file's SHA-256: --resume
        self.dev_name = cfg.dev_file or "STS-B dev"
        self.dev_sha256 = cfg.dev_file and sha256_file(Path(cfg.dev_file).expanduser())
        if cfg.dev_file:
            self.dev_pairs = read_sts_pairs(cfg.dev_file, "--dev_file")
        else:
            self.dev_pairs = load_sts(self.senteval, "dev")["STSBenchmark"]["dev"]
        if not (self.dev_pairs[2] > POSITIVE_GOLD).any():  # another scale than STS's 0-5
            self.log(f"note: no pair of {self.dev_name} scores above {POSITIVE_GOLD:g}, what "
                     f"alignment takes for a positive on STS's 0-5 scale: its align is nan")
        self.dev_history, self.stats_history, self.align_uniform, self.eval_times = [], [], [], []
        self.started = self.last_print = self.clock = time.time()

    def log(self, msg):
        """Print, and append to out_dir/log.txt (held back until start() opens out_dir). Rank 0."""
        if self.rank == 0:
            print(msg, flush=True)
            self.log_file.write(msg + "\n")
            self.log_file.flush()

    load_model = load_model  # Tokenizer and Bert of --model (or --generator), on the CPU

    def load_data(self, tok, one_column=False):
        """The training file, tokenized once ([CLS] and [SEP] in max_len) and cached on disk; the
        SHA-256s a --resume compares; the test vector's pooler: supervised, the MLP's [official]."""
        with rank0_first("the training data, tokenized"):  # rank 0 writes the token cache
            data, seconds, hit = tokenize_file(tok, resolve_data(self.cfg.data), self.cfg.max_len)
        if one_column and data.cols != 1:
            raise UserError(f"{self.cfg.data} has {data.cols} columns: {self.method} is "
                            f"unsupervised, one sentence a line (supervised: simcse_min.py)")
        self.log(f"data {self.cfg.data}: {len(data)} rows x {data.cols} column(s), "
                 + ("read from the token cache" if hit else "tokenized") + f" in {seconds:.1f}s")
        self.data_sha256 = data.sha256
        self.tokenizer_sha256 = tokenizer_sha256(tok)
        if data.cols > 1:
            self.pooler = "cls"
        self.log(f"evaluation: {self.dev_name} Spearman, alignment and uniformity, --pooler "
                 f"{self.pooler}")
        return data

    def compile(self, model):
        """--compile: torch.compile the encoder in place (its batches are padded to max_len)."""
        if self.cfg.compile:  # Module.compile keeps parameter names; model.encode stays eager
            mode = "reduce-overhead" if self.device.type == "cuda" else None  # CUDA graphs
            model.compile(mode=mode, dynamic=False)  # SimCSE++'s dropout-off pass: static too
            self.log("compiled the encoder (torch.compile): the first steps include compiling it")
        return model

    def start(self, checkpointed, total):
        """Open out_dir, catch Ctrl-C/SIGTERM -> (0, {}), or the --resume step and its stats."""
        self.total = total
        self.clock = time.time()  # the training steps' clock; log_dev adds each evaluation's time
        step = 0
        stats = {}
        if self.resumed:
            step, stats, histories = restore_checkpoint(self, checkpointed)
            self.dev_history, self.stats_history, self.align_uniform = histories
            self.first_step = step
        self.opt, self.sched = checkpointed["opt"], checkpointed["sched"]  # for skipped_steps
        self.log_file, self.lock = open_out_dir(self)  # log.txt, with the lines logged so far
        self.catch_signals()
        return step, stats

    def ddp(self, module):
        """Under torchrun DDP(InsideDDP(module)), which averages the gradients; else the module."""
        if self.world_size == 1:
            return module
        ids = [self.device.index] if self.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(InsideDDP(module), device_ids=ids)

    def progress(self, what):
        """An evaluation's progress line; timed, apart from the training steps."""
        self.evaluating = Progress(what)
        return self.evaluating

    def after_step(self, step, loss, stats, checkpointed):
        """After optimizer step `step`: its progress line; a non-finite loss -> True (stop: finish()
        exits with status 3); a checkpoint every save_every steps and at the end; a Ctrl-C or
        SIGTERM: a checkpoint, then exit status 128 + signal. The final evaluation is resumable."""
        self.watch.note(loss, step)
        self.log_progress(step, stats)
        signal_number = self.signal_received(step)
        due = step == self.total or self.cfg.save_every and step % self.cfg.save_every == 0
        self.stopped = self.watch.stopped(step, read=due or step % self.cfg.eval_every == 0)
        if self.stopped:
            return True
        if due or signal_number:
            self.save_checkpoint(step, checkpointed, stats)
        if signal_number:
            self.log(f"{signal.Signals(signal_number).name} at step {step}: checkpoint saved; "
                     f"continue with --resume {self.out}")
            self.release()
            sys.exit(128 + signal_number)
        return False

    def log_progress(self, step, stats):
        """A progress line about every 10 seconds between evaluations: the training steps' pace,
        and the time to the end, the evaluations left counted at their measured time [issue 42]."""
        if step == self.first_step + 1:
            check_generator(self, stats)
        if time.time() - self.last_print > 10:
            per_step = (time.time() - self.clock) / (step - self.first_step)
            self.last_print = time.time()
            self.log(f"step {step}/{self.total} | {format_stats(self, stats)} | {1 / per_step:.2f} "
                     f"steps/s | eta {seconds_left(self, step, per_step) / 60:.1f} min")

    def log_dev(self, step, dev, stats, best):
        """The dev evaluation's line in the log, and its place in results.json's histories."""
        self.dev_history.append([step, round(dev["stsb_dev"], 4)])
        self.align_uniform.append([step, round(dev["align"], 6), round(dev["uniform"], 6)])
        self.stats_history.append([step, {k: float(v) for k, v in stats.items()}])
        steps = step - self.first_step  # the steps' seconds: their clock stops while evaluating
        pace = f"{1000 * (self.evaluating.start - self.clock) / steps:.0f} ms/step" if steps else \
            f"start-up {self.clock - self.started:.1f} s"  # loading the model and the data
        self.eval_times.append(time.time() - self.evaluating.start)  # this evaluation's seconds
        self.clock += self.eval_times[-1]
        # this line shows progress: the next one in 10 s, at a known pace
        self.last_print = time.time()
        label = "dev" if self.cfg.dev_file else "stsb_dev"  # the dev score's name in the log
        self.log(f"step {step} | {format_stats(self, stats)} | {label} {dev['stsb_dev']:.2f} "
                 f"| align {dev['align']:.4f} uniform {dev['uniform']:.4f} | best "
                 f"{best['dev']:.2f} @ {best['step']} | {pace} | eval {self.eval_times[-1]:.1f} s")
        tie = dev["stsb_dev"] == best["dev"] or math.isnan(dev["stsb_dev"])  # constant: NaN
        if tie and best["step"] != step:  # [issue 52]
            self.log(f"step {step} | a tie or no score: the first best, step {best['step']}, is "
                     f"kept")

    def save_checkpoint(self, step, checkpointed, stats):
        """out_dir/checkpoint.pt (rank 0): all it takes to go on after `step` as if never stopped:
        the objects in `checkpointed` (model, heads, optimizer, best state...), RNGs, histories."""
        if self.rank > 0:  # the other ranks hold the same state
            return
        self.saving = True  # a second signal waits for the checkpoint to be whole
        start = time.time()
        try:
            state = {"format": 6, "method": self.method, "step": step, "total": self.total,
                     "data_sha256": self.data_sha256, "rng": rng_states(),
                     "tokenizer_sha256": self.tokenizer_sha256, "dev_sha256": self.dev_sha256,
                     "device": self.device.type, "config": dataclasses.asdict(self.cfg),
                     "stats": {k: float(v) for k, v in stats.items()},
                     "objects": {k: state_of(v) for k, v in checkpointed.items() if v is not None},
                     "histories": [self.dev_history, self.stats_history, self.align_uniform]}
            with atomic_write(self.out / "checkpoint.pt", "wb") as f:
                try:
                    torch.save(state, f)
                except RuntimeError as e:  # torch's zip writer says a short write (disk full) so
                    if "unexpected pos" not in str(e) and "failed writing" not in str(e):
                        raise
                    raise OSError(errno.ENOSPC, "a write fell short") from e
        finally:
            self.saving = False
        self.log(f"step {step} | checkpoint saved in {self.out / 'checkpoint.pt'} "
                 f"({time.time() - start:.1f} s)")  # a phase of the run [issue 54]

    def catch_signals(self):
        """Ctrl-C / SIGTERM set self.signal: after_step saves a checkpoint at the step's end and
        exits 128 + signal; the final evaluation and save just go on. A second one
        stops at once if a checkpoint is there and none is being written (else a third one does)."""
        def handler(signum, frame):
            self.signals += 1
            CAUGHT.append(signum)
            has_checkpoint = (self.out / "checkpoint.pt").exists() and not self.saving
            if self.signals > 2 or self.signals == 2 and has_checkpoint:
                self.release()  # a further one acts as if no run were here
                print(f"\n{signal.Signals(signum).name} again: stopping now" + (
                    f"; the last checkpoint is kept: continue with --resume {self.out}"
                    if has_checkpoint else ""), file=sys.stderr, flush=True)
                raise KeyboardInterrupt
            self.signal = self.signal or signum
            first = "; no checkpoint yet: one first" if self.signals > 1 else ""
            what = f"stopping after this step with a checkpoint{first} (again to stop now)"
            testing = getattr(self.evaluating, "what", "") == "STS test"
            if testing:  # the loop is over: nothing to stop
                left = seconds_left(self, self.total, 0) - (time.time() - self.evaluating.start)
                what = f"finishing the test table, about {max(left, 1):.0f} s; again to stop " \
                    "now, --resume then redoes it"
            line = f"{signal.Signals(signum).name}: {what}"
            print("\n" + line, file=sys.stderr, flush=True)
            if testing and self.log_file:  # in the steps, after_step logs it [issue 55]
                self.log_file.write(line + "\n")
                self.log_file.flush()
        with contextlib.suppress(ValueError):  # handlers can only be set in the main thread
            self.old_handlers = {s: signal.signal(s, handler) for s in (signal.SIGINT,
                                                                         signal.SIGTERM)}

    def signal_received(self, step):
        """The Ctrl-C/SIGTERM caught so far (0: none) by any rank: under torchrun all stop
        together, agreeing every 10 steps (each agreement makes the CPU wait for the GPU)."""
        if self.world_size > 1 and step % 10 == 0:
            flag = torch.tensor([self.signal], device=self.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            self.signal = int(flag)
        return self.signal

    def finish(self, test, best):
        """The test table logged, results.json beside the saved model (rank 0); a run stopped by a
        non-finite loss: then TrainingStopped, exit status 3."""
        if self.stopped:
            self.log(self.stopped)
        self.log(format_table(test) if test else "no test table (--test none)")
        results = {"method": self.method, "config": dataclasses.asdict(self.cfg),
                   "dev_history": self.dev_history, "stats_history": self.stats_history,
                   "align_uniform": self.align_uniform, "align_uniform_on": self.dev_name,
                   "best_step": best["step"], "best_dev": round(best["dev"], 4),
                   "test": {k: round(v, 4) for k, v in test.items() if k != "details"},
                   "test_details": test.get("details", {}),
                   "train_seconds": round(time.time() - self.started, 1),
                   **({"stopped": self.stopped} if self.stopped else {})}
        write_json(self.out / "results.json", results)
        (self.out / "checkpoint.pt").unlink(missing_ok=True)
        self.log(f"best {'dev' if self.cfg.dev_file else 'stsb_dev'} {best['dev']:.2f} @ step "
                 f"{best['step']}; model and results.json in {self.out}")
        self.release()
        if self.stopped:
            raise TrainingStopped(f"{self.stopped}; the best model (step {best['step']}) is in "
                                  f"{self.out}")
        return results

    def release(self):
        """The end of a run on every rank, or its collection (refused after its lock) -> {}."""
        for s, h in self.old_handlers.items():
            signal.signal(s, h)
        self.old_handlers = {}
        release_lock(self.lock)
        if self.log_file:
            self.log_file.close()
        self.lock = self.log_file = None
        return {}
    __del__ = release


# --- torchrun: the process group (shard, all_gather: Part 1; the DDP wrapping: Run) ---------------
# Several processes give one process's step; the others wait for rank 0, never for ever.

def world():
    """(rank, number of processes); (0, 1) without a process group."""
    on = dist.is_available() and dist.is_initialized()
    return (dist.get_rank(), dist.get_world_size()) if on else (0, 1)


def torchrun_env():
    """torchrun's variables, read and checked in this one place -> {name: value}, or {} without
    torchrun (WORLD_SIZE unset or 1). One line for a number not in ASCII digits, a RANK not below
    WORLD_SIZE (left from another shell, it would skip the out_dir lock), a variable missing."""
    names = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")  # what it sets
    env = {name: os.environ.get(name, "") for name in names}
    alone = env["WORLD_SIZE"] in ("", "1")
    fix = "left from another shell? unset it, or start the run with torchrun"
    read = names[:2] if alone else names  # alone, only RANK matters
    for name in read:
        number = env[name].isascii() and env[name].isdigit()  # '²'.isdigit(), not int()'s
        if name != "MASTER_ADDR" and env[name] and not number:
            raise UserError(f"{name}={env[name]!r} is not a number: {fix}")
    if int(env["RANK"] or 0) >= int(env["WORLD_SIZE"] or 1):
        raise UserError(f"RANK={env['RANK']} with WORLD_SIZE={env['WORLD_SIZE'] or '(unset)'}: "
                        f"{fix}")
    missing = [name for name in read if not (alone or env[name])]
    if missing:
        raise UserError(f"incomplete torchrun environment: {', '.join(missing)} not set; start "
                        f"the run with torchrun, or unset WORLD_SIZE")
    return {} if alone else env


class InsideDDP(nn.Module):
    """The module Run.ddp wraps in DDP: DDP's forward calls fn(module, ...), so that
    gradient_cache(ddp, ...) runs its chunks inside it, and DDP averages the gradients once."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, fn, *args, **kwargs):
        return fn(self.module, *args, **kwargs)


def init_distributed(device):
    """Join torchrun's process group (torchrun_env) -> this rank's device: NCCL and
    cuda:LOCAL_RANK on CUDA, gloo on the CPU. Without torchrun: `device`."""
    env = torchrun_env()
    if not env or dist.is_initialized():
        return device
    if device.type == "mps":
        raise UserError("several processes need --device cuda (NCCL) or cpu (gloo), not mps")
    if device.type == "cuda":
        device = torch.device("cuda", int(env["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    try:  # torchrun starts every rank at once: one missing after minutes means stale variables
        store, rank, size = next(dist.rendezvous("env://", timeout=JOIN_LIMIT))
    except (RuntimeError, OSError) as e:  # DistStoreError (a RuntimeError): timed out
        found = " ".join(f"{name}={value}" for name, value in env.items())
        raise UserError(f"the torchrun variables ({found}) name {env['WORLD_SIZE']} processes, "
                        f"but not all joined within {JOIN_LIMIT} ({type(e).__name__}): left from "
                        f"another shell? unset WORLD_SIZE, or use torchrun") from None
    store.set_timeout(WAIT_LIMIT)  # joined: from now on the others may wait on rank 0 for hours
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=store, rank=rank,
                            world_size=size, timeout=WAIT_LIMIT)
    return device


# the others wait on rank 0: downloads (bert-base 440 MB, wiki1m), tokenizing 1M lines, every dev
# evaluation and checkpoint; NCCL's default of 10 minutes stops a first run [issue 30]
WAIT_LIMIT = datetime.timedelta(hours=2)
JOIN_LIMIT = datetime.timedelta(minutes=5)  # all ranks' start: longer names the variables


def leave_distributed():
    """End the process group after the trainer returns; its DDP wrappers, in reference cycles, hold
    it: collected first, so gloo's threads stop now, not in interpreter shutdown, where they can
    abort the process (SIGABRT once in CI) [pytorch/pytorch#179291]."""
    if dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()


@contextlib.contextmanager
def rank0_first(what):
    """Rank 0 runs the block first (downloads, cache writes), the others after it, reading what it
    wrote. Rank 0 releases them even when it fails, so they fail on the same problem, not hang."""
    rank, size = world()
    if rank > 0:
        print(f"rank {rank}: waiting for rank 0 ({what}; at most {WAIT_LIMIT})", file=sys.stderr)
        dist.barrier()
    try:
        yield
    finally:
        if rank == 0 and size > 1:
            dist.barrier()


# ==================================================================================================
# Part 3: the command line (python common.py eval | download | analyze) and the analysis figures
# ==================================================================================================

import xml.sax.saxutils

# --- Analysis: alignment and uniformity, singular values, similarity by gold score -------------

SCORE_GROUPS = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]  # [SimCSE App. G]; the edges are ours
GROUP_STATS = ("mean", "std", "min", "q05", "q25", "median", "q75", "q95", "max")


def singular_values(x):  # x [N, H] -> [min(N, H)], descending, the largest = 1 [SimCSE App. F]
    """Of the L2-normalised rows, not mean-centred: the spectrum should show a shared direction."""
    s = torch.linalg.svdvals(F.normalize(x.double(), dim=-1))  # [min(N, H)]
    return (s / s[0]).nan_to_num(0.0).numpy()  # a collapsed model's zero vectors: all 0


def similarity_by_score(sims, gold):
    """Cosine statistics per gold-score group (0-1, ..., 4-5; 4-5 includes 5) [SimCSE App. G]."""
    sims, gold = np.asarray(sims, dtype=float), np.asarray(gold, dtype=float)  # [N] each
    groups = []
    for lo, hi in SCORE_GROUPS:
        s = sims[(gold >= lo) & ((gold < hi) if hi < 5 else (gold <= hi))]  # [n]
        q = np.quantile(s, [0, 0.05, 0.25, 0.5, 0.75, 0.95, 1]) if len(s) else []  # min ... max
        stats = map(float, [s.mean(), s.std(), *q] if len(s) else [math.nan] * 9)
        groups.append({"group": f"{lo}-{hi}", "count": len(s), **dict(zip(GROUP_STATS, stats))})
    return groups


def analyze_model(model, tok, root, pooler="cls_before_pooler", split="test", batch_size=128):
    """Alignment, uniformity, singular values and similarity by score on one STS-B split."""
    a, b, gold = load_sts_split(root, "STSBenchmark", split)
    if not ((gold >= 0) & (gold <= 5)).all():  # else no group of similarity_by_score holds any
        raise UserError(f"STS-B {split}: gold scores outside 0-5: not SentEval's STS-B file")
    unique = sorted(set(a + b))  # uniformity counts a repeated sentence once
    index = {s: i for i, s in enumerate(unique)}
    vectors = encode_sentences(model, tok, unique, pooler, batch_size,  # [M, H], as `eval` has them
                               progress=Progress(f"STS-B {split}"))
    va, vb = vectors[[index[s] for s in a]], vectors[[index[s] for s in b]]  # [N, H] each
    positive = torch.as_tensor(gold > POSITIVE_GOLD)  # [N] bool
    sims = cosine(va, vb)  # [N]
    return {"split": f"STS-B {split}", "pooler": pooler, "pairs": len(gold),
            "positive_pairs": int(positive.sum()), "sentences": len(unique),
            "alignment": alignment(va[positive], vb[positive]), "uniformity": uniformity(vectors),
            "stsb_spearman": 100 * scipy.stats.spearmanr(sims, gold)[0],
            "singular_values": singular_values(vectors).tolist(),
            "similarity_by_score": similarity_by_score(sims, gold)}


# --- Figures: a small SVG writer and the three analysis plots (no plotting dependency) -----------

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")


def nice_ticks(lo, hi, n=7, log=False):
    """(value, label) of about n round values (1, 2 or 5 x 10^k apart) in [lo, hi]; log: 10^k."""
    if log:
        powers = range(math.ceil(math.log10(lo) - 1e-9), math.floor(math.log10(hi) + 1e-9) + 1)
        return [(10.0 ** k, f"{10.0 ** k:g}") for k in powers]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw * 0.999)
    first = math.ceil(lo / step - 1e-9) * step
    digits = max(0, -math.floor(math.log10(step) + 1e-9))
    count = int((hi - first) / step + 1e-9) + 1
    return [(first + i * step, f"{first + i * step:.{digits}f}") for i in range(count)]


def _limits(values, pad=0.08):
    lo, hi = min(values), max(values)
    span = (hi - lo) or abs(hi) or 1.0
    return lo - pad * span, hi + pad * span


class Plot:
    """One figure of the three, 820 px wide, in just enough SVG for line, point and box plots (one
    string per element, numbers to 0.1 px): a plotting rectangle at (80, 40), 440 px wide, mapping
    data to pixels (linear, or log10 on y), its frame, and a legend on its right."""
    left, top, w = 80, 40, 440  # the plotting rectangle; its height self.h

    def __init__(self, height, plot_height, xlim, ylim, ylog=False):
        self.items = [f'<svg xmlns="http://www.w3.org/2000/svg" width="820" height="{height}" '
                      f'viewBox="0 0 820 {height}">',
                      '<rect width="100%" height="100%" fill="#fff"/>']
        self.h = plot_height
        self.xlim, self.ylim, self.ylog = xlim, ylim, ylog

    def add(self, tag, content="", **attrs):  # stroke_width -> stroke-width; None values dropped
        values = {k.replace("_", "-"): f"{v:.1f}" if isinstance(v, float) else str(v)
                  for k, v in attrs.items() if v is not None}
        attrs = "".join(f" {k}={xml.sax.saxutils.quoteattr(v)}" for k, v in values.items())
        body = xml.sax.saxutils.escape(content)
        self.items.append(f"<{tag}{attrs}>{body}</{tag}>" if content else f"<{tag}{attrs}/>")

    def line(self, x1, y1, x2, y2, stroke="#000", width=1):
        self.add("line", x1=x1, y1=y1, x2=x2, y2=y2, stroke=stroke, stroke_width=width)

    def polyline(self, points, stroke, width=1.5, dash=None):
        self.add("polyline", points=" ".join(f"{x:.1f},{y:.1f}" for x, y in points), fill="none",
                 stroke=stroke, stroke_width=width, stroke_dasharray=dash, stroke_linejoin="round")

    def circle(self, x, y, r, fill, stroke=None, width=1):
        self.add("circle", cx=x, cy=y, r=r, fill=fill, stroke=stroke, stroke_width=stroke and width)

    def rect(self, x, y, w, h, fill="none", stroke="#000", width=1, opacity=None):
        self.add("rect", x=x, y=y, width=w, height=h, fill=fill, fill_opacity=opacity,
                 stroke=stroke, stroke_width=width)

    def text(self, x, y, s, size=12, anchor="middle", rotate=False, weight=None, fill="#000"):
        turn = f"rotate(-90 {x:.1f} {y:.1f})" if rotate else None
        self.add("text", str(s), x=x, y=y, font_size=size, text_anchor=anchor, font_weight=weight,
                 fill=fill, font_family="sans-serif", transform=turn)

    def save(self, path):
        with atomic_write(path) as f:
            f.write("\n".join(self.items) + "\n</svg>\n")

    def px(self, x):
        return self.left + (x - self.xlim[0]) / (self.xlim[1] - self.xlim[0]) * self.w

    def py(self, y):
        lo, hi, y = (math.log10(v) for v in (*self.ylim, y)) if self.ylog else (*self.ylim, y)
        return self.top + self.h - (y - lo) / (hi - lo) * self.h

    def frame(self, title, xlabel, ylabel, xticks=None, xgrid=True):  # x tick labels: 1-2 lines
        left, top = self.left, self.top
        bottom = top + self.h
        for t, label in nice_ticks(*self.ylim, log=self.ylog):  # grid line, tick, label
            self.line(left, self.py(t), left + self.w, self.py(t), "#e0e0e0")
            self.line(left - 4, self.py(t), left, self.py(t))
            self.text(left - 7, self.py(t) + 4, label, 11, "end")
        for t, label in xticks or nice_ticks(*self.xlim):
            if xgrid:
                self.line(self.px(t), top, self.px(t), bottom, "#e0e0e0")
            self.line(self.px(t), bottom, self.px(t), bottom + 4)
            for i, part in enumerate(label.split("\n")):
                self.text(self.px(t), bottom + 17 + 13 * i, part, 11)
        self.rect(left, top, self.w, self.h)
        self.text(left + self.w / 2, top - 14, title, 14, weight="bold")
        self.text(left + self.w / 2, bottom + (58 if xticks else 40), xlabel, 12)
        self.text(left - 52, top + self.h / 2, ylabel, 12, rotate=True)

    def legend(self, entries, notes=()):  # entries (label, color, kind), notes below in grey
        x, y = 545, 52  # right of the plotting rectangle
        rows = 18 * len(entries)
        width = 40 + 6.5 * max(len(label) for label, _, _ in entries)
        self.rect(x - 6, y - 12, width, rows + 6, fill="#fff", stroke="#999")
        for yy, (label, color, kind) in zip(range(y, y + rows, 18), entries):
            if kind in ("line", "wide line"):
                self.line(x, yy, x + 22, yy, color, 4 if kind == "wide line" else 2)
            elif kind == "box":
                self.rect(x + 4, yy - 6, 14, 12, fill=color, stroke="#000", opacity=0.5)
            else:  # "point"
                self.circle(x + 11, yy, 5, color, "#000")
            self.text(x + 30, yy + 4, label, 11, "start")
        for i, note in enumerate(notes):
            self.text(x - 6, y + rows + 14 + 15 * i, note, 11, "start", fill="#555")


def plot_plane(models, runs, path):
    """Alignment against uniformity on STS-B dev: models and runs' paths [SimCSE Fig. 2]."""
    pts = [(m["dev"]["uniformity"], m["dev"]["alignment"]) for m in models]
    traj = [[(u, a) for _, a, u in r["align_uniform"] if None not in (a, u)] for r in runs]
    xs, ys = zip(*[p for p in pts + sum(traj, []) if all(map(math.isfinite, p))] or [(0, 0)])
    fig = Plot(490, 390, _limits(xs), _limits(ys))
    fig.frame("Alignment vs uniformity, STS-B dev",
              "uniformity  log E exp(-2‖x − y‖²)  (lower is better)",
              "alignment  E‖x − x⁺‖²  (lower is better)")
    for r, t in zip(runs, traj):
        fig.polyline([(fig.px(u), fig.py(a)) for u, a in t], r["color"], 1.5, dash="5,3")
        for u, a in t[1:]:
            fig.circle(fig.px(u), fig.py(a), 2.5, r["color"])
    for i, (m, (u, a)) in enumerate(zip(models, pts)):  # the reference model larger: a ring
        if math.isfinite(u) and math.isfinite(a):  # NaN alignment: no pair with gold > 4
            fig.circle(fig.px(u), fig.py(a), 6 if i else 8.5, m["color"], "#000")
    fig.text(fig.left + 8, fig.top + fig.h - 8, "↙ lower-left is better", 11, "start",
             fill="#666")
    steps = [f"{r['name']}: steps {r['align_uniform'][0][0]}→{r['align_uniform'][-1][0]}"
             for r in runs]
    fig.legend([(m["name"], m["color"], "point") for m in models] + [
        (s, r["color"], "line") for s, r in zip(steps, runs)],
        ["big points: the models;", "small dots: a run's evaluations"] if runs else [])
    fig.save(path)


def plot_singular_values(models, path):
    """Singular values over the largest, log scale [SimCSE App. F]: flatter is more isotropic."""
    curves = [np.asarray(m["test"]["singular_values"]) for m in models]
    # the floor holds 99% of the values; the last few can be ~0 (all-MiniLM-L6-v2 has three dead
    # output dimensions: LayerNorm weight and bias ~1e-32) and are drawn at the floor
    low = 10 ** math.floor(math.log10(max(min(np.quantile(c, 0.01) for c in curves), 1e-12)))
    n = max(len(c) for c in curves)
    fig = Plot(450, 350, (1, n), (low, 1.0), ylog=True)
    fig.frame("Singular values of the embedding matrix, STS-B test", "index (descending)",
              "singular value / largest")
    for k, (m, c) in enumerate(zip(models, curves)):  # the reference model wider: a halo
        points = [(fig.px(i + 1), fig.py(v)) for i, v in enumerate(np.maximum(c, low))]
        fig.polyline(points, m["color"], 1.6 if k else 4)
    fig.legend([(m["name"], m["color"], "line" if k else "wide line")
                for k, m in enumerate(models)],
               [f"{n} values; rows L2-normalised;", "values below the axis: drawn at its floor"])
    fig.save(path)


def plot_similarity_by_score(models, path):
    """STS-B test cosines per gold-score group, a box per model [SimCSE App. G]."""
    stats = [m["test"]["similarity_by_score"] for m in models]
    values = [v for st in stats for g in st for v in (g["q05"], g["q95"]) if math.isfinite(v)]
    fig = Plot(470, 350, (0, len(stats[0])), _limits(values))
    ticks = [(i + 0.5, f"{g['group']}\nn={g['count']}") for i, g in enumerate(stats[0])]
    fig.frame("Cosine similarity by gold score, STS-B test", "gold score group",
              "cosine similarity", ticks, xgrid=False)
    width = 0.8 / len(models)
    for k, (m, st) in enumerate(zip(models, stats)):
        for i, g in enumerate(st):  # whiskers q05-q95, box q25-q75, median line, mean dot
            if g["count"]:
                x0 = fig.px(i + 0.1 + k * width + 0.1 * width)
                x1 = fig.px(i + 0.1 + (k + 1) * width - 0.1 * width)
                q25, q75 = fig.py(g["q25"]), fig.py(g["q75"])
                xm = (x0 + x1) / 2
                fig.line(xm, fig.py(g["q05"]), xm, fig.py(g["q95"]), m["color"], 1.2)
                fig.rect(x0, q75, x1 - x0, q25 - q75, m["color"], m["color"], 1, 0.35)
                fig.line(x0, fig.py(g["median"]), x1, fig.py(g["median"]), "#000", 1.5)
                fig.circle(xm, fig.py(g["mean"]), 2, "#fff", "#000", 0.8)
    fig.legend([(m["name"], m["color"], "box") for m in models],
               ["box: quartiles; line: median; dot: mean;", "whiskers: 5th to 95th percentile"])
    fig.save(path)


# --- SentEval's transfer tasks: a linear classifier on frozen sentence vectors -------------------
# What "MR 81.18" means [SimCSE App. E]: a logistic regression on the frozen vectors, its L2 weight
# chosen by cross-validation, its test accuracy reported, as SentEval does [tools/validation.py,
# classifier.py]. A task's fits train side by side as one batch, each its own seed, batches, stop.

TRANSFER_TASKS = ("MR", "CR", "SUBJ", "MPQA", "SST2", "TREC", "MRPC")
BINARY_FILES = {"MR": ("rt-polarity.pos", "rt-polarity.neg"), "CR": ("custrev.pos", "custrev.neg"),
                "SUBJ": ("subj.objective", "subj.subjective"), "MPQA": ("mpqa.pos", "mpqa.neg")}
SPLIT_PATHS = {"SST2": {s: f"SST/binary/sentiment-{s}" for s in ("train", "dev", "test")},
               "TREC": {"train": "TREC/train_5500.label", "test": "TREC/TREC_10.label"},
               "MRPC": {s: f"MRPC/msr_paraphrase_{s}.txt" for s in ("train", "test")}}
TRANSFER_FILES = [f"{t}/{name}" for t, names in BINARY_FILES.items() for name in names] + [
    path for splits in SPLIT_PATHS.values() for path in splits.values()]
TREC_CLASSES = ("ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM")  # the coarse label [SentEval trec.py]
TRANSFER_MODES = {  # [SimCSE evaluation.py]: test as in the papers; fasttest (and dev) quicker
    "test": dict(optim="adam", batch_size=64, epoch_size=4, tenacity=5, kfold=10),
    "fasttest": dict(optim="rmsprop", batch_size=128, epoch_size=2, tenacity=3, kfold=5)}
L2_GRID = [10 ** t for t in range(-5, -1)]  # 1e-5 ... 1e-2 [SentEval, usepytorch]
MAX_EPOCH, SEED = 200, 1111  # [SentEval]


def parse_row(task, r):  # a split file's row -> (words or MRPC's pair of them, label)
    if task == "SST2":  # "words\tlabel"
        return r[0].split(), int(r[1])
    if task == "TREC":  # "DESC:manner How did ...": the coarse label, the words after the fine one
        return r[1].split(" ", 1)[1].split(), TREC_CLASSES.index(r[0])
    return (r[3].split(), r[4].split()), int(r[0])  # MRPC: label, 2 ids, 2 sentences


def load_transfer(root, task):
    """{split: (samples, labels)} read as SentEval reads them: a sample is a list of words (MRPC: a
    pair of them); MR, CR, SUBJ, MPQA have one split, 'all', the first file's samples labelled 1."""
    if task in BINARY_FILES:  # latin-1; str.splitlines() also breaks at \x85, \x0b ... [binary.py]
        pos, neg = ([line.split() for line in (Path(root) / task / name).read_text(
            encoding="latin-1").splitlines()] for name in BINARY_FILES[task])
        return {"all": (pos + neg, [1] * len(pos) + [0] * len(neg))}
    splits = {}
    encoding, sep = ("latin-1", ":") if task == "TREC" else ("utf-8", "\t")
    for split, rel in SPLIT_PATHS[task].items():
        with malformed_file(Path(root) / rel), open(Path(root) / rel, encoding=encoding) as f:
            rows = [line.strip().split(sep, 1 if sep == ":" else -1)  # MRPC: a header first
                    for line in f][task == "MRPC":]
            if not rows:
                raise ValueError("no samples")
            samples, labels = zip(*[parse_row(task, r) for r in rows])
            # binary: 0, 1 [SentEval], a label 2 would be a third class, fitted (TREC's: .index)
            if task != "TREC" and not set(labels) <= {0, 1}:
                raise ValueError(f"labels {sorted(set(labels) - {0, 1})[:3]} outside 0-1")
            splits[split] = list(samples), list(labels)  # `for line in f`: \n, \r only [sst.py]
    return splits


def length_order(samples, labels):
    """Sorted stably by (word count, label), MRPC by both counts: SentEval encodes in this order,
    so its folds are drawn on it."""
    pairs = sorted(zip(samples, labels), key=lambda z: (*map(len, z[0]), z[1])
                   if isinstance(z[0], tuple) else (len(z[0]), z[1]))
    return [s for s, _ in pairs], np.array([y for _, y in pairs])


class FoldsError(ValueError):
    """Too few samples of each class for the folds (then evaluate_transfer names the task)."""


def stratified_kfold(y, k, seed=SEED):
    """[(train rows, test rows)] per fold, as scikit-learn's StratifiedKFold(k, shuffle=True,
    random_state=seed) draws them [sklearn 0.22+ model_selection/_split.py]."""
    rng = np.random.RandomState(seed)
    _, first, inverse = np.unique(y, return_index=True, return_inverse=True)
    y = np.unique(first, return_inverse=True)[1][inverse.reshape(-1)]  # classes by first seen
    counts = np.bincount(y)
    if np.all(counts < k):  # as scikit-learn refuses it
        raise FoldsError(f"{k} folds, but no class has {k} members")
    # each fold's share of each class: deal the sorted labels round robin
    share = np.array([np.bincount(np.sort(y)[i::k], minlength=len(counts)) for i in range(k)])
    fold = np.empty(len(y), dtype=int)
    for c in range(len(counts)):  # a class's members get folds in blocks, then shuffled
        blocks = np.arange(k).repeat(share[:, c])
        rng.shuffle(blocks)
        fold[y == c] = blocks
    return [(np.flatnonzero(fold != i), np.flatnonzero(fold == i)) for i in range(k)]


def logreg_step(w, grad, state, l2, live, optim):
    """torch.optim.Adam's or RMSprop's step with their defaults for each fit where `live` is True;
    L2 added to the gradient as weight decay [SentEval: param_groups[0]['weight_decay'] = l2reg].
    w, grad [F, C, D]; l2 [F, 1, 1]; live [F, 1, 1]."""
    grad = grad + l2 * w
    if optim == "rmsprop":  # lr 0.01, alpha 0.99, eps 1e-8; v: the running mean of grad^2
        v = state["v"] = torch.where(live, state["v"] * 0.99 + 0.01 * grad * grad, state["v"])
        return torch.where(live, w - 0.01 * grad / (v.sqrt() + 1e-8), w)
    state["t"] += live  # adam: lr 1e-3, betas (0.9, 0.999), eps 1e-8; t [F, 1, 1] its steps
    m = state["m"] = torch.where(live, state["m"].lerp(grad, 1 - 0.9), state["m"])
    v = state["v"] = torch.where(live, state["v"] * 0.999 + (1 - 0.999) * grad * grad, state["v"])
    t = state["t"].double().clamp(min=1)
    step = (1e-3 / (1 - 0.9 ** t)).float()
    bias2 = (1 - 0.999 ** t).sqrt().float()
    return torch.where(live, w - step * m / (v.sqrt() / bias2 + 1e-8), w)


def fit_batches(fits, rngs, size, device):
    """One epoch's rows [F, S * size] (a fresh permutation per fit) and each row's share of its
    batch's mean loss (0: padding, where a fit's epoch is shorter than the longest)."""
    steps = max(-(-len(rows) // size) for rows in fits)
    order = np.zeros((len(fits), steps * size), int)
    share = np.zeros((len(fits), steps * size))
    for i, (rows, rng) in enumerate(zip(fits, rngs)):
        n = len(rows)
        order[i, :n] = rows[rng.permutation(n)]
        share[i, :n] = 1 / np.minimum(size, n - np.arange(n) // size * size)  # the last is short
    return torch.from_numpy(order).to(device), torch.from_numpy(share).float().to(device), steps


def fit_logregs(X, y, fits, mode):
    """SentEval's PyTorchClassifier.fit for each (train rows, dev rows or None: a 5 % split of the
    train rows, L2 weight), all at once: (best weights [F, C, D + 1], best dev correct [F])."""
    cfg = TRANSFER_MODES[mode]
    classes = int(y.max()) + 1
    device = X.device
    rngs = [np.random.RandomState(SEED) for _ in fits]  # np.random.seed(1111) per classifier
    train, dev = [], []
    for rng, (rows, dev_rows, _) in zip(rngs, fits):
        if dev_rows is None:  # validation_split=0.05: the head of a permutation [classifier.py]
            rows = rows[rng.permutation(len(rows))]
            dev_rows = rows[:int(0.05 * len(rows))]
            rows = rows[len(dev_rows):]
        train.append(rows)
        dev.append(dev_rows)
    with torch.random.fork_rng(devices=[]):  # torch.manual_seed(1111), then nn.Linear [ibid.]
        torch.manual_seed(SEED)
        init = nn.Linear(X.size(1) - 1, classes)  # w [F, C, D + 1]: the bias last (X's ones)
    w = torch.cat([init.weight, init.bias[:, None]], 1).detach().repeat(len(fits), 1, 1).to(device)
    best_w = w.clone()
    state = {"m": torch.zeros_like(w), "v": torch.zeros_like(w), "t": w.new_zeros(len(fits), 1, 1)}
    l2 = torch.tensor([reg for _, _, reg in fits], device=device).float().view(-1, 1, 1)
    is_dev = torch.from_numpy(np.stack([np.isin(np.arange(len(X)), d) for d in dev])).to(device)
    best = np.full(len(fits), -1)
    misses = np.zeros(len(fits), int)
    live = np.arange(len(fits))  # the fits still training
    epoch = 0
    while len(live) and epoch <= MAX_EPOCH:  # `while not stop_train and nepoch <= max_epoch`
        sub = {k: v[live] for k, v in state.items()}
        ws, l2s = w[live], l2[live]
        for _ in range(cfg["epoch_size"]):
            order, share, steps = fit_batches([train[f] for f in live], [rngs[f] for f in live],
                                              cfg["batch_size"], device)
            for s in range(steps):
                cols = slice(s * cfg["batch_size"], (s + 1) * cfg["batch_size"])
                x, target = X[order[:, cols]], y[order[:, cols]]
                weight = share[:, cols, None]
                p = (x @ ws.transpose(1, 2)).softmax(-1)  # [F, B, C]
                grad = ((p - F.one_hot(target, classes)) * weight).transpose(1, 2) @ x  # dCE/dw
                ws = logreg_step(ws, grad, sub, l2s, weight[:, :1] > 0, cfg["optim"])
        for k, v in sub.items():
            state[k][live] = v
        w[live] = ws
        hits = (X @ ws.transpose(1, 2)).argmax(-1) == y  # [F, N]: each fit predicts every row
        correct = (hits & is_dev[live]).sum(1).cpu().numpy()
        better = correct > best[live]  # `if accuracy > bestaccuracy` [classifier.py]
        best_w[live[better]] = ws[torch.from_numpy(better).to(device)]
        misses[live[~better]] += 1  # tenacity: misses beyond it stop a fit, never reset
        best[live] = np.maximum(best[live], correct)
        live = live[better | (misses[live] <= cfg["tenacity"])]
        epoch += cfg["epoch_size"]
    return best_w, best, np.array([len(d) for d in dev])


def stack(splits, device):
    """{split: (X [n, D], y [n])} -> X [N, D + 1] (its last column, ones: the bias), y, rows."""
    X = torch.as_tensor(np.concatenate([x for x, _ in splits.values()]), dtype=torch.float32)
    y = torch.as_tensor(np.concatenate([y for _, y in splits.values()])).to(device)
    cut = np.cumsum([0, *(len(y) for _, y in splits.values())])
    rows = {split: np.arange(a, b) for split, a, b in zip(splits, cut, cut[1:])}
    return torch.cat([X, X.new_ones(len(X), 1)], 1).to(device), y, rows


def mean_percent(scores):  # round(100 * np.mean(scores), 2): numpy's round, on a numpy float
    return float(np.round(100 * np.mean(scores), 2))  # [SentEval validation.py]


def l2_scores(X, y, fold_sets, mode):
    """[set of folds][L2 weight] -> mean dev accuracy x 100 over the folds, all fit at once."""
    fits = [(a, b, reg) for folds in fold_sets for reg in L2_GRID for a, b in folds]
    _, correct, n = fit_logregs(X, y, fits, mode)
    return [[mean_percent(acc) for acc in per_l2]
            for per_l2 in (correct / n).reshape(len(fold_sets), len(L2_GRID), -1)]


def test_percent(w, X, y, rows):  # w [C, D + 1] -> accuracy x 100 on X[rows], Python's round
    return round(100 * float(((X[rows] @ w.T).argmax(-1) == y[rows]).double().mean()), 2)


def inner_kfold(splits, mode="test", device="cpu"):
    """MR, CR, SUBJ, MPQA ({'all': (X, y)}): k outer folds; in each, the L2 weight with the best
    mean accuracy over k inner folds, refit on the outer training part (5 % held out to stop it),
    tested on the outer fold [SentEval InnerKFoldClassifier] -> (dev, test accuracy)."""
    X, y, _ = stack(splits, device)
    k = TRANSFER_MODES[mode]["kfold"]
    labels = y.cpu().numpy()
    outer = stratified_kfold(labels, k)
    scores = l2_scores(X, y, [[(rows[a], rows[b]) for a, b in stratified_kfold(labels[rows], k)]
                              for rows, _ in outer], mode)
    best_l2 = [L2_GRID[int(np.argmax(s))] for s in scores]
    w, _, _ = fit_logregs(X, y, [(rows, None, r) for (rows, _), r in zip(outer, best_l2)], mode)
    tests = [test_percent(w[i], X, y, rows) for i, (_, rows) in enumerate(outer)]
    dev = np.mean([max(s) for s in scores])  # x 100 already, as the tests
    return float(np.round(dev, 2)), float(np.round(np.mean(tests), 2))  # numpy's round [SentEval]


def kfold_refit(splits, mode="test", device="cpu"):
    """TREC, MRPC ({'train', 'test'}): the L2 weight with the best mean accuracy over k folds of
    the training set, refit on all of it (5 % held out to stop it), tested [SentEval
    KFoldClassifier] -> (dev accuracy, test accuracy, test predictions)."""
    X, y, rows = stack(splits, device)
    folds = stratified_kfold(y[rows["train"]].cpu().numpy(), TRANSFER_MODES[mode]["kfold"])
    scores = l2_scores(X, y, [folds], mode)[0]
    w, _, _ = fit_logregs(X, y, [(rows["train"], None, L2_GRID[int(np.argmax(scores))])], mode)
    yhat = (X[rows["test"]] @ w[0].T).argmax(-1).cpu().numpy()
    return max(scores), test_percent(w[0], X, y, rows["test"]), yhat


def dev_split(splits, mode="test", device="cpu"):
    """SST-2 ({'train', 'dev', 'test'}): the L2 weight with the best dev accuracy, tested [SentEval
    SplitClassifier; its refit with that weight is the same fit, same seed: reused]."""
    X, y, rows = stack(splits, device)
    w, correct, n = fit_logregs(X, y, [(rows["train"], rows["dev"], l2) for l2 in L2_GRID], mode)
    scores = [round(100 * float(c / m), 2) for c, m in zip(correct, n)]  # Python's [SentEval]
    best = int(np.argmax(scores))
    return float(scores[best]), test_percent(w[best], X, y, rows["test"])


def f1_percent(y, yhat):  # the positive class's F1 x 100 [SentEval mrpc.py: sklearn f1_score]
    tp, fp, fn = [int(((yhat == a) & (y == b)).sum()) for a, b in ((1, 1), (1, 0), (0, 1))]
    return round(100 * 2 * tp / max(2 * tp + fp + fn, 1), 2)


def evaluate_transfer(model, tok, root, mode="test", pooler="cls_before_pooler", batch_size=128,
                      tasks=TRANSFER_TASKS, progress=None):
    """Test accuracy x 100 per task (dev mode: the cross-validated dev accuracy), MRPC's F1 and
    each task's details, 'Avg' of the printed values [SimCSE evaluation.py --task_set transfer]."""
    start = time.time()
    data = {t: {s: length_order(*xy) for s, xy in load_transfer(root, t).items()} for t in tasks}
    unique = sorted({" ".join(w) for splits in data.values() for samples, _ in splits.values()
                     for s in samples for w in (s if isinstance(s, tuple) else [s])})  # once each
    vectors = encode_sentences(model, tok, unique, pooler, batch_size, progress=progress)  # [N, H]
    index = {s: i for i, s in enumerate(unique)}
    device = next(model.parameters()).device

    def embed(samples):  # [n, H]; MRPC's pairs -> [|u - v|, u * v] [SentEval mrpc.py]
        if not isinstance(samples[0], tuple):
            return vectors[[index[" ".join(s)] for s in samples]].numpy()
        u, v = (vectors[[index[" ".join(p[i])] for p in samples]] for i in (0, 1))
        return torch.cat([(u - v).abs(), u * v], 1).numpy()
    results, details = {}, {}
    for task, splits in data.items():
        tick = time.time()
        xy = {s: (embed(x), y) for s, (x, y) in splits.items()}
        scheme = {"SST2": dev_split}.get(task, inner_kfold if task in BINARY_FILES else kfold_refit)
        try:
            dev, test, *yhat = scheme(xy, "fasttest" if mode == "dev" else mode, device)
        except FoldsError as e:
            raise UserError(f"{task}: {len(splits[list(splits)[0]][1])} samples, too few: {e} "
                            f"[SentEval]; use SentEval's own files") from None
        results[task] = dev if mode == "dev" else test
        details[task] = {"devacc": dev, "acc": test, "seconds": round(time.time() - tick, 1),
                         **({"f1": f1_percent(xy["test"][1], *yhat)} if task == "MRPC" else {})}
        print(f"{task}: {results[task]:.2f} ({details[task]['seconds']:.0f} s)", file=sys.stderr)
    if len(results) == len(TRANSFER_TASKS):  # of the printed values [SimCSE evaluation.py]
        results["Avg"] = float(np.mean([round(results[t], 2) for t in TRANSFER_TASKS]))
    details.update(seconds=round(time.time() - start, 2), sentences_encoded=len(unique))
    return {**results, "details": details}


# --- Using a model: encode, search, your own STS pairs -------------------------------------------

CHUNK_LINES = 16_384  # corpus lines read, sorted by length and encoded at a time: encode's memory
SCORE = re.compile(r"\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*")  # a finite number


def corpus_lines(path, flag, digest=None):
    """A text file's lines, read as needed (row i is line i + 1, blank lines kept), cut as training
    cuts them; `digest` takes the bytes as read: what was encoded, not the file later [issue 52]."""
    digest = digest or hashlib.sha256()  # else one nobody reads
    with naming(path), open(Path(path).expanduser(), "rb") as f:  # b"\n" alone ends a line
        for n, raw in enumerate(f, 1):  # as `wc -l` counts (not \r, U+0085, U+2028)
            digest.update(raw)
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise UserError(f"{flag} {path} is not UTF-8 (line {n}: {e.reason}); convert it, "
                                f"e.g. iconv -t UTF-8") from None
            yield line.removeprefix("\ufeff").rstrip("\r\n")[:MAX_SENTENCE_CHARS]


def count_lines(path, flag):  # each line decoded before any work -> (lines, the bytes' SHA-256)
    digest = hashlib.sha256()
    n = sum(1 for _ in corpus_lines(path, flag, digest))
    if n == 0:
        raise UserError(f"{flag} {path} is empty: one sentence a line")
    return n, digest.hexdigest()


def vectors_about(args, model, corpus_sha256, n):
    """What encode's JSON says, search checks: model (its tensors' sha256), pooler, corpus."""
    h = hashlib.sha256()
    for t in model.state_dict().values():  # in the model's order, always the same
        h.update(t.detach().float().cpu().contiguous().numpy())
    return {"model": str(args.model), "weights_sha256": h.hexdigest(), "pooler": args.pooler,
            "count": n, "corpus_sha256": corpus_sha256}


def described(about, npy):
    """encode's JSON's entry (its own, or the previous while encode replaces it) or None."""
    entries = [about, about.get("previous")] if isinstance(about, dict) else []
    seen = [npy.stat().st_size, sha256_file(npy)]
    return next((e for e in entries if isinstance(e, dict) and
                 [e.get("npy_bytes"), e.get("npy_sha256")] == seen), None)


def encoded_before(out):
    """The entry for --out's .npy now, or None; a pair not encode's is refused [issue 52]."""
    about_path = out.with_suffix(".json")
    about = read_json(about_path, f"--out {out}: its JSON") if about_path.exists() else None
    ours = isinstance(about, dict) and {"weights_sha256", "corpus_sha256"} <= set(about)
    if not ours and (about is not None or os.path.lexists(out)):
        raise UserError(f"--out {out}: {about_path.name} beside it was not written by encode, and "
                        f"encode replaces only its own pair: move them, or pick another --out")
    return described(about, out) if out.is_file() else None


def run_encode(args):
    """--input's lines -> float32 [lines, H] in --out (.npy), a chunk of sorted lengths at a time,
    and a JSON beside it. The .npy has no name until whole; as it takes --out's, the JSON describes
    it and the old one (search always finds the .npy described), then it alone [issue 52]."""
    out = Path(args.out).expanduser()  # and its .json: the name with .json for its suffix
    device, _, _ = check_cli_inputs(args, [args.model], [])
    lock = lock_folder(out.parent, "--out")  # one writer in a folder at a time, as runs
    stop = signal.signal(signal.SIGTERM, signal.default_int_handler)  # "interrupted", cleaned up
    try:
        for left in temporaries([out, out.with_suffix(".json")]):  # a kill between the
            left.unlink()  # link and the rename of atomic_write: our names, under our lock
        old = encoded_before(out)
        n, corpus_sha256 = count_lines(args.input, "--input")
        tok, model = load_encoder(args.model, device)
        about = vectors_about(args, model, corpus_sha256, n)
        digest, npy = hashlib.sha256(), hashlib.sha256()  # the corpus as read, the .npy written
        lines = corpus_lines(args.input, "--input", digest)
        shown = Progress("encode")
        header = io.BytesIO()
        np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False,
                                                      "shape": (n, model.cfg.hidden_size)})
        with atomic_write(out, "wb") as f:  # the rows in order: np.load reads them as one array
            f.write(header.getvalue())
            npy.update(header.getvalue())
            for start in range(0, n, CHUNK_LINES):
                chunk = list(itertools.islice(lines, CHUNK_LINES))
                vectors = encode_sentences(model, tok, chunk, args.pooler, args.batch_size,
                                           progress=lambda done, _: shown(start + done, n))
                rows = vectors.numpy().astype("<f4").tobytes()  # [c, H]
                f.write(rows)
                npy.update(rows)
            if next(lines, None) is not None or digest.hexdigest() != corpus_sha256:
                raise UserError(f"--input {args.input} changed while it was encoded: encode again")
            about |= {"npy_bytes": f.tell(), "npy_sha256": npy.hexdigest()}
            write_json(out.with_suffix(".json"), {**about, "previous": old}, indent=None)
        write_json(out.with_suffix(".json"), about, indent=None)  # the new pair alone
    finally:
        signal.signal(signal.SIGTERM, stop)
        if lock is not None:  # no fcntl (not POSIX): no lock
            os.close(lock)
    print(f"{n:,} vectors of {model.cfg.hidden_size} in {out}, and {out.stem}.json")


def run_search(args):
    """The --top_k corpus lines nearest each query by cosine: the vectors a chunk at a time
    (torch.topk per chunk, then over the chunks' best), on the GPU where there is one."""
    device, _, _ = check_cli_inputs(args, [args.model], [])
    queries = [args.query] if args.query is not None else \
        [q.strip() for q in corpus_lines(args.queries, "--queries") if q.strip()]
    if not (queries and all(q.strip() for q in queries)):  # the flag typed [issue 52]
        raise UserError(f"--queries {args.queries} holds no query" if args.queries else
                        "--query is empty: give the sentence to search for, e.g. --query 'a dog'")
    if "".join(queries).encode("utf-8", "replace").decode() != "".join(queries):  # a byte not
        # UTF-8 arrives as a lone surrogate [PEP 383], which cannot be printed back
        raise UserError("--query holds a byte that is not UTF-8: type it in UTF-8")
    n, corpus_sha256 = count_lines(args.corpus, "--corpus")
    tok, model = load_encoder(args.model, device)
    if args.vectors:  # encode's .npy, mapped (never whole in memory), checked against its JSON
        corpus = read_vectors(args, model, corpus_sha256, n)
    else:  # a large corpus: encode it once, then search with --vectors
        lines = list(corpus_lines(args.corpus, "--corpus"))
        corpus = encode_sentences(model, tok, lines, args.pooler, args.batch_size,
                                  progress=Progress("corpus")).numpy()
    q = encode_sentences(model, tok, queries, args.pooler, args.batch_size)  # [Q, H]
    scores, rows = [], []  # each chunk's best k [Q, k]
    for start in range(0, n, CHUNK_LINES):
        chunk = torch.from_numpy(np.array(corpus[start:start + CHUNK_LINES])).to(device)  # [c, H]
        top = (F.normalize(q.to(device), dim=-1) @ F.normalize(chunk, dim=-1).T).topk(
            min(args.top_k, len(chunk)), dim=1)  # of the cosines [Q, c]
        scores.append(top.values)
        rows.append(top.indices + start)
    best = torch.cat(scores, 1).topk(min(args.top_k, n), dim=1)  # [Q, k]
    rows = torch.cat(rows, 1).gather(1, best.indices)  # [Q, k] corpus rows
    hits = set(rows.flatten().tolist())
    text = {i: s for i, s in enumerate(corpus_lines(args.corpus, "--corpus")) if i in hits}
    found = [{"query": q, "rank": r + 1, "score": round(s, 6), "line": i + 1, "sentence": text[i]}
             for q, ss, ii in zip(queries, best.values.tolist(), rows.tolist())
             for r, (s, i) in enumerate(zip(ss, ii))]  # a row per result
    for f in found:  # --json: JSON Lines, a result a line
        head = f"query: {f['query']}\n" if f["rank"] == 1 else ""
        print(json.dumps(f, ensure_ascii=False) if args.json else
              f"{head}{f['rank']:4} {f['score']:7.4f}  line {f['line']}: {f['sentence']}")
    return found


def read_vectors(args, model, corpus_sha256, n):
    """--vectors, mapped, believed as far as checked before any ranking [issue 52]: its JSON says
    its bytes, --model, --pooler and --corpus; float32 [lines, H], every row finite."""
    path = Path(args.vectors).expanduser()
    about = described(read_json(path.with_suffix(".json"), f"--vectors {args.vectors}: its .json"),
                      path)
    if about is None:
        raise UserError(f"--vectors {args.vectors}: its .json does not describe it (its size or "
                        f"SHA-256 differ: another encode's, or a file copied over); encode again")
    now = vectors_about(args, model, corpus_sha256, n)  # as encode wrote it; the name aside
    if differ := [k for k in now if k != "model" and about.get(k) != now[k]]:
        raise UserError(f"--vectors {args.vectors}: its {', '.join(differ)} differ from this "
                        f"--model, --pooler and --corpus (see its .json); encode them again")
    try:  # no pickle: numpy's advice to allow one is not passed on
        corpus = np.load(path, mmap_mode="r", allow_pickle=False)  # [n, H] float32
    except (OSError, ValueError) as e:
        raise UserError(f"--vectors {args.vectors}: not an array numpy can map "
                        f"({type(e).__name__}); encode again") from None
    bad = corpus.dtype != np.float32 or corpus.shape != (n, model.cfg.hidden_size)
    starts = range(0, n, CHUNK_LINES)  # a chunk at a time: never the whole array in memory
    if bad or not all(np.isfinite(corpus[i:i + CHUNK_LINES]).all() for i in starts):
        raise UserError(f"--vectors {args.vectors}: {corpus.dtype} {corpus.shape}, not float32 "
                        f"({n}, {model.cfg.hidden_size}) and finite (no NaN): encode again")
    return corpus


def read_sts_pairs(path, flag):
    """A TSV of sentence 1, sentence 2, score -> (A, B, gold) as the STS tasks hold them. A header
    is the first row when its score holds no digit ('score', not '4,8'); every other row scores,
    finitely. A bad row: one line naming the file and line [issue 52]."""
    lines = read_utf8(Path(path).expanduser()).removeprefix("\ufeff").split("\n")  # not U+2028
    rows = [(n, line.rstrip("\r").split("\t")) for n, line in enumerate(lines, 1) if line.strip()]
    if rows and len(rows[0][1]) == 3 and not re.search(r"\d", rows[0][1][2]):
        rows = rows[1:]  # a header row
    for n, row in rows:
        if len(row) != 3 or not SCORE.fullmatch(row[2]) or not math.isfinite(float(row[2])):
            raise UserError(f"{flag} {path} line {n}: {len(row)} column(s), the last "
                            f"{row[-1][:20]!r}; a row is sentence 1, sentence 2, a finite score")
    if len(rows) < 2:
        raise UserError(f"{flag} {path}: {len(rows)} scored pair(s); a Spearman needs 2 at least")
    if len({float(row[2]) for _, row in rows}) == 1:
        raise UserError(f"{flag} {path}: every pair scores {rows[0][1][2]}; a Spearman needs "
                        f"two different scores at least")
    return scored([row for _, row in rows], 0, 1, 2)  # as SentEval's STS files are read


# --- Several seeds: python common.py summarize RUN... --------------------------------------------

RUN_FIELDS = ("seed", "out_dir", "resume", "overwrite")  # may differ between the seeds of a setting


def read_run(path, flag):
    """A finished run's folder or its results.json (summarize's, analyze's --runs) -> results."""
    p = Path(path).expanduser()
    r = read_json(p / "results.json" if p.is_dir() else p, f"{flag} {path}: a run's results.json")
    if not (isinstance(r, dict) and isinstance(r.get("method"), str) and isinstance(
            r.get("config"), dict) and isinstance(r.get("test"), dict) and "best_dev" in r):
        raise UserError(f"{flag} {path}: not a finished training run's results.json")
    return r


def summarize(paths):
    """Runs of one setting, seeds apart -> {task: (mean, sample standard deviation)} of the test
    table and of the best dev score, n = len(paths) [issue 43; SimCSE issue #63: ~2 points between
    seeds]. Runs that differ in more than RUN_FIELDS: one line naming the fields."""
    if len(paths) < 2:
        raise UserError(f"summarize {' '.join(paths)}: 2 runs at least (a standard deviation)")
    runs = [read_run(path, "summarize") for path in paths]
    first = runs[0]["config"]
    for path, r in zip(paths, runs):  # each a whole run's test table, of the first run's setting
        if not r["test"]:
            raise UserError(f"{path}: the run has no test table (--test none); run it with --test "
                            f"sts")
        if r.get("stopped"):  # a wrong mean is worse than none: the user leaves it out, and says so
            raise UserError(f"{path} stopped early ({r['stopped']}): leave it out, and say so")
        if not all(type(v) in (int, float) and -100 <= v <= 100  # Spearman x 100
                   for v in [*r["test"].values(), r["best_dev"]]):
            raise UserError(f"{path}: a score in its results.json is not a number in [-100, 100]")
        if lone := sorted(set(r["test"]) ^ set(runs[0]["test"])):
            raise UserError(f"{paths[0]} and {path}: {', '.join(lone)} in one test table only")
        # the fields in which the two runs differ, but for RUN_FIELDS
        fields = [k for k in {**first, **r["config"]} if k not in RUN_FIELDS]
        differ = [k for k in fields if first.get(k, "(none)") != r["config"].get(k, "(none)")]
        if r["method"] != runs[0]["method"]:
            differ.insert(0, "method")
        if differ:  # another setting
            raise UserError(f"{paths[0]} and {path} differ in {', '.join(differ)}: not seeds of "
                            f"one setting (only {', '.join(RUN_FIELDS)} may differ)")
    seeds = [r["config"].get("seed") for r in runs]
    if len(set(seeds)) < len(seeds):
        raise UserError(f"seed {max(seeds, key=seeds.count)} twice in {' '.join(paths)}: the same "
                        f"run given twice?")
    table = {k: np.array([r["test"][k] for r in runs], dtype=np.float64) for k in runs[0]["test"]}
    table["best dev"] = np.array([r["best_dev"] for r in runs], dtype=np.float64)
    return {k: (float(x.mean()), float(x.std(ddof=1))) for k, x in table.items()}, seeds


def run_summarize(args):
    """Print summarize's table: a task a line, mean ± sample standard deviation, n."""
    table, seeds = summarize(args.runs)
    print(f"{len(seeds)} runs (seeds {', '.join(map(str, seeds))}): mean ± sample standard "
          f"deviation (n - 1), n = {len(seeds)}")
    for name, (mean, std) in table.items():
        print(f"{SHORT_NAMES.get(name, name):>8}  {mean:6.2f} ± {std:.2f}")
    return table


# --- Command line: python common.py eval | download | analyze ------------------------------------

class OneLineErrors(argparse.ArgumentParser):
    """A bad flag: one line on stderr (not the whole usage), exit status 2, like every bad input;
    never guessed from its first letters (--max_step is no --max_steps): the nearest is named."""

    def __init__(self, **kwargs):  # our --help layout unless another is asked for
        super().__init__(allow_abbrev=False, **{"formatter_class": HelpFormatter, **kwargs})

    def error(self, message):
        if unknown := re.match(r"unrecognized arguments: (--[^\s=]+)", message):  # the first
            wanted = unknown[1]
            known = self._option_string_actions  # difflib: - for _ too
            near = [k for k in known if k.startswith(wanted)] or \
                difflib.get_close_matches(wanted, known, n=1)  # a prefix's flags, else the nearest
            hint = owner_of(wanted, getattr(self, "fields", None))  # another method's [issue 55]
            if near and not hint:
                hint = f"did you mean {' or '.join(near)}?"
            message = f"unknown flag {wanted}" + (f"; {hint}" if hint else "")
        elif dash := re.search(r"arguments: [\u2010-\u2015\u2212]+([^\s=]+)", message):
            message = (f"unknown argument {dash[0][11:]}: it starts with a dash that is not '-' "
                       f"(an en dash from a word processor?); type --{dash[1]}")  # [issue 52]
        elif value := re.match(r"argument (--\w+): expected one argument", message):
            message += f" (a value that starts with '-' is written {value[1]}=-1e-5)"
        print(f"error: {message} (see --help)", file=sys.stderr)
        sys.exit(2)


METHODS = {"simcse": "SimCSE", "esimcse": "ESimCSE", "simcsepp": "SimCSE++", "diffcse": "DiffCSE"}


def owner_of(flag, fields):
    """"--dup_rate is ESimCSE's: esimcse_min.py" for a flag of other methods' Configs (each one
    named), on a method's parser (fields: its Config's), else ""."""
    name = flag.removeprefix("--").removeprefix("no_")
    if fields is None or name in fields:  # common.py's commands; or --no_ of a flag not a switch
        return ""
    owners = []
    for method, title in METHODS.items():
        source = Path(__file__).with_name(f"{method}_min.py").read_text(encoding="utf-8")
        if re.search(rf"^    {re.escape(name)}: \w+ = ", source, re.M):  # a Config field
            owners.append(f"{title}'s: {method}_min.py")
    return f"{flag} is " + ", ".join(owners) if owners else ""


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Defaults shown where they say something (an empty one is explained by its help), switches
    shown bare with their --no_ form (`--compile, --no_compile`, not `--compile [COMPILE]`)."""

    def _get_help_string(self, action):
        if action.const is True:  # a switch
            return f"{action.help} (default: {'on' if action.default else 'off'})"
        return action.help if action.default in ("", None, argparse.SUPPRESS) else \
            super()._get_help_string(action)

    def _format_args(self, action, default_metavar):
        return "" if action.const is True else super()._format_args(action, default_metavar)

    def _format_action_invocation(self, action):
        if action.const is True:  # a switch, and its --no_ form
            flag = action.option_strings[0]
            return f"{flag}, {flag.replace('--', '--no_')}"
        return super()._format_action_invocation(action)


FLAG_GROUPS = {"data and model": ("data", "model", "senteval", "dev_file", "generator"),
               "training": ("device", "precision", "seed", "batch_size", "chunk_size", "max_len",
                            "lr", "epochs", "max_steps", "dropout", "compile"),
               "method": (),  # every other field: the method's own
               "run and output": ("out_dir", "eval_every", "test", "save_every", "resume",
                                  "overwrite")}
ANALYSIS_FILES = ("analysis.json", "align_uniform.svg", "singular_values.svg",
                  "similarity_by_score.svg")  # what analyze writes in --out


def parse_args(config_cls, argv=None):
    """Dataclass fields -> `--name value` flags in FLAG_GROUPS (booleans: `--name`, `--no_name`),
    --help from their comments."""
    helps = dict(re.findall(r"^\s+(\w+):[^#\n]*#\s*(.+)$", inspect.getsource(config_cls), re.M))
    doc = " ".join((sys.modules[config_cls.__module__].__doc__ or "").split("\n\n")[0].split())
    parser = OneLineErrors(description=doc)
    parser.fields = [f.name for f in dataclasses.fields(config_cls)]  # another's: owner_of
    groups = {name: parser.add_argument_group(name) for name in FLAG_GROUPS}
    kinds = {"bool": parse_bool, "int": int, "float": float}
    for f in dataclasses.fields(config_cls):
        kind = kinds.get(getattr(f.type, "__name__", f.type))  # a type or a string annotation
        switch = dict(nargs="?", const=True) if kind is parse_bool else {}  # bare `--compile`: true
        group = next((g for g, names in FLAG_GROUPS.items() if f.name in names), "method")
        groups[group].add_argument(f"--{f.name}", type=kind or str, default=f.default,
                                   help=helps.get(f.name, " "), **switch)
        if switch:  # and `--no_compile` (argparse's BooleanOptionalAction; --help shows it)
            groups[group].add_argument(f"--no_{f.name}", dest=f.name, action="store_false",
                                       default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    cfg = config_cls(**vars(parser.parse_args(argv)))
    argv = sys.argv[1:] if argv is None else argv  # the flags typed: --resume compares them
    cfg.typed = {a[2:].split("=")[0].removeprefix("no_") for a in argv if a.startswith("--")}
    return cfg


def parse_bool(s):
    """1/true/yes or 0/false/no, any case."""
    if s.lower() in ("1", "true", "yes", "0", "false", "no"):
        return s.lower() in ("1", "true", "yes")
    raise argparse.ArgumentTypeError(f"expected 1/0/true/false, got {s!r}")


def cli(argv=None):
    """python common.py eval | analyze | encode | ..., each with --help; alone: the commands."""
    parser = OneLineErrors(prog="common.py", description="simcse-min tools: evaluation, analysis, "
                           "encoding and search, downloads.")
    sub = parser.add_subparsers(dest="command", title="commands", metavar="COMMAND")
    ev = sub.add_parser("eval", help="STS or transfer table of a model, as in the papers")
    an = sub.add_parser("analyze", help="alignment/uniformity, singular values, similarity by gold "
                        "score: JSON + SVGs")
    en = sub.add_parser("encode", help="a text file's sentences -> vectors (.npy)")
    se = sub.add_parser("search", help="the corpus sentences nearest a query (cosine)")
    su = sub.add_parser("summarize", help="runs of one setting, seeds apart: the test table and "
                        "best dev score as mean ± sample standard deviation")
    su.add_argument("runs", nargs="+", metavar="RUN", help="a finished run's folder (or its "
                    "results.json); runs that differ in more than seed and out_dir are refused")
    dl = sub.add_parser("download", help="fetch a model or data set into ~/.cache/simcse-min "
                        "(needs internet)")
    data = ", ".join(k for k in KNOWN_DATA if k != "senteval.tar")
    dl.add_argument("what", help=f"senteval (SimCSE's senteval.tar, unpacked), a data file "
                                 f"({data}) or a model ({known_names()})")
    for p in (ev, an, en, se):  # the flags of a command that encodes
        inputs, run = p.add_argument_group("data and model"), p.add_argument_group("run and output")
        p.groups = inputs, run
        inputs.add_argument("--model", required=True, help="model folder or known name (e.g. "
                            "bert-base-uncased, runs/simcse)")
        if p in (ev, an):
            inputs.add_argument("--senteval", default="", help="SentEval data folder (STS/ and "
                                "SICK/, or downstream/); empty: ./SentEval/data/downstream, else "
                                "~/.cache/simcse-min/senteval, else SimCSE's senteval.tar fetched")
        inputs.add_argument("--pooler", default="", choices=("", *POOLERS), metavar="POOLER",
                            help="as in SimCSE's evaluation.py: cls_before_pooler the raw [CLS] "
                            "(unsupervised runs'), cls the pooler on it (supervised); avg, "
                            "avg_top2, avg_first_last: means; empty: a released model's own (cls "
                            "for princeton-nlp/sup-simcse-*), else cls_before_pooler")
        run.add_argument("--batch_size", type=int, default=128, help="sentences per encoding batch")
        run.add_argument("--device", default="auto", help="cpu, cuda or mps; auto: cuda, else mps, "
                         "else cpu")
    add_command_flags(ev, an, en, se)
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # a command's flag: that command names the nearest of its own
        sub.choices.get(args.command, parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command is None:  # `python common.py` alone: what it can do
        return parser.print_help()
    if getattr(args, "pooler", None) == "" and args.command != "analyze":  # analyze: per model
        args.pooler = default_pooler(args.model)  # as SimCSE's tool.py chooses it
    if args.command != "download":
        return {"eval": run_eval, "analyze": run_analyze, "encode": run_encode,
                "search": run_search, "summarize": run_summarize}[args.command](args)
    what = args.what  # no flag to name in a hint here: the file's place in the cache instead
    if what == "senteval":
        print(download_senteval(flag=None))
    elif what in KNOWN_DATA:
        print(resolve_data(what, flag=None))
    else:
        print(resolve_model(what, flag=None))


def add_command_flags(ev, an, en, se):
    """The flags of eval, analyze, encode and search that are their own."""
    ev.groups[0].add_argument("--tasks", default="sts", metavar="TASKS", choices=(
        "sts", "transfer", "sts,transfer"), help="sts, transfer (SentEval's 7) or sts,transfer")
    ev.groups[0].add_argument("--mode", default="test", choices=("test", "dev", "fasttest"),
                              help="test: STS12-16, STS-B, SICK-R test, transfer 10-fold (the "
                              "papers'); dev: STS-B dev, SICK-R trial; fasttest, dev: 5-fold")
    ev.groups[0].add_argument("--sts_file", default="", help="your own pairs, not SentEval's: a "
                              "TSV of sentence 1, sentence 2, score (a header row allowed)")
    ev.groups[1].add_argument("--json", default="", help="also write the scores to this JSON file")
    an.groups[0].add_argument("--compare", nargs="+", default=[], help="more model folders or "
                              "names, drawn beside it")
    an.groups[0].add_argument("--runs", nargs="+", default=[], help="results.json files whose "
                              "alignment/uniformity history is drawn as a trajectory (a model "
                              "folder's own is found)")
    an.groups[1].add_argument("--out", required=True, help="folder for analysis.json and the "
                              "three .svg figures")
    en.groups[0].add_argument("--input", required=True, help="text file, one sentence a line")
    en.groups[1].add_argument("--out", required=True, help="vectors.npy: row i = line i + 1 "
                              "(float32); vectors.json beside it names model, pooler and count")
    se.groups[0].add_argument("--corpus", required=True, help="text file, one sentence a line")
    se.groups[0].add_argument("--vectors", default="", help="encode's .npy of --corpus (else: now)")
    asked = se.groups[0].add_mutually_exclusive_group(required=True)
    asked.add_argument("--query", help="one query")
    asked.add_argument("--queries", help="text file, one query a line")
    se.groups[1].add_argument("--top_k", type=int, default=10, help="results per query")
    se.groups[1].add_argument("--json", action="store_true", help="JSON Lines: a result a line")


def run_eval(args):
    """A model's STS and/or transfer table, or --sts_file's scores (--json: all it printed)."""
    if args.sts_file and (args.tasks, args.mode, args.senteval) != ("sts", "test", ""):
        raise UserError("--sts_file scores that file alone: drop --tasks, --mode and --senteval")
    modes = args.tasks.replace("sts", "dev" if args.mode == "dev" else "test").split(",")
    device, root, _ = check_cli_inputs(args, [args.model], [] if args.sts_file else modes)
    own = {"sts_file": {"test": read_sts_pairs(args.sts_file, "--sts_file")}} \
        if args.sts_file else None  # your pairs, a key no table has, whatever the file's name
    tok, model = load_encoder(args.model, device)
    results = {}
    run = (args.pooler, args.batch_size)
    if modes[0] != "transfer":  # fasttest's STS table: the test one [SimCSE evaluation.py]
        results = evaluate_sts(model, tok, root, modes[0], *run, tasks=own,
                               progress=Progress(f"STS {modes[0]}"))
    if "transfer" in modes:
        results["transfer"] = evaluate_transfer(model, tok, root, args.mode, *run,
                                                progress=Progress("transfer"))
    tables = ((results, list(own or TEST_TASKS)), (results.get("transfer"), TRANSFER_TASKS))
    for table, names in tables:
        if table and "details" in table:
            print(format_table(table, names) + f"\n({table['details']['sentences_encoded']} "
                  f"sentences encoded; {table['details']['seconds']:.1f}s in all)")
    for name in own or {}:  # and Pearson x 100 and n, as SentEval reports them
        print("{name}: Spearman {spearman:.2f}, Pearson {pearson:.2f}, n {n}".format(
            name=args.sts_file, **results["details"][name]["test"]))
    if args.json:  # a pipe or /dev/stdout: written through, never replaced [issue 52]
        write_json(Path(args.json).expanduser(), results, indent=1, through=args.through)
    return results


def run_analyze(args):
    """Each model on STS-B test and dev, each run's dev path -> analysis.json, 3 SVGs in --out."""
    names = [args.model, *args.compare]
    runs = list(args.runs)
    out = Path(args.out).expanduser()
    given = [Path(r).expanduser().resolve() for r in runs]  # and each model's own run, if any:
    runs += [found for found in (Path(name).expanduser() / "results.json" for name in names)
             if found.is_file() and found.resolve() not in given]
    device, root, runs = check_cli_inputs(args, names, ["test", "dev"], runs=runs)
    models = []
    for i, name in enumerate(names):
        tok, model = load_encoder(name, device)
        label = Path(name).name or name
        label += f" #{i + 1}" if label in [m["name"] for m in models] else ""
        pooler = args.pooler or default_pooler(name)  # each model's own, as SimCSE's tool.py's
        entry = {"name": label, "path": name, "color": COLORS[i % len(COLORS)], "pooler": pooler}
        for split in ("test", "dev"):
            entry[split] = analyze_model(model, tok, root, pooler, split, args.batch_size)
        models.append(entry)
    colors = {Path(m["path"]).expanduser().resolve(): m["color"] for m in reversed(models)}
    for j, r in enumerate(runs, len(models)):  # in its model's colour, else in the next free one
        r["color"] = colors.get(Path(r["path"]).resolve().parent, COLORS[j % len(COLORS)])
    plot_plane(models, runs, out / "align_uniform.svg")
    plot_singular_values(models, out / "singular_values.svg")
    plot_similarity_by_score(models, out / "similarity_by_score.svg")
    write_json(out / "analysis.json", {"models": models, "runs": runs}, indent=1)
    print(f"{'model':<28} | stsb test | align test | uniform test | align dev | uniform dev")
    for m in models:
        t, d = m["test"], m["dev"]
        print(f"{m['name'][:28]:<28} | {t['stsb_spearman']:9.2f} | {t['alignment']:10.4f} | "
              f"{t['uniformity']:12.4f} | {d['alignment']:9.4f} | {d['uniformity']:11.4f}")
    print(f"{', '.join(ANALYSIS_FILES)} in {out}")
    return models


def load_encoder(name, device):
    """A checked model folder or known name (fetched in Part 2), on device. Its pretraining heads
    go unsaid (the vectors never use them); a training model's other parts are named."""
    return Tokenizer.from_pretrained(name), Bert.from_pretrained(name, quiet="heads").to(device)


def check_cli_inputs(args, names, modes, runs=()):
    """Every input checked before any work (the first problem: one UserError line); then the
    output's folder is made. -> (device, SentEval root, the runs loaded)"""
    device = resolve_device(args.device)
    for flag in ("batch_size", "top_k"):  # search's top_k
        if getattr(args, flag, 1) < 1:
            raise UserError(f"--{flag} {getattr(args, flag)}: must be at least 1")
    files = {f: getattr(args, f, "") for f in ("input", "corpus", "vectors", "queries", "sts_file")}
    check_names(args, [*files, "senteval", "model"])  # a name the file system cannot hold: now
    for flag, path in files.items():  # the one rule of inputs; --sts_file's pairs read whole
        if path:
            check_file(path, f"--{flag}", whole=flag == "sts_file")
    for i, name in enumerate(names):  # a known name is fetched when loaded (Part 2, as in training)
        check_model(name, "--compare" if i else "--model")
    runs = [load_run(path) for path in runs]
    flag = "--json" if args.command == "eval" else "--out"  # search's --json: a switch
    out = getattr(args, flag[2:], "")
    if out:  # a folder (analyze) or a file (--json, encode) can be made there: nothing created
        p = Path(out).expanduser().absolute()
        is_dir = args.command == "analyze"
        written = {"analyze": [p / n for n in ANALYSIS_FILES], "eval": [p],
                   "encode": [p, p.with_suffix(".json")]}[args.command]
        # encode --out x.json, or x.JSON (one file where names ignore case): the vectors lost
        if len({str(w).casefold() for w in written}) < len(written):
            raise UserError(f"{flag} {out}: encode's vectors and their JSON would be one file: "
                            f"name it {p.stem}.npy")
        read = [*names, *(r["path"] for r in runs), *files.values(), getattr(args, "senteval", "")]
        args.through = [w for w in written if check_output(flag, w, read, through=flag == "--json")]
        folder = p if is_dir else p.parent  # where the output goes
        base = next(a for a in (folder, *folder.parents) if a.exists())  # its nearest existing part
        if not args.through and not (base.is_dir() and os.access(base, os.W_OK)):  # a pipe: there
            raise UserError(f"{flag} {out}: cannot write a {'folder' if is_dir else 'file'} there")
    root = resolve_senteval(args.senteval, modes[0]) if modes else None  # else a download
    for mode in modes[1:]:
        check_senteval(root, mode)
    if out:
        folder.mkdir(parents=True, exist_ok=True)
    return device, root, runs


def load_run(path):
    """A finished run's folder or its results.json -> its name and alignment/uniformity history."""
    p = Path(path).expanduser()
    r = read_run(path, "--runs")
    if not (isinstance(r.get("align_uniform"), list) and r["align_uniform"] and all(
            isinstance(x, list) and len(x) == 3 and type(x[0]) is int and all(  # [step, a, u]
                v is None or type(v) in (int, float) for v in x[1:]) for x in r["align_uniform"])):
        raise UserError(f"--runs {path}: no align_uniform history of [step, alignment, uniformity]"
                        f" (written by training runs since issue 10)")
    return {"path": str(p), "name": r["method"] if p.parent.name == r["method"]
            else f"{r['method']} ({p.parent.name})", "align_uniform": r["align_uniform"],
            "align_uniform_on": r.get("align_uniform_on", "STS-B dev")}


if __name__ == "__main__":
    main_guard(cli)
