"""Learn by doing: write each method's core yourself, graded by the project's own oracles, with the
mistake named when it is a known one [issue 56; minbpe's exercise.md]. Stdlib + torch.

    python tests/tools/exercise.py list              # the path, in reading order, with equations
    python tests/tools/exercise.py start info-nce    # blanks the function under its docstring
    python tests/tools/exercise.py check info-nce    # its oracle tests; a known mistake is named
    python tests/tools/exercise.py reset info-nce    # our body back, byte for byte
    python tests/tools/exercise.py selftest [NAME]   # blank fails, mutants named, ours passes

`start` keeps the file as it found it in .exercises/ (ignored by git; git is not needed), and
`reset` takes our function from there, byte for byte, even from a file that no longer parses or
whose function was deleted; functions are found by name with ast, so other edits in the files do
not matter. `check` runs the exercise's oracle tests alone, in a child process with a time limit;
when they fail, a second child runs your function and each known mistake of it
(tests/tools/mutants.py: our body with one line changed) on the same inputs and names the mistake
yours behaves like, with its `why`. Whatever your code does (loop, exit, raise), `check` ends
with one line. docs/exercises.md is the guide.
"""
import argparse
import ast
import collections
import difflib
import io
import itertools
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tokenize
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "tools")]
from mutants import MUTANTS  # noqa: E402
import mutate  # noqa: E402

STORE = ".exercises"  # in the tree, ignored by git: each file as `start` found it
# seconds for each of check's two children: attention, the slowest, passes in 25 s on two shared
# cores, 70 s on two cores under five other jobs (the others in 10 to 40 s); a slow machine has
# four times that
LIMIT = 300
VERDICT = "exercise verdict: "  # how check's second child marks its one line of JSON

Exercise = collections.namedtuple("Exercise", "name file functions equation read tests mutants")
S, E, P, D, C = "simcse_min.py", "esimcse_min.py", "simcsepp_min.py", "diffcse_min.py", "common.py"
MASKING = C  # the shared mask_tokens in Part 1 (DiffCSE and --do_mlm)

