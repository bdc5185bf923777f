"""The shape of the code, enforced (STYLE.md §2.1-2.5 and §2.12): the same skeleton in every
*_min.py, allowed imports only, line budgets for the files and for the three parts of common.py, no
line over 100 characters (tests included), diffs against the baseline within budget, train() loops
that differ only in tagged lines, and README commands that name real scripts and flags."""

import ast
import re
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT
SCRIPTS = ["simcse_min.py", "esimcse_min.py", "simcsepp_min.py", "diffcse_min.py"]
TAGS = {"esimcse_min.py": "ESimCSE", "simcsepp_min.py": "SimCSE++", "diffcse_min.py": "DiffCSE"}
RULERS = ["Config", "Views", "Heads", "Loss", "Training step", "Training loop", "CLI"]
ROLES = {"Config": None, "make_views": None, "loss_fn": None, "train_step": None, "train": ["cfg"]}
LINE_CAPS = {"simcse_min.py": 200, "esimcse_min.py": 260, "simcsepp_min.py": 260,
             "diffcse_min.py": 320}  # [STYLE §2.1]
DIFF_BUDGET = {"esimcse_min.py": 105, "simcsepp_min.py": 105, "diffcse_min.py": 160}
# common.py's parts, hard limits [issue 51, STYLE §2.1]: Part 1 (the textbook, RoBERTa's
# tokenizer and gradient caching included) 750, which admits --do_mlm's masking and loss; Part 2
# (operations) 1,850, which admits the fourth nothing-lost pass [issue 40] and the released names;
# Part 3 (command line, figures, encode, search, your own STS pairs, summarize) 920, of which
# SentEval's transfer tasks at most 270. A ceiling guards the reader, not the feature: an issue
# whose feature still needs lines raises its part's ceiling by at most 15 / 35 / 20, named in its
# note. No function over 60. Issues 51-57 raised them, each raise named with its cause in their
# closing note: Part 1 750 -> 771, Part 2 1,850 -> 2,086, Part 3 920 -> 1,075 (transfer tasks 270
# -> 274). Issues 52 (outputs owned; encode and search believe only what they check), 53 (summarize)
# and 54 (the training data streamed into flat arrays) needed more than the per-issue cap: their
# notes give the numbers, for a decision. The review before stop 59 fixed six bugs, named in its
# note: Part 1 +2 (a NaN dev score at training, not an error), Part 2 +5 (a file of no stated
# size, 2_Dense a file), Part 3 +3 (analyze's pooler per model, every method owning a flag).
# Issues 60-63 (stop 60's note): Part 1 773 -> 760 (Bert.forward returns states; LossWatch went to
# Run's section); Part 2 2,091 -> 2,183: +92 over two issues, past the per-issue cap, for a
# decision (issue 61's Run owning its state +61 with LossWatch's 22 from Part 1; issue 63's input
# and output rules, torchrun_env, the token cache's hash, SIGTERM in set-up); Part 3 1,078 -> 1,077.
# Issue 61's second pass (stop 65's note): Part 2 2,183 -> 2,156, Part 3 1,077 -> 1,070, each
# ceiling lowered to the result. Stop 66: Part 2 2,156 -> 2,169, a bug the suite found under load
# (Ctrl-C or SIGTERM while the tokenizing pool forks: a worker's traceback; mask_stops).
BUDGETS = {"Part 1": 760, "Part 2": 2169, "Part 3": 1070, "transfer tasks": 273}
# The Part 2/3 names Part 1 may call: each says what it does, and nobody needs its details to learn
# a method [issue 28: at most 6]. A new one fails test_part_1_uses_only_its_seams.
SEAMS = {"UserError", "read_tokenizer_files", "read_weights", "load_sts", "world"}
ALLOWED = {"torch", "numpy", "scipy", "common"}


def source(name):
    return (ROOT / name).read_text(encoding="utf-8")


def common_parts():
    """Lines per part of common.py: each part runs from its banner to the next (Part 1 from the
    top); Part 3's section of transfer tasks (to the next section's banner) also apart."""
    lines = source("common.py").splitlines()
    starts = [i for i, line in enumerate(lines) if re.match(r"# Part [23]:", line)]
    assert len(starts) == 2, "common.py needs the banners '# Part 2:' and '# Part 3:'"
    cuts = [0, starts[0] - 1, starts[1] - 1, len(lines)]  # a banner starts one line above its title
    sizes = {f"Part {i + 1}": cuts[i + 1] - cuts[i] for i in range(3)}
    transfer = [i for i, line in enumerate(lines) if line.startswith("# --- SentEval's transfer")]
    assert len(transfer) == 1, "Part 3 needs the banner '# --- SentEval's transfer tasks'"
    end = next(i for i in range(transfer[0] + 1, len(lines)) if lines[i].startswith("# --- "))
    return {**sizes, "transfer tasks": end - transfer[0], "common.py": len(lines)}


@pytest.mark.parametrize("name", SCRIPTS)
def test_rulers_in_order(name):
    assert re.findall(r"^# ---- (.+)$", source(name), re.M) == RULERS


@pytest.mark.parametrize("name", SCRIPTS)
def test_shared_roles_exist(name):
    tree = ast.parse(source(name))
    defined = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    for role, args in ROLES.items():
        assert role in defined, f"{name} lacks {role}"
        if args is not None:
            assert [a.arg for a in defined[role].args.args] == args


