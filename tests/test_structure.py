"""The shape of the code, enforced (STYLE.md §2.3, §2.12): the same skeleton in every *_min.py, allowed imports
only, line caps, diffs against the baseline within budget, and README commands that name real scripts and flags."""
import ast
import difflib
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ["simcse_min.py", "esimcse_min.py", "simcsepp_min.py", "diffcse_min.py"]
RULERS = ["Config", "Views", "Heads", "Loss", "Training step", "Training loop", "CLI"]
ROLES = {"Config": None, "make_views": None, "loss_fn": None, "train_step": None, "train": ["cfg"]}
LINE_CAPS = {"simcse_min.py": 250, "esimcse_min.py": 330, "simcsepp_min.py": 330, "diffcse_min.py": 400}
DIFF_BUDGET = {"esimcse_min.py": 120, "simcsepp_min.py": 120, "diffcse_min.py": 180}
ALLOWED = {"torch", "numpy", "scipy", "common"}


def source(name):
    return (ROOT / name).read_text()


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


@pytest.mark.parametrize("name", list(DIFF_BUDGET))
def test_diff_against_baseline_shows_the_method_only(name):
    diff = difflib.unified_diff(source("simcse_min.py").splitlines(), source(name).splitlines(), lineterm="", n=3)
    changed = [d for d in diff if d[:1] in "+-" and d[:3] not in ("+++", "---")]
    assert len(changed) <= DIFF_BUDGET[name] * 1.1, f"{len(changed)} changed lines vs budget {DIFF_BUDGET[name]}"


def test_config_shared_fields_identical():
    shared = ["data", "model", "senteval", "device", "seed", "batch_size", "max_len", "lr", "epochs",
              "max_steps", "temp", "eval_every", "dropout", "out_dir", "save_every", "resume", "overwrite", "compile"]
    for name in SCRIPTS:
        fields = re.findall(r"^    (\w+): \w+ = ", source(name).split("# ---- Views")[0], re.M)
        assert fields[:len(shared)] == shared, name


def test_readme_commands_name_real_scripts_and_flags():
    readme = source("README.md")
    commands = re.findall(r"python (\w+_min\.py|common\.py)([^\n`]*)", readme)
    assert commands
    for script, args in commands:
        assert (ROOT / script).exists(), script
        text = source(script)
        for flag in re.findall(r"--(\w+)", args):
            assert re.search(rf"^    {flag}: |\"--{flag}\"", text, re.M), f"README: {script} has no --{flag}"