EXERCISES = [  # reading order: simcse_min.py, the three diffs, then common.py's Part 1
    Exercise("info-nce", S, ["info_nce"], "SimCSE Eq. 1 (unsupervised InfoNCE)",
             "simcse_min.py's docstring; SimCSE §3 (arXiv:2104.08821). Ignore h3 for now.",
             ["test_simcse.py::test_info_nce_matches_loop_values_and_gradients[False]",
              "test_simcse.py::test_identical_rows_give_log_B"],
             ["simcse-temperature", "simcse-normalise", "simcse-target", "simcse-direction",
              "simcse-symmetric"]),
    Exercise("hard-negatives", S, ["info_nce"], "SimCSE Eq. 5 (supervised, hard negatives)",
             "SimCSE §4 and Eq. 5; loss_fn passes h[2], Config.hard_weight [official code].",
             ["test_simcse.py::test_info_nce_matches_loop_values_and_gradients",
              "test_simcse.py::test_info_nce_gradcheck",
              "test_simcse.py::test_loss_fn_uses_third_view_as_hard_negatives"],
             ["simcse-hard-weight", "simcse-hard-negatives"]),
    Exercise("make-views", S, ["make_views"], "SimCSE §3 (two dropout views, view-major)",
             "simcse_min.train_step: one pass over all views, then .view(V, B, -1).",
             ["test_simcse.py::test_make_views_unsupervised_duplicates_supervised_keeps_columns"],
             ["simcse-view-order"]),
    Exercise("repeat-subwords", E, ["repeat_subwords"], "ESimCSE §3.1, Eq. 3 (word repetition)",
             "ESimCSE §3.1; common.pad_ids (Part 1). The count, as the official train.py draws "
             "it (not Eq. 3's): randrange(min(10, k)), k = int(dup_rate * n) > 0 of n tokens.",
             ["test_esimcse.py::test_repeat_subwords_follows_the_official_rule",
              "test_esimcse.py::test_repeat_subwords_is_seeded_and_resampled_every_step"],
             ["esimcse-repeat-count", "esimcse-repeat-positions"]),
    Exercise("momentum", E, ["momentum_encoder", "momentum_update"],
             "ESimCSE §3.2, Eq. 5 (momentum encoder)",
             "ESimCSE §3.2; train() calls momentum_update after each optimizer step.",
             ["test_esimcse.py::test_one_step_moves_the_momentum_encoder_and_fills_the_queue"],
             ["esimcse-momentum", "esimcse-momentum-dropout"]),
    Exercise("queue-loss", E, ["info_nce_with_queue"], "ESimCSE Eq. 6 (queued negatives)",
             "ESimCSE §3.2; train_step fills the queue with the momentum encoder's vectors.",
             ["test_esimcse.py::test_info_nce_with_queue_matches_loop_values_and_gradients",
              "test_esimcse.py::test_info_nce_with_queue_gradcheck",
              "test_esimcse.py::test_empty_queue_is_simcse"],
             ["esimcse-queue-normalise", "esimcse-queue-columns", "esimcse-queue-first"]),
    Exercise("off-dropout-nce", P, ["off_dropout_nce"], "SimCSE++ Eq. 3 (off-dropout negatives)",
             "SimCSE++ §3 (arXiv:2305.13192); the docstring says where m goes and why.",
             ["test_simcsepp.py::test_off_dropout_nce_matches_oracle",
              "test_simcsepp.py::test_off_dropout_with_one_view_and_m_1_is_simcse"],
             ["simcsepp-m", "simcsepp-off-dropout-negatives", "simcsepp-m-negative-sum",
              "simcsepp-m-negatives", "simcsepp-cross-negatives"]),
    Exercise("dcl", P, ["dcl_loss"], "SimCSE++ Eq. 5 (dimension-wise contrastive loss)",
             "SimCSE++ §4; the docstring names the official code's choices.",
             ["test_simcsepp.py::test_dcl_loss_matches_oracle",
              "test_simcsepp.py::test_dcl_rewards_correlated_dimensions"],
             ["simcsepp-dcl-variance", "simcsepp-dcl-over-b", "simcsepp-dcl-temperature"]),
    Exercise("bn-projector", D, ["BNProjector.__init__"], "DiffCSE App. A (BatchNorm projector)",
             "DiffCSE App. A; forward() uses self.net; the official ProjectionMLP.",
             ["test_method_parts.py::"
              "test_diffcse_projector_is_linear_bn_relu_linear_bn_without_affine"],
             ["diffcse-bn-affine", "diffcse-relu"]),
    Exercise("mask-tokens", MASKING, ["mask_tokens"], "DiffCSE §3; BERT §3.1 (80/10/10 masking)",
             "BERT §3.1 (arXiv:1810.04805); DiffCSE App. A (30%); train_step's call.",
             [f"test_diffcse.py::test_mask_tokens_{t}" for t in
              ("statistics", "seeded_and_each_view_on_its_own")],
             ["diffcse-mask-share", "diffcse-random-share"]),
    Exercise("rtd-loss", D, ["rtd_loss"], "DiffCSE §3, L_RTD (replaced-token detection)",
             "diffcse_min.py's docstring; DiffCSE §3; ELECTRA (arXiv:2003.10555).",
             ["test_diffcse.py::test_rtd_loss_equals_loop_and_gradcheck",
              "test_diffcse.py::test_rtd_loss_is_unchanged_by_padding_past_the_longest_sentence"],
             ["diffcse-rtd-mean"]),
    Exercise("attention", C, ["Layer.forward"], "Vaswani et al. Eq. 1; BERT's post-LN layer",
             "common.py Part 1, BERT; Attention Is All You Need §3.2; F.scaled_dot_product_"
             "attention.",
             ["test_bert.py::test_padding_does_not_change_real_tokens",
              "test_bert.py::test_dropout_on_in_train_off_in_eval",
              "test_bert.py::test_embed_then_encode_equals_forward",
              "test_bert.py::test_minilm_parity_with_hugging_face",
              "test_fast_path.py::test_cls_only_equals_the_full_last_layer"],
             ["attention-mask", "attention-scale", "attention-dropout", "gelu", "post-ln",
              "pooler-cls"]),
    Exercise("alignment-uniformity", C, ["alignment", "uniformity"],
             "Wang & Isola 2020, Eq. 2 and 3",
             "Wang & Isola, ICML 2020 (arXiv:2005.10242) §4.1; evaluate_dev logs both.",
             ["test_analysis.py::test_alignment_is_zero_for_identical_pairs_at_any_scale",
              "test_analysis.py::test_alignment_known_values",
              "test_analysis.py::test_uniformity_known_values_and_distinct_pairs_only"],
             ["alignment-unnormalised", "uniformity-diagonal", "uniformity-t"]),
]
BY_NAME = {x.name: x for x in EXERCISES}
BLANK = "raise NotImplementedError"
SIBLINGS = [S, E, P, D, C]


