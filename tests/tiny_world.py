"""A tiny, self-contained world for end-to-end tests: a 2-layer BERT folder (with and without an MLM
head), a small training file and a SentEval folder in the real layout with a few pairs per file.
Seconds on a CPU."""
import random

import numpy as np
import torch

import common

WORDS = ("a man woman child dog cat is are the playing eating running guitar ball food on in with "
         "park "
         "street house car big small red blue old young").split()


def make_vocab():
    letters = "abcdefghijklmnopqrstuvwxyz"
    tokens = list(common.SPECIAL_TOKENS) + WORDS + list(letters) + ["##" + c for c
                                                                    in letters] + [".", ","]
    return list(dict.fromkeys(tokens))  # "a" is a word and a letter: one line, ids without a gap


def tokenizer():
    return common.Tokenizer({t: i for i, t in enumerate(make_vocab())})


def sentence(rng):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) + " ."


def make_model(folder, mlm_head=False, seed=0, pooler=False):
    """A tiny BERT saved as transformers does; pooler: with BERT's pooler, as bert-base-uncased and
    every released checkpoint [issue 57]."""
    torch.manual_seed(seed)
    tok = tokenizer()
    model = common.Bert(common.BertConfig.tiny(vocab_size=len(tok.vocab)), mlm_head=mlm_head,
                        pooler=pooler)
    common.save_pretrained(model, folder, tok)
    return folder


def senteval_text(rel, rows):
    """A SentEval file's text in its real format (the files in ../shared) holding rows [(a, b,
    gold)], or None for a file the STS tasks do not read."""
    name = rel.rsplit("/", 1)[-1]
    if name.startswith("STS.input."):
        return "".join(f"{a}\t{b}\n" for a, b, _ in rows)
    if name.startswith("STS.gs."):
        return "".join(f"{g}\n" for _, _, g in rows)
    if name in ("sts-train.csv", "sts-dev.csv", "sts-test.csv"):
        return "".join(f"genre\tfile\tyear\t{i:04d}\t{g}\t{a}\t{b}\n" for i, (a, b, g)
                       in enumerate(rows))
    if name in ("SICK_train.txt", "SICK_trial.txt", "SICK_test_annotated.txt"):
        return "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n" + \
               "".join(f"{i}\t{a}\t{b}\t{g}\tNEUTRAL\n" for i, (a, b, g) in enumerate(rows))
    return None


def sentence_pairs(rng, n):
    return [(sentence(rng), sentence(rng), f"{rng.uniform(0, 5):.2f}") for _ in range(n)]


def make_senteval(root, n=8, seed=0):
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    for rel in common.sts_files("test") + common.sts_files("dev"):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        text = senteval_text(rel, sentence_pairs(rng, n))
        if not path.exists():
            path.write_text(text)
    return root


def make_world(tmp, pooler=False, mlm_head=False):
    """A model (pooler: with BERT's; mlm_head: with BERT's MLM head, as every released checkpoint),
    DiffCSE's generator (an MLM head), 48 sentences, a SentEval folder."""
    rng = random.Random(1)
    data = tmp / "train.txt"
    data.write_text("".join(sentence(rng) + "\n" for _ in range(48)))
    model = make_model(tmp / "model", mlm_head=mlm_head, pooler=pooler)
    generator = make_model(tmp / "generator", mlm_head=True, pooler=pooler)
    return dict(model=str(model), generator=str(generator), data=str(data),
                senteval=str(make_senteval(tmp / "senteval")))


def seeded_run_folder(folder, seed=0, pooler="cls_before_pooler"):
    """What a run saves, with weights that are the same on every torch: a tiny BERT whose pooler is
    an MLP head, every parameter N(0, 0.3) from numpy's seeded generator, saved by
    save_pretrained (pooler: the test vector; cls, supervised SimCSE's, adds the Dense module)."""
    tok = tokenizer()
    model = common.Bert(common.BertConfig.tiny(vocab_size=len(tok.vocab)), pooler=True)
    rng = np.random.RandomState(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.from_numpy(rng.normal(0, 0.3, tuple(p.shape))))
    common.save_pretrained(model, folder, tok, pooler)
    return tok, model


def stsb_dev(root):
    """STS-B dev's (sentences A, B, gold): the pairs a training run's DevSet holds by default."""
    return common.load_sts(root, "dev")["STSBenchmark"]["dev"]
