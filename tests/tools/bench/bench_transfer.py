"""Timing of the seven SentEval transfer tasks (not collected by pytest) on synthetic embeddings of
the real task sizes: SentEval's own classifiers (--senteval PATH) or this project's (run_ours).

    OMP_NUM_THREADS=1 /tmp/sev/bin/python tests/tools/bench/bench_transfer.py \
        --senteval /tmp/SentEval --mode test --threads 1 \
        --json /tmp/senteval_timing_test.json                            # SentEval's code
    python tests/tools/bench/bench_transfer.py --mode test --threads 1             # ours, CPU
    python tests/tools/bench/bench_transfer.py --mode test --device cuda           # ours, GPU

/tmp/SentEval: SentEval's transfer files as tests/fixtures/make_transfer_fixtures.py describes them
(for --senteval on a GPU, without its CPU patches), with scikit-learn installed beside them.

The embeddings are 768-dim float32 sentence vectors, class means plus unit Gaussian noise (about
80 % linear accuracy), drawn with numpy's default_rng from a per-task seed, so every run sees the
same numbers. MRPC pairs become [|u - v|, u * v] (1,536 dims) as SentEval's mrpc.py does. Schemes
and configs are those of SentEval's binary.py / sst.py / trec.py / mrpc.py with the classifier
params of SimCSE's evaluation.py (--mode test or fasttest).
"""
import argparse
import json
import platform
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root: common.py

DIM = 768
# per split, the number of sentences (MRPC: pairs) of each class id, in class-id order
TASK_SIZES = {
    "MR": {"scheme": "inner", "train": [5331, 5331]},  # 0 neg, 1 pos
    "CR": {"scheme": "inner", "train": [1370, 2405]},  # 0 neg, 1 pos
    "SUBJ": {"scheme": "inner", "train": [5000, 5000]},  # 0 subjective, 1 objective
    "MPQA": {"scheme": "inner", "train": [7290, 3316]},  # 0 neg, 1 pos
    "SST2": {"scheme": "split", "train": [29780, 37569], "dev": [428, 444], "test": [912, 909]},
    # ABBR, DESC, ENTY, HUM, LOC, NUM
    "TREC": {"scheme": "kfold", "train": [86, 1162, 1250, 1223, 835, 896],
             "test": [9, 138, 94, 65, 81, 113]},
    "MRPC": {"scheme": "kfold", "train": [1323, 2753], "test": [578, 1147]},  # 1 = paraphrase
}
TASKS = list(TASK_SIZES)
SPLITS = ("train", "dev", "test")
N_SENTENCES = sum(sum(sum(c) for k, c in t.items() if k in SPLITS) * (2 if n == "MRPC" else 1)
                  for n, t in TASK_SIZES.items())
assert N_SENTENCES == 122639, N_SENTENCES
assert sum(TASK_SIZES["MR"]["train"]) == 10662 and sum(TASK_SIZES["CR"]["train"]) == 3775
assert sum(TASK_SIZES["SST2"]["train"]) == 67349 and sum(TASK_SIZES["TREC"]["train"]) == 5452

# SimCSE evaluation.py: params for --mode test and --mode fasttest (dev uses fasttest's)
MODES = {
    "test": {"kfold": 10, "classifier": {"nhid": 0, "optim": "adam", "batch_size": 64,
                                         "tenacity": 5, "epoch_size": 4}},
    "fasttest": {"kfold": 5, "classifier": {"nhid": 0, "optim": "rmsprop", "batch_size": 128,
                                            "tenacity": 3, "epoch_size": 2}},
}
SEED = 1111  # SentEval's engine default (params.seed)


def nclasses(task):
    return len(TASK_SIZES[task]["train"])


def embeddings(task):
    """{split: {"X": float32 [n, dim], "y": int64 [n]}} for the task's splits ("train" only for
    MR/CR/SUBJ/MPQA; SST2 has "dev"). Rows are shuffled, deterministic."""
    rng = np.random.default_rng(zlib.crc32(task.encode()))
    ncls = nclasses(task)
    # class means: random directions of length delta (binary Bayes accuracy ~Phi(delta / 2^.5))
    delta = 2.5 if ncls > 2 else 1.45
    means = rng.standard_normal((ncls, DIM)).astype(np.float32)
    means *= delta / np.linalg.norm(means, axis=1, keepdims=True)
    data = {}
    for split in SPLITS:
        if split not in TASK_SIZES[task]:
            continue
        y = np.repeat(np.arange(ncls), TASK_SIZES[task][split])
        y = y[rng.permutation(len(y))].astype(np.int64)
        if task == "MRPC":
            u = rng.standard_normal((len(y), DIM), dtype=np.float32)
            # a paraphrase's v is a little closer to u than a non-paraphrase's
            scale = np.where(y == 1, 1.0, 1.06).astype(np.float32)[:, None]
            v = u + scale * rng.standard_normal((len(y), DIM), dtype=np.float32)
            X = np.c_[np.abs(u - v), u * v]  # mrpc.py: np.c_[np.abs(A - B), A * B]
        else:
            X = means[y] + rng.standard_normal((len(y), DIM), dtype=np.float32)
        data[split] = {"X": np.ascontiguousarray(X, dtype=np.float32), "y": y}
    return data