# ---- Reading and writing the files, their line ends kept

def read(path):
    """The file's text, each line end as it is (CRLF stays CRLF)."""
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        sys.exit(f"error: {path.name} is not UTF-8 (byte {e.start}): save it as UTF-8")


def write(path, text):
    """All or nothing: a write stopped halfway leaves the old file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".exercise-tmp")
    tmp.write_bytes(text.encode("utf-8"))
    if path.exists():
        shutil.copymode(path, tmp)
    os.replace(tmp, path)


def lines_of(text):
    """text's lines with their ends, split where Python counts lines (\\n, \\r\\n, \\r)."""
    return io.StringIO(text, newline="").readlines()


def syntax_error(file, text):
    """'simcse_min.py line 97: invalid syntax', or None when the text compiles."""
    try:
        compile(text, file, "exec", dont_inherit=True)
    except SyntaxError as e:
        return f"{file} line {e.lineno}: {e.msg}"
    except ValueError as e:  # a NUL byte
        return f"{file}: {e}"
    return None


def store(file, qualname, root=None):
    """Where `start` keeps the file as it found it, for this function."""
    return (root or ROOT) / STORE / f"{Path(file).stem}.{qualname}.txt"


def committed(file):
    """The file as the last commit has it, or None (no git, or not a checkout)."""
    try:
        done = subprocess.run(["git", "show", f"HEAD:./{file}"], cwd=ROOT, capture_output=True)
    except FileNotFoundError:
        return None
    return done.stdout.decode("utf-8") if done.returncode == 0 else None


# ---- Finding a function in a file, with ast

def function_node(tree, qualname):
    """The def (or class) named qualname ('Layer.forward') in tree, or None."""
    nodes, found = tree.body, None
    for part in qualname.split("."):
        found = next((n for n in nodes if isinstance(n, (ast.FunctionDef, ast.ClassDef))
                      and n.name == part), None)
        if found is None:
            return None
        nodes = found.body
    return found


def span(text, qualname):
    """-> (first line of the def with its decorators, first line of the body after the docstring,
    end), 0-based, end exclusive; a comment indented under the last statement is the function's
    too. None when text does not parse or holds no such function."""
    try:
        node = function_node(ast.parse(text), qualname)
    except (SyntaxError, ValueError):
        return None
    if node is None:
        return None
    lines = lines_of(text)
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1
    body = node.body
    has_doc = isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None),
                                                           ast.Constant)
    start = body[1].lineno - 1 if has_doc and len(body) > 1 else body[0].lineno - 1
    if has_doc and len(body) == 1:
        start = body[0].end_lineno
    end = node.end_lineno
    for i in range(end, len(lines)):
        if not lines[i].strip():
            continue
        if len(lines[i]) - len(lines[i].lstrip()) <= node.col_offset:
            break
        end = i + 1
    return first, start, end


def function_text(text, qualname):
    first, _, end = span(text, qualname)
    return "".join(lines_of(text)[first:end])


def with_function(text, qualname, new):
    """text with the function qualname (decorators included) replaced by new."""
    lines = lines_of(text)
    first, _, end = span(text, qualname)
    return "".join(lines[:first]) + new + "".join(lines[end:])


def matched(old, new, first, end):
    """Where old[first:end] stands in new, the lines around it matched as diff matches them:
    from what its first line became to what its last became (empty: it was deleted)."""
    blocks = difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes()
    top = next(j1 + first - i1 if tag == "equal" else j1
               for tag, i1, i2, j1, j2 in blocks if i1 <= first < i2)
    bottom = next(j1 + end - i1 if tag == "equal" else j2
                  for tag, i1, i2, j1, j2 in blocks if i1 < end <= i2)
    return top, bottom


