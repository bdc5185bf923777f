"""Benchmark of the STS evaluation (not collected by pytest): the full test table and the dev scores
for every pooler, timed, with --pooler avg checked against the official SimCSE evaluation.py
numbers.

    python tests/tools/bench/bench_eval.py --model ../shared/models/all-MiniLM-L6-v2 --senteval
    ../shared/data/senteval

Takes ~10 minutes on a 2-core CPU. Exit status 1 when avg differs from the reference by more than
--tol.
"""
import argparse
import os
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root
import common  # noqa: E402

# official evaluation.py --mode test --task_set sts --pooler avg on all-MiniLM-L6-v2
# (../shared/data/README.md)
REFERENCE_AVG = {"STS12": 72.37, "STS13": 80.60, "STS14": 75.59, "STS15": 85.39, "STS16": 78.99,
                 "STSBenchmark": 82.03, "SICKRelatedness": 77.15, "Avg": 78.87}
DEV_TASKS = ["STSBenchmark", "SICKRelatedness"]


def short(task):
    return common.SHORT_NAMES.get(task, task)


def md_table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


def main(argv=None):
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=os.environ.get("SIMCSE_TEST_MODEL", ""))
    p.add_argument("--senteval", default=os.environ.get("SIMCSE_SENTEVAL", ""))
    p.add_argument("--poolers", default=",".join(common.POOLERS))
    p.add_argument("--batch_size", type=int, default=128)
    p.add_argument("--device", default="cpu")
    p.add_argument("--tol", type=float, default=0.02, help="allowed |ours - official| per task "
                                                           "(avg pooler)")
    args = p.parse_args(argv)
    if not args.model or not args.senteval:
        p.error("--model and --senteval are required (or SIMCSE_TEST_MODEL / SIMCSE_SENTEVAL)")
    poolers = args.poolers.split(",")

    device = common.resolve_device(args.device)
    root = common.resolve_senteval(args.senteval)
    t0 = time.time()
    tok, model = common.Tokenizer.from_pretrained(args.model), common.Bert.from_pretrained(
        args.model, quiet=True
    )
    model = model.to(device).eval()
    t_model = time.time() - t0
    t0 = time.time()
    test_tasks, dev_tasks = common.load_sts(root, "test"), common.load_sts(root, "dev")
    t_data = time.time() - t0
    print(f"# bench_eval: {Path(args.model).name} on {device} "
          f"({platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, torch {torch.__version__}, {torch.get_num_threads()} threads); "
          f"model load {t_model:.1f}s, data load {t_data:.1f}s", flush=True)

    test, dev = {}, {}
    for pooler in poolers:
        t0 = time.time()
        test[pooler] = common.evaluate_sts(model, tok, root, "test", pooler, args.batch_size,
                                           tasks=test_tasks)
        test[pooler]["wall"] = time.time() - t0
        print(f"test {pooler:>14}: {test[pooler]['wall']:6.1f}s  Avg {test[pooler]['Avg']:.2f}",
              flush=True)
        t0 = time.time()
        dev[pooler] = common.evaluate_sts(model, tok, root, "dev", pooler, args.batch_size,
                                          tasks=dev_tasks)
        dev[pooler]["wall"] = time.time() - t0
        print(f"dev  {pooler:>14}: {dev[pooler]['wall']:6.1f}s  STS-B dev "
              f"{dev[pooler]['STSBenchmark']:.2f}",
              flush=True)

    # the training-time quick path must give the same STS-B dev number as the full dev evaluation
    # (cls_before_pooler, the raw [CLS], evaluate_dev's default)
    devset_line, devset_ok = "", True
    if "cls_before_pooler" in dev:
        t0 = time.time()
        dev_set = common.DevSet(tok, dev_tasks["STSBenchmark"]["dev"], model.cfg.max_tokens)
        quick = common.evaluate_dev(model, dev_set)["stsb_dev"]
        diff = quick - dev["cls_before_pooler"]["STSBenchmark"]
        devset_ok = abs(diff) <= 1e-6
        devset_line = (f"evaluate_dev (raw [CLS]) = {quick:.4f} in {time.time() - t0:.1f}s; "
                       f"evaluate_sts dev = {dev['cls_before_pooler']['STSBenchmark']:.4f}; "
                       f"diff {diff:+.2e} {'OK' if devset_ok else 'MISMATCH'}")

    tasks = [*common.TEST_TASKS, "Avg"]
    print("\n## Test table (Spearman x 100, 'all' for STS12-16), seconds for the whole table\n")
    rows = [[pooler, *(f"{test[pooler][t]:.2f}" for t in tasks), f"{test[pooler]['wall']:.1f}",
             test[pooler]["details"]["sentences_encoded"]] for pooler in poolers]
    print(md_table(["pooler", *map(short, tasks), "seconds", "sentences"], rows))

    print("\n## Dev (STS-B dev, SICK-R trial)\n")
    rows = [[pooler, *(f"{dev[pooler][t]:.2f}" for t in DEV_TASKS), f"{dev[pooler]['wall']:.1f}",
             dev[pooler]["details"]["sentences_encoded"]] for pooler in poolers]
    print(md_table(["pooler", *(f"{short(t)} dev" for t in DEV_TASKS), "seconds", "sentences"],
                   rows))

    ok = devset_ok
    if "avg" in test:
        print(f"\n## avg vs official evaluation.py (tolerance {args.tol})\n")
        rows = []
        for t in tasks:
            ours = test["avg"][t]
            diff = round(ours, 2) - REFERENCE_AVG[t]  # the official prints "%.2f"
            good = abs(ours - REFERENCE_AVG[t]) <= args.tol + 0.005 and abs(diff) <= args.tol + 1e-9
            ok &= good
            rows.append([short(t), f"{ours:.4f}", f"{REFERENCE_AVG[t]:.2f}", f"{diff:+.2f}", "ok"
                         if good else "FAIL"])
        print(md_table(["task", "ours", "official", "diff (rounded)", ""], rows))
        d = test["avg"]["details"]
        print("\n'all' vs mean / wmean of subsets (avg pooler): " + "; ".join(
            f"{y} {test['avg'][y]:.2f} / {d[y]['mean']:.2f} / {d[y]['wmean']:.2f}" for y
                                                                              in common.STS_YEARS))
    if devset_line:
        print("\n" + devset_line)
    total = sum(r["wall"] for r in [*test.values(), *dev.values()])
    print(f"\ntotal evaluation time {total:.1f}s; {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(common.main_guard(main))