def run_senteval(task, data, mode, path):
    """SentEval's own scheme for the task, configured as its task file does; -> result dict."""
    if path not in sys.path:
        sys.path.insert(0, path)
    from senteval.tools import classifier as se_classifier
    fits = []  # epochs run by every MLP.fit (SentEval's fit, unchanged): the work done
    original_fit = se_classifier.PyTorchClassifier.fit

    def fit(self, *args, **kwargs):
        best = original_fit(self, *args, **kwargs)
        fits.append(self.nepoch)
        return best

    se_classifier.PyTorchClassifier.fit = fit
    try:
        out = _run_senteval_scheme(task, data, mode)
    finally:
        se_classifier.PyTorchClassifier.fit = original_fit
    out["fits"], out["epochs"] = len(fits), int(sum(fits))
    return out


def _run_senteval_scheme(task, data, mode):
    from senteval.tools.validation import InnerKFoldClassifier, KFoldClassifier, SplitClassifier
    params = MODES[mode]
    scheme = TASK_SIZES[task]["scheme"]
    # binary.py / trec.py / mrpc.py (engine defaults: usepytorch True, nhid 0)
    config = {"nclasses": nclasses(task), "seed": SEED, "usepytorch": True,
              "classifier": params["classifier"], "nhid": 0, "kfold": params["kfold"]}
    if scheme == "inner":
        clf = InnerKFoldClassifier(data["train"]["X"], data["train"]["y"], config)
        devacc, testacc = clf.run()
        return {"devacc": float(devacc), "acc": float(testacc)}
    if scheme == "split":  # sst.py passes neither nhid nor kfold
        config = {"nclasses": nclasses(task), "seed": SEED, "usepytorch": True,
                  "classifier": params["classifier"]}
        clf = SplitClassifier(X={"train": data["train"]["X"], "valid": data["dev"]["X"],
                                 "test": data["test"]["X"]},
                              y={"train": data["train"]["y"], "valid": data["dev"]["y"],
                                 "test": data["test"]["y"]}, config=config)
        devacc, testacc = clf.run()
        return {"devacc": float(devacc), "acc": float(testacc)}
    clf = KFoldClassifier(train=data["train"], test=data["test"], config=config)
    devacc, testacc, yhat = clf.run()
    out = {"devacc": float(devacc), "acc": float(testacc)}
    if task == "MRPC":
        from sklearn.metrics import f1_score
        out["f1"] = float(round(100 * f1_score(data["test"]["y"], yhat), 2))
    return out


def run_ours(task, data, mode, device):
    """common.py's scheme for the task on the same vectors, on `device` -> result dict. Every
    number comes back to the CPU, so a CUDA run is timed to its end."""
    import common
    xy = {split: (d["X"], d["y"]) for split, d in data.items()}
    scheme = TASK_SIZES[task]["scheme"]
    if scheme == "inner":
        devacc, acc = common.inner_kfold({"all": xy["train"]}, mode, device)
        return {"devacc": devacc, "acc": acc}
    if scheme == "split":
        devacc, acc = common.dev_split(xy, mode, device)
        return {"devacc": devacc, "acc": acc}
    devacc, acc, yhat = common.kfold_refit(xy, mode, device)
    out = {"devacc": devacc, "acc": acc}
    if task == "MRPC":
        out["f1"] = common.f1_percent(xy["test"][1], yhat)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    p.add_argument("--senteval", help="a SentEval checkout: time its code, not ours")
    p.add_argument("--mode", choices=sorted(MODES), default="test")
    p.add_argument("--tasks", nargs="+", choices=TASKS, default=TASKS)
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument("--device", default="cpu", help="for run_ours only")
    p.add_argument("--json", help="write the results here (rewritten after every task)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    record = {"impl": "senteval" if args.senteval else "ours", "senteval": args.senteval,
              "mode": args.mode, "threads": args.threads, "device": args.device,
              "python": platform.python_version(), "torch": torch.__version__,
              "numpy": np.__version__, "machine": platform.processor() or platform.machine(),
              "tasks": {}}
    try:
        import sklearn
        record["sklearn"] = sklearn.__version__
    except ImportError:
        pass
    print(f"{'task':6} {'seconds':>9} {'devacc':>7} {'testacc':>7}", flush=True)
    total = 0.0
    for task in args.tasks:
        data = embeddings(task)
        t0 = time.perf_counter()
        if args.senteval:
            res = run_senteval(task, data, args.mode, args.senteval)
        else:
            res = run_ours(task, data, args.mode, args.device)
        res["seconds"] = round(time.perf_counter() - t0, 2)
        total += res["seconds"]
        record["tasks"][task] = res
        record["total_seconds"] = round(total, 2)
        extra = f"  f1 {res['f1']:.2f}" if "f1" in res else ""
        if "fits" in res:
            extra += f"  ({res['fits']} fits, {res['epochs']} epochs)"
        print(f"{task:6} {res['seconds']:9.1f} {res['devacc']:7.2f} {res['acc']:7.2f}{extra}",
              flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(record, f, indent=1)
    print(f"{'total':6} {total:9.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