def region(text, snapshot, qualname):
    """-> (first, end, ours): the lines of text the function takes and our lines for them, from
    snapshot (the file as `start` found it). Found by name; where text does not parse or the
    function was deleted, where it stood in snapshot, with its blank lines around it."""
    old = lines_of(snapshot)
    first, _, end = span(snapshot, qualname)
    found = span(text, qualname)
    if found:
        return found[0], found[2], old[first:end]
    while first > 0 and not old[first - 1].strip():
        first -= 1
    while end < len(old) and not old[end].strip():
        end += 1
    top, bottom = matched(old, lines_of(text), first, end)
    return top, bottom, old[first:end]


def put_back(text, snapshot, qualname):
    first, end, ours = region(text, snapshot, qualname)
    lines = lines_of(text)
    return "".join(lines[:first] + ours + lines[end:])


def is_ours(text, snapshot, qualname):
    first, end, ours = region(text, snapshot, qualname)
    return lines_of(text)[first:end] == ours


def blanked(text, qualname, name):
    """The function's body replaced by its comments and `raise NotImplementedError`: each trailing
    comment becomes a line naming what the statement assigned ('# logits: [B, B]')."""
    lines = lines_of(text)
    node = function_node(ast.parse(text), qualname)
    _, start, end = span(text, qualname)
    eol = "\r\n" if lines[start - 1].endswith("\r\n") else "\n"
    indent = " " * (node.body[-1].col_offset if start >= end else
                    len(lines[start]) - len(lines[start].lstrip()))
    stmts = [s for s in ast.walk(node) if isinstance(s, ast.stmt) and s is not node
             and s.lineno - 1 >= start]
    kept = []
    for tok in tokenize.generate_tokens(io.StringIO(text, newline="").readline):
        row = tok.start[0]
        if tok.type != tokenize.COMMENT or not start < row <= end:
            continue
        comment = tok.string.lstrip("#").strip()
        if lines[row - 1][:tok.start[1]].strip():  # a trailing comment: name its statement
            inner = min((s for s in stmts if s.lineno <= row <= s.end_lineno),
                        key=lambda s: s.end_lineno - s.lineno)
            if isinstance(inner, ast.Assign):
                targets = [x for t in inner.targets for x in getattr(t, "elts", [t])]
                comment = ", ".join(ast.unparse(x) for x in targets) + ": " + comment
            if isinstance(inner, ast.Return):
                comment = "returns " + comment
        kept.append(f"{indent}# {comment}{eol}")
    tail = f"{indent}{BLANK}  # yours: python tests/tools/exercise.py check {name}{eol}"
    return "".join(lines[:start] + kept + [tail] + lines[end:])