@pytest.mark.parametrize("name", SCRIPTS + ["common.py"])
def test_imports_are_stdlib_torch_numpy_scipy_common(name):
    for node in ast.walk(ast.parse(source(name))):
        modules = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) else []
        for m in modules:
            top = m.split(".")[0]
            assert top in ALLOWED or top in sys.stdlib_module_names, f"{name} imports {m}"
            assert not top.endswith("_min"), f"{name} imports another method file ({m})"


@pytest.mark.parametrize("name", SCRIPTS)
def test_line_caps(name):
    assert len(source(name).splitlines()) <= LINE_CAPS[name]


TEST_FILES = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("*.py"))


@pytest.mark.parametrize("name", [n for n in TEST_FILES if n.split("/")[-1].startswith("test_")])
def test_each_test_file_is_one_readable_topic(name):
    """50-200 lines a test file, as minbpe's and micrograd's [STYLE §2.1]; helpers beside them."""
    assert 50 <= len(source(name).splitlines()) <= 200, (name, len(source(name).splitlines()))


@pytest.mark.parametrize("name", SCRIPTS + ["common.py"] + TEST_FILES)
def test_no_line_over_100_characters(name):
    """The five files and all of tests/: tests, helpers, tools, fixture scripts [issue 26]."""
    long = [f"{i}: {len(line.encode())}" for i, line in enumerate(source(name).splitlines(), 1)
            if len(line.encode()) > 100]  # UTF-8 bytes, stricter than characters for τ, μ, ⁺
    assert not long, f"{name}: lines over 100 bytes (line: length): {long[:10]}"


@pytest.mark.parametrize("part", list(BUDGETS))
def test_common_parts_hold_their_budgets(part):
    assert common_parts()[part] <= BUDGETS[part], common_parts()


@pytest.mark.parametrize("name", SCRIPTS + ["common.py"])
def test_no_function_over_60_lines(name):
    long = [f"{n.name} ({n.end_lineno - n.lineno + 1})" for n in ast.walk(ast.parse(source(name)))
            if isinstance(n, ast.FunctionDef) and n.end_lineno - n.lineno >= 60]
    assert not long, f"{name}: functions over 60 lines: {long}"


def part_1_names_from_later_parts():
    """{name: first line} of the names Part 1 reads that Parts 2 and 3 define (functions, classes,
    constants, imports), counted with ast."""
    text = source("common.py")
    part_2 = next(i for i, line in enumerate(text.splitlines(), 1) if line.startswith("# Part 2:"))
    tree, later = ast.parse(text), set()
    for node in (n for n in tree.body if n.lineno > part_2):
        targets = node.targets if isinstance(node, ast.Assign) else []
        later |= {x.id for t in targets for x in ast.walk(t) if isinstance(x, ast.Name)}
        later |= {node.name} if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else set()
        later |= {(a.asname or a.name).split(".")[0] for a in getattr(node, "names", [])
                  if isinstance(node, (ast.Import, ast.ImportFrom))}
    used = {}
    for node in (n for n in tree.body if n.lineno < part_2):
        for x in ast.walk(node):
            if isinstance(x, ast.Name) and x.id in later:
                used.setdefault(x.id, x.lineno)
    return used


def test_part_1_uses_only_its_seams():
    """Part 1 stands alone: a learner reads a method without leaving it, but for the seams."""
    used = part_1_names_from_later_parts()
    assert set(used) == SEAMS and len(SEAMS) <= 6, f"Part 1 uses (name: line) {used}"


@pytest.mark.parametrize("name", list(DIFF_BUDGET))
def test_diff_against_baseline_shows_the_method_only(name):
    """Counted as the README tells readers to look: GNU `diff -u simcse_min.py X_min.py` (difflib's
    matching is not minimal and counts more)."""
    changed = changed_lines(name)
    assert changed <= DIFF_BUDGET[name], f"{changed} changed lines vs {DIFF_BUDGET[name]}"


def test_readme_commands_name_real_scripts_and_flags():
    readme = source("README.md")
    commands = re.findall(r"python (\w+_min\.py|common\.py)([^\n`]*)", readme)
    assert commands
    for script, args in commands:
        assert (ROOT / script).exists(), script
        text = source(script)
        for flag in re.findall(r"--(\w+)", args):
            assert re.search(rf"^    {flag}: |\"--{flag}\"", text,
                             re.M), f"README: {script} has no --{flag}"


def changed_lines(name):
    """`+`/`-` lines of GNU `diff -u simcse_min.py name`, as the README tells readers to count."""
    if not shutil.which("diff"):
        pytest.skip("no `diff` program here (CI has one)")
    out = subprocess.run(["diff", "-u", "simcse_min.py", name], cwd=ROOT, capture_output=True,
                         text=True).stdout.splitlines()
    return len([d for d in out if d[:1] in "+-" and d[:3] not in ("+++", "---")])


def test_readme_is_short_and_its_file_table_is_the_code():
    """README at most about 200 lines [issue 15]; its table of files states the sizes measured
    now."""
    readme = source("README.md")
    assert len(readme.splitlines()) <= 200
    rows = re.findall(r"^\| `?(\w+_min\.py|common\.py|Part \d)`? \| ([\d,]+) \| *([\d,]*) *\|",
                      readme,
                      re.M)
    assert len(rows) == 8, rows
    parts = common_parts()
    for name, lines, _ in rows:
        size = parts[name] if name in parts else len(source(name).splitlines())
        assert int(lines.replace(",", "")) == size, f"README says {name} has {lines} lines: {size}"
    for name, _, changed in rows:  # last: without `diff` the test is skipped here, visibly
        if changed:
            assert int(changed) == changed_lines(name), f"README: {name} changes {changed} lines"
