"""The set-up at full scale [issue 54] (a benchmark, not a test): tokenize_file on an N-line corpus
(default 1,000,000: wiki1m_for_simcse.txt's size; make_corpus.py writes a stand-in), cold (an
empty token cache) and cached, each in a fresh process: seconds, peak RSS (ru_maxrss of the process,
and of its tokenizing workers apart), the ids' SHA-256. --repo DIR runs another checkout's common.py
(the code before: `git worktree add /tmp/old 04d782b`), so both run on the same file; --scale
measures more sizes (the first lines of the corpus) to see what the peak grows with.

    python tests/tools/make_corpus.py --out /tmp/wiki1m_standin.txt
    python tests/tools/bench/bench_scale.py --data /tmp/wiki1m_standin.txt --repo /tmp/old \\
        --scale 250000,500000

The machine's load (`uptime`) is printed first and last: on a shared machine the seconds vary."""
import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
MODEL = ROOT.parent / "shared/models/all-MiniLM-L6-v2"


def rss_mib():  # this process's resident memory now
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def child(repo, data, model):
    """One tokenize_file in this process (SIMCSE_CACHE set by the parent): a JSON line."""
    sys.path.insert(0, str(repo))
    import common
    tok = common.Tokenizer.from_pretrained(model)
    base = rss_mib()  # torch, numpy and the vocabulary: there before any data
    start = time.time()
    rows, seconds, hit = common.tokenize_file(tok, data, 32)
    wall = time.time() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # the largest one
    cpu = [sum(resource.getrusage(who)[:2]) for who in (resource.RUSAGE_SELF,
                                                         resource.RUSAGE_CHILDREN)]
    print(json.dumps({"seconds": round(wall, 2), "hit": hit, "peak_mib": round(peak),
                      "workers_peak_mib": round(workers),
                      "cpu_s": round(cpu[0], 1), "workers_cpu_s": round(cpu[1], 1),
                      "before_data_mib": round(base),
                      "rows": len(rows), "tokens": int(len(rows.flat)),
                      "ids_sha256": hashlib.sha256(rows.flat.astype("<i4").tobytes()
                                                   + rows.offsets.astype("<i8").tobytes())
                      .hexdigest()[:16]}))


def tree_mib(pid, fields=("Rss:",)):
    """A process's resident memory (MiB) plus its children's private memory: a forked worker's
    pages shared with the parent are counted once, in the parent's RSS."""
    total = 0
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith(fields):
                total += int(line.split()[1]) / 1024
    except OSError:  # ended meanwhile
        return total
    private = ("Private_Clean:", "Private_Dirty:")
    return total + sum(tree_mib(int(c), private) for c in children)


def measure(repo, data, model, cache):
    env = dict(os.environ, SIMCSE_CACHE=str(cache), OMP_NUM_THREADS="1")
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, __file__, "--child", str(repo), str(data),
                                 str(model)], stdout=out, stderr=err, text=True, env=env)
        peak = 0.0
        while proc.poll() is None:  # the whole tree's memory, sampled every 0.1 s
            peak = max(peak, tree_mib(proc.pid))
            time.sleep(0.1)
        out.seek(0)
        err.seek(0)
        if proc.returncode:
            sys.exit(f"{repo}: {err.read()[-2000:]}")
        return json.loads(out.read().strip().splitlines()[-1]) | {"tree_mib": round(peak)}


def first_lines(data, n, folder):
    path = Path(folder) / f"first{n}.txt"
    with open(data, encoding="utf-8") as src, open(path, "w", encoding="utf-8") as out:
        for i, line in enumerate(src):
            if i == n:
                break
            out.write(line)
    return path


def load():
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def sizes(text):
    """--scale's "250000,500000" -> [250000, 500000]."""
    try:
        return [int(n) for n in text.split(",") if n]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not line counts such as 250000,500000")


def main():
    sys.path.insert(0, str(ROOT))  # here, not above: a child imports its --repo's common
    import common
    p = common.OneLineErrors(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, help="the N-line corpus (make_corpus.py)")
    p.add_argument("--model", type=Path, default=MODEL, help="its vocab.txt is what counts")
    p.add_argument("--repo", type=Path, action="append", default=[],
                   help="another checkout to compare (repeatable); this one is always run")
    p.add_argument("--scale", type=sizes, default=[],
                   help="more sizes, first lines of --data: 250000,500000")
    common.main_guard(bench, p.parse_args(), common)


def bench(args, common):
    """Each size of the corpus, cold and cached, in each checkout: a row each."""
    if not args.data:
        raise common.UserError("--data is required: the N-line corpus (make_corpus.py)")
    common.check_file(args.data, "--data")
    common.check_model(args.model, "--model")
    print(f"load: {load()}; {os.cpu_count()} CPUs", flush=True)
    repos = [*args.repo, ROOT]
    with tempfile.TemporaryDirectory() as tmp:
        files = [first_lines(args.data, n, tmp) for n in args.scale]
        print(f"{'code':<16} {'lines':>9} {'cold s':>7} {'cpu s':>6} {'workers cpu s':>13} "
              f"{'cached s':>8} {'peak MiB':>9} {'workers':>8} {'all MiB':>8} {'cached peak':>11} "
              f"{'tokens':>11}  ids sha256", flush=True)
        for data in [*files, args.data]:
            for repo in repos:
                cache = Path(tmp) / f"cache{len(os.listdir(tmp))}"
                cold = measure(repo, data, args.model, cache)
                warm = measure(repo, data, args.model, cache)
                assert not cold["hit"] and warm["hit"], (cold, warm)
                print(f"{str(repo)[-16:]:<16} {cold['rows']:>9,} {cold['seconds']:>7.1f} "
                      f"{cold['cpu_s']:>6.1f} {cold['workers_cpu_s']:>13.1f} "
                      f"{warm['seconds']:>8.1f} {cold['peak_mib']:>9} "
                      f"{cold['workers_peak_mib']:>8} {cold['tree_mib']:>8} "
                      f"{warm['peak_mib']:>11} "
                      f"{cold['tokens']:>11,}  {cold['ids_sha256']}", flush=True)
    print(f"load: {load()}")
    print("peak MiB: the tokenizing process (the parent), from a process of "
          f"~{cold['before_data_mib']} MiB before any data (torch, numpy, the vocabulary); "
          "workers: the largest tokenizing worker's own peak (0: none; a forked worker shares "
          "the parent's pages until it writes them); all MiB: the most the process and its "
          "workers held together (the parent's RSS + the workers' private pages, sampled every "
          "0.1 s); cpu s: the process's user + system "
          "seconds, workers cpu s: all its workers' together")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:  # measure()'s process: REPO DATA MODEL
        child(*sys.argv[2:5])
    else:
        main()