def is_blank(text, qualname):
    body = function_node(ast.parse(text), qualname).body
    code = [s for s in body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    return len(code) == 1 and ast.unparse(code[0]) == BLANK


# ---- start and reset

def start(ex):
    path = ROOT / ex.file
    text = read(path)
    error = syntax_error(ex.file, text)
    if error:
        sys.exit(f"error: {error}: start needs the file to parse (`git diff {ex.file}` shows "
                 f"your edits)")
    said = []  # printed once every function is blanked: a reader gone (`| head`) stops nothing
    for qualname in ex.functions:
        kept = store(ex.file, qualname)
        if kept.is_file():
            said.append(f"{ex.file}: {qualname} is already yours (`reset` to start it over)")
            continue
        if span(text, qualname) is None:
            sys.exit(f"error: no {qualname} in {ex.file}: `git checkout {ex.file}` puts ours back")
        if is_blank(text, qualname):
            sys.exit(f"error: {qualname} is blank but {STORE}/ keeps no copy of ours: "
                     f"`git checkout {ex.file}` puts ours back, then start again")
        write(kept, text)
        text = blanked(text, qualname, ex.name)
        write(path, text)
        said.append(f"{ex.file}: {qualname} blanked; its docstring and comments are the "
                    f"specification")
    print("\n".join(said))
    shown = [f for f in SIBLINGS if f != ex.file
             and any(span(read(ROOT / f), q) for q in ex.functions)]
    siblings = f", and {', '.join(shown)} hold their own {', '.join(ex.functions)}" if shown else ""
    print(f"It implements: {ex.equation}\nRead: {ex.read}\n"
          f"Grade it: python tests/tools/exercise.py check {ex.name}\n"
          f"Ours is still in sight: `git diff {ex.file}` shows it as removed lines{siblings}. "
          f"Leave them unopened until check passes (`git add {ex.file}` now, and `git diff` "
          f"shows only your lines).\n"
          f"Give up: python tests/tools/exercise.py reset {ex.name}  (ours back, byte for byte)")


def reset(ex):
    path = ROOT / ex.file
    for qualname in ex.functions:
        kept = store(ex.file, qualname)
        snapshot = read(kept) if kept.is_file() else committed(ex.file)
        if snapshot is None or span(snapshot, qualname) is None:
            sys.exit(f"error: {ex.name} was never started and there is no git commit to take "
                     f"{qualname} from: a fresh copy of the project has ours")
        text = read(path)
        if not is_ours(text, snapshot, qualname):
            write(path, put_back(text, snapshot, qualname))
        if not is_ours(read(path), snapshot, qualname):
            sys.exit(f"error: {qualname} could not be put back byte for byte; `git checkout "
                     f"{ex.file}` gives the last commit's file (your edits elsewhere in it too)")
        kept.unlink(missing_ok=True)
        print(f"{ex.file}: {qualname} is ours again, byte for byte")
    error = syntax_error(ex.file, read(path))
    if error:
        print(f"note: {error}, outside {', '.join(ex.functions)}: your edit, left as it is")


# ---- Grading: the oracle tests, then the known mistakes on the same inputs

def load(file, text):
    """A fresh module from text (the file's name, its own namespace): yours or a mutant."""
    name = f"exercise_{Path(file).stem}_{next(COUNTER)}"
    module = types.ModuleType(name)
    module.__file__ = str(ROOT / file)
    sys.modules[name] = module  # dataclasses look their module up
    exec(compile(text, str(ROOT / file), "exec"), module.__dict__)
    return module


COUNTER = itertools.count()


def child(cmd, limit):
    """A child process that may never end, or end us: None when it ran out of time. It ends with
    us, whatever ends us (Ctrl-C, SIGTERM), and is waited for: nothing of it is left running."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    with subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, errors="replace", stdin=subprocess.DEVNULL) as process:
        try:
            out, err = process.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            return None
        finally:  # killed and waited for: subprocess.run leaves it a zombie on Ctrl-C
            process.kill()
            process.wait()
    return subprocess.CompletedProcess(cmd, process.returncode, out, err)


def run_tests(ex, limit):
    """The oracle tests -> pytest's finished process, or None when they ran out of time."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--tb=short",
           *(f"tests/{t}" for t in ex.tests)]
    return child(cmd, limit)


def stopped_in_tests(done):
    """How yours stopped the oracle tests, with where ('raised SystemExit (simcsepp_min.py line
    132)'), or None when they ran through: a KeyboardInterrupt stops pytest (exit status 2 and its
    banner), a SystemExit fails its test, an exit ends pytest before its summary line."""
    at, lines = "", done.stdout.splitlines()
    for line in lines:
        if found := re.match(r"(\S+\.py):(\d+): (in \w|KeyboardInterrupt$)", line):
            at = f" ({Path(found[1]).name} line {found[2]})"
        if re.match(r"E\s+SystemExit\b", line):
            return f"raised SystemExit in the oracle tests{at}"
    if done.returncode == 2 and re.search(r"^!+ KeyboardInterrupt !+$", done.stdout, re.M):
        return f"raised KeyboardInterrupt in the oracle tests{at}"
    if not re.search(r"\d+ (passed|failed|errors?)\b|no tests ran", (lines or [""])[-1]):
        return f"ended the process in the oracle tests (exit code {done.returncode})"
    return None


def passed(done):
    """Exit 0 and a summary line that counts passes: a body that ends the process has neither."""
    last = (done.stdout.strip().splitlines() or [""])[-1]
    return (done.returncode == 0 and re.search(r"\d+ passed", last) is not None
            and re.search(r"failed|error", last) is None)


