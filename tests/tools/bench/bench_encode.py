"""`common.py encode` streams: its peak memory should not grow with the corpus. Encodes N and 10 N
lines (the training sentences cycled, each cut to --words words, a line number added so that
none repeats) in fresh processes and reports each process's peak RSS; then `search` over the
encoded corpus, its time per query. Figures in docs/speed.md.

    python tests/tools/bench/bench_encode.py --model ../shared/models/all-MiniLM-L6-v2 \\
        --data ../shared/data/wiki1m_head.txt --lines 20000"""
import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def child(argv):
    """Run one common.py command in this process; print its peak RSS (MiB) and seconds."""
    sys.path.insert(0, str(ROOT))
    import common
    start = time.time()
    common.main_guard(common.cli, argv)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    print(json.dumps({"peak_mib": round(peak, 1), "seconds": round(time.time() - start, 1)}))


def run(argv):
    out = subprocess.run([sys.executable, __file__, "--child", *argv], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def corpus(path, lines, n, words):
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            f.write(" ".join(lines[i % len(lines)].split()[:words]) + f" {i}\n")


def main():
    if sys.argv[1:2] == ["--child"]:
        return child(sys.argv[2:])
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True, help="sentences, one a line")
    p.add_argument("--lines", type=int, default=20_000, help="the small corpus; the large: 10x")
    p.add_argument("--words", type=int, default=8, help="words kept of each sentence")
    p.add_argument("--queries", type=int, default=20)
    args = p.parse_args()
    lines = Path(args.data).read_text(encoding="utf-8").splitlines()
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, python "
          f"{platform.python_version()}; model {args.model}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        results = {}
        for n in (args.lines, 10 * args.lines):
            corpus(f"{tmp}/c{n}.txt", lines, n, args.words)
            results[n] = run(["encode", "--model", args.model, "--input", f"{tmp}/c{n}.txt",
                              "--out", f"{tmp}/v{n}.npy", "--device", "cpu"])
            print(f"encode {n:>9,} lines: peak RSS {results[n]['peak_mib']:.0f} MiB, "
                  f"{results[n]['seconds']:.0f} s", flush=True)
        small, large = (results[n]["peak_mib"] for n in (args.lines, 10 * args.lines))
        print(f"peak RSS ratio (10x the lines): {large / small:.3f}")
        with open(f"{tmp}/q.txt", "w", encoding="utf-8") as f:
            f.write("".join(f"{lines[7 * i]}\n" for i in range(args.queries)))
        n = args.lines
        base = ["--model", args.model, "--corpus", f"{tmp}/c{n}.txt", "--device", "cpu",
                "--json"]
        one = run(["search", *base, "--vectors", f"{tmp}/v{n}.npy", "--query", lines[0]])
        many = run(["search", *base, "--vectors", f"{tmp}/v{n}.npy", "--queries", f"{tmp}/q.txt"])
        per_query = (many["seconds"] - one["seconds"]) / (args.queries - 1)
        print(f"search over {n:,} vectors: one query {one['seconds']:.1f} s in all (load, checks);"
              f" each more query {1000 * per_query:.0f} ms")


if __name__ == "__main__":
    main()