def mutants_of(ex, text, ours):
    """-> ([(mutant, text with our functions, one line changed)], names of those not made): ours
    maps each qualname to our function's text. A mutant whose old text is not once in ours (a
    function edited before `start`) is not made."""
    for qualname, body in ours.items():
        text = with_function(text, qualname, body)
    made, skipped = [], []
    for m in (m for m in MUTANTS if m.name in ex.mutants):
        holders = [q for q, body in ours.items() if body.count(m.old) == 1]
        if not holders:
            skipped.append(m.name)
            continue
        made.append((m, with_function(text, holders[0], ours[holders[0]].replace(m.old, m.new))))
    return made, skipped


def same(a, b, tol=1e-6):
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(
            same(x, y, tol) for x, y in zip(a, b))
    if hasattr(a, "shape"):
        import torch
        return (isinstance(b, torch.Tensor) and a.shape == b.shape
                and torch.allclose(a.double(), b.double(), rtol=tol, atol=tol, equal_nan=True))
    if isinstance(a, float):
        return isinstance(b, (int, float)) and math.isclose(a, b, rel_tol=tol, abs_tol=tol)
    return a == b


def probe(ex, text):
    """What the exercise's functions give on fixed inputs, or what they raised."""
    import probes
    try:
        return getattr(probes, ex.name.replace("-", "_"))(load(ex.file, text))
    except BaseException as e:  # a crash, an exit, an interrupt: an answer too, like no mistake
        return e


def known_mistake(ex, text, ours):
    """-> (the first mutant whose probe equals that of text, or None; text's probe; the names of
    mutants not made)."""
    mine = probe(ex, text)
    if isinstance(mine, BaseException):
        return None, mine, []
    made, skipped = mutants_of(ex, text, ours)
    tol = TOLERANCE.get(ex.name, 1e-6)
    return next((m for m, t in made if same(mine, probe(ex, t), tol)), None), mine, skipped


TOLERANCE = {"mask-tokens": 0.02, "repeat-subwords": 0}  # statistics, not values


def match(ex):
    """check's second child: the known mistake yours behaves like, as one line of JSON."""
    ours = {q: function_text(read(store(ex.file, q)), q) for q in ex.functions}
    m, mine, skipped = known_mistake(ex, read(ROOT / ex.file), ours)
    crash = isinstance(mine, BaseException)
    verdict = {"mistake": m and m.name, "answer": f"{type(mine).__name__}: {mine}"[:300]
               if crash else None, "stops": crash and not isinstance(mine, Exception),
               "skipped": skipped}
    print("\n" + VERDICT + json.dumps(verdict), flush=True)


def run_match(ex, limit):
    """-> the verdict of match, in a child (yours may loop, exit or raise); {'ended': ...} when
    yours ended that child; None when it ran out of time."""
    done = child([sys.executable, str(Path(__file__).resolve()), "match", ex.name], limit)
    if done is None:
        return None
    lines = [x for x in done.stdout.splitlines() if x.startswith(VERDICT)]
    if not lines:
        return {"ended": done.returncode}
    return json.loads(lines[-1][len(VERDICT):])


def not_gradable(ex):
    """The one line that says why there is nothing to grade yet, or None."""
    names = ", ".join(ex.functions)
    text = read(ROOT / ex.file)
    error = syntax_error(ex.file, text)
    if error:
        return f"FAIL {ex.name}: {error}: fix it, or `reset {ex.name}` for ours"
    missing = [q for q in ex.functions if span(text, q) is None]
    if missing:
        return (f"FAIL {ex.name}: no {', '.join(missing)} in {ex.file}: `reset {ex.name}` puts "
                f"ours back")
    if not all(store(ex.file, q).is_file() for q in ex.functions):
        return (f"NOT STARTED {ex.name}: {names} in {ex.file}: ours, nothing of yours to grade; "
                f"`python tests/tools/exercise.py start {ex.name}` blanks it for you to write")
    untouched = [q for q in ex.functions if is_ours(text, read(store(ex.file, q)), q)]
    if untouched:
        return (f"NOT STARTED {ex.name}: {', '.join(untouched)} in {ex.file}: ours, as start "
                f"found it, nothing of yours to grade; `reset {ex.name}`, then `start "
                f"{ex.name}` again")
    blank = [q for q in ex.functions if is_blank(text, q)]
    if blank:
        return (f"FAIL {ex.name}: {', '.join(blank)} still raises NotImplementedError: write it "
                f"(its docstring is the specification)")
    return None


def why_it_failed(ex, done, verdict):
    """What the oracle tests' failure and the second child's verdict say, ending in one line."""
    if "ended" in verdict:
        return (f"FAIL {ex.name}: yours ended the process (exit code {verdict['ended']}) instead "
                f"of returning: a function returns its value, it never exits")
    if verdict["stops"]:
        return (f"FAIL {ex.name}: yours raised {verdict['answer']}: a function returns its "
                f"value, it never interrupts nor exits")
    if verdict["mistake"]:
        m = next(m for m in MUTANTS if m.name == verdict["mistake"])
        failed = [x.split()[1] for x in done.stdout.splitlines() if x.startswith("FAILED ")]
        return (f"FAIL {ex.name}: yours behaves like a known mistake, {m.name}: {m.why}.\n"
                f"  On the same inputs yours and it agree (failed: {', '.join(failed)}).\n"
                f"  Fix that and check again: the oracle tests may find more.")
    lines = [done.stdout.rstrip()[-3000:]]
    if verdict["skipped"]:
        lines.append(f"({len(verdict['skipped'])} known mistakes not compared: "
                     f"{', '.join(ex.functions)} was edited before start, on the lines they "
                     f"change)")
    answer = f" ({verdict['answer']})" if verdict["answer"] else ""
    lines.append(f"FAIL {ex.name}: the oracle tests above fail; no known mistake gives what "
                 f"yours gives{answer}.")
    return "\n".join(lines)


def check(ex, limit=LIMIT):
    """Grades the learner's function; prints what it found and ends with one line. -> passed."""
    begin = time.time()
    problem = not_gradable(ex)
    if problem:
        print(problem)
        return False
    late = (f"FAIL {ex.name}: {', '.join(ex.functions)} did not return within {limit} s: an "
            f"endless loop? (a slow machine: check {ex.name} --timeout {4 * limit})")
    done = run_tests(ex, limit)
    if done is None:
        print(late)
        return False
    if passed(done):
        print(f"PASS {ex.name}: its oracle tests ({done.stdout.strip().splitlines()[-1]}), in "
              f"{time.time() - begin:.0f} s. `git diff {ex.file}` shows yours against ours.")
        return True
    how = stopped_in_tests(done)
    if how is not None:
        print(f"FAIL {ex.name}: yours {how}: a function returns its value, it never interrupts "
              f"nor exits")
        return False
    verdict = run_match(ex, limit)
    print(late if verdict is None else why_it_failed(ex, done, verdict))
    return False


# ---- The self-test: every exercise on a copy of the tree

def copy_tree(dest):
    """The tracked and untracked files (not ignored), then a commit where git is installed: a
    clone's checkout."""
    mutate.copy_tree(dest)  # as the mutation check copies the tree
    if not shutil.which("git"):
        return
    git = ["git", "-c", "user.name=x", "-c", "user.email=x@x", "-c", "commit.gpgsign=false"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "ours"]):
        subprocess.run(git + args, cwd=dest, check=True, capture_output=True)


def tool(tree, *args):
    cmd = [sys.executable, str(tree / "tests" / "tools" / "exercise.py"), *args]
    done = subprocess.run(cmd, cwd=tree, capture_output=True, text=True,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    return done.returncode, done.stdout + done.stderr


def answer(tree, ex, change=None):
    """Writes our functions, with the mutant `change` where it applies, as the learner's."""
    path = tree / ex.file
    text = read(path)
    for q in ex.functions:
        body = function_text(read(store(ex.file, q, tree)), q)
        if change and body.count(change.old) == 1:
            body = body.replace(change.old, change.new)
        body = body.rstrip("\n") + "  # the learner's\n"  # not ours byte for byte: graded
        text = with_function(text, q, body)
    write(path, text)


def selftest(tree, ex, say=print):
    """start -> check fails; each mutant as the answer -> named with its why; ours as the answer
    -> check passes; reset -> the tree byte for byte as before. -> a list of problems."""
    files = {p: p.read_bytes() for p in tree.rglob("*.py") if ".git" not in p.parts}
    problems = []
    tool(tree, "start", ex.name)
    code, out = tool(tree, "check", ex.name)
    if code == 0 or "NotImplementedError" not in out:
        problems.append(f"{ex.name}: blank not failed: {out[-300:]}")
    for m in (m for m in MUTANTS if m.name in ex.mutants):
        answer(tree, ex, m)
        code, out = tool(tree, "check", ex.name)
        if code == 0 or f"{m.name}: {m.why}" not in out:
            problems.append(f"{ex.name}: mutant {m.name} not named: {out[-500:]}")
        say(f"  {ex.name}: {m.name} {'named' if f'{m.name}: {m.why}' in out else 'MISSED'}")
    answer(tree, ex)
    begin = time.time()
    code, out = tool(tree, "check", ex.name)
    if code != 0:
        problems.append(f"{ex.name}: ours fails its check: {out[-500:]}")
    say(f"  {ex.name}: ours {'passes' if code == 0 else 'FAILS'} in {time.time() - begin:.1f} s")
    tool(tree, "reset", ex.name)
    changed = [str(p) for p, b in files.items() if p.read_bytes() != b]
    if changed:
        problems.append(f"{ex.name}: reset left {changed} changed")
    return problems


class OneLineErrors(argparse.ArgumentParser):
    """A bad argument: one line and exit status 2, as common.py's parser; without importing
    common.py (torch, scipy: 3 s), so that list, start and reset answer at once."""

    def error(self, message):
        print(f"error: {message} (see --help)", file=sys.stderr)
        sys.exit(2)


def main():
    first = " ".join(__doc__.split("\n\n")[0].split())  # the first paragraph, whole
    parser = OneLineErrors(description=first, allow_abbrev=False)
    parser.add_argument("command", choices=["list", "start", "check", "reset", "selftest", "match"],
                        help="match: check's own second step")
    parser.add_argument("names", nargs="*", help="exercises (selftest: default all)")
    parser.add_argument("--timeout", type=int, default=LIMIT, metavar="SECONDS",
                        help=f"check: the most seconds for each step of the grading ({LIMIT})")
    args = parser.parse_args()
    unknown = [n for n in args.names if n not in BY_NAME]
    if unknown:
        sys.exit(f"error: no exercise named {', '.join(unknown)} (see `list`)")
    if args.timeout < 1:
        sys.exit(f"error: --timeout {args.timeout}: give it 1 second or more")
    signal.signal(signal.SIGTERM, terminated)  # `kill PID`: ends check's child too, as Ctrl-C
    try:
        try:
            run(args)
        finally:  # a reader gone (`start dcl | head -n 1`) is found here, not at exit
            sys.stdout.flush()
    except BrokenPipeError:  # the reader has all it wanted, as in common.main_guard
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # [Python docs: SIGPIPE]
        sys.exit(1)
    except KeyboardInterrupt:
        stopped_by("Ctrl-C", 130, args.command)
    except Terminated:
        stopped_by("SIGTERM", 128 + signal.SIGTERM, args.command)


class Terminated(BaseException):
    """SIGTERM, raised where the code is, as Ctrl-C raises KeyboardInterrupt."""


def terminated(signum, frame):
    raise Terminated()


def stopped_by(what, code, command):
    """One line and the exit status; check's child, if any, was ended on the way out (child)."""
    print(f"exercise.py {command}: stopped by {what} (no file is left half written)",
          file=sys.stderr)
    sys.exit(code)


def run(args):
    if args.command == "list":
        for i, ex in enumerate(EXERCISES, 1):
            print(f"{i:2}. {ex.name:<21} {ex.file:<15} {', '.join(ex.functions):<30} "
                  f"{ex.equation}")
        return
    if args.command == "selftest":
        with tempfile.TemporaryDirectory(prefix="exercise-selftest-") as tmp:
            copy_tree(Path(tmp))
            problems = [p for n in args.names or BY_NAME for p in selftest(Path(tmp), BY_NAME[n])]
        print("\n".join(problems) or "selftest: every exercise holds")
        sys.exit(1 if problems else 0)
    if len(args.names) != 1:
        sys.exit(f"error: {args.command} takes one exercise name (see `list`)")
    ex = BY_NAME[args.names[0]]
    if args.command == "check":
        sys.exit(0 if check(ex, args.timeout) else 1)
    {"start": start, "reset": reset, "match": match}[args.command](ex)


if __name__ == "__main__":
    main()
