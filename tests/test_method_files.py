"""The four method files share one loop and one configuration: train() short and in the open, each
sibling's train() differing from the baseline's only in lines tagged with its method, the shared
Config fields identical in all four [STYLE §2.5]. The oracle: the baseline's train(), read with
ast."""
import re

import pytest

import ast
import difflib
from test_structure import SCRIPTS, TAGS, source


def train_source(name):
    tree = ast.parse(source(name))
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "train")
    return source(name).splitlines()[node.lineno - 1:node.end_lineno]


def test_train_loop_is_short_and_in_the_open():
    train = train_source("simcse_min.py")
    assert len(train) <= 46, len(train)
    text = "\n".join(train)
    for piece in ("range(start, total + 1)", "run.after_step(", "evaluate_dev(", "keep_best(",
                  "optimizer_step(", "model.load_state_dict(best", "evaluate_sts(",
                  "run.finish("):
        assert piece in text, f"train() does not show {piece}"


@pytest.mark.parametrize("name", list(TAGS))
def test_train_differs_from_the_baseline_only_in_tagged_lines(name):
    """Every line a method adds to (or changes in) train() names the method in a comment, belongs to
    a tagged block, or is the call of its own train_step (its continuation lines included)."""
    diff = difflib.ndiff(train_source("simcse_min.py"), train_source(name))
    added = [d[2:] for d in diff if d.startswith("+ ")]
    block, call = None, False
    for line in added:
        indent = len(line) - len(line.lstrip())
        if f"# {TAGS[name]}" in line:
            block = indent if line.split("#")[0].rstrip().endswith(":") else None
        elif not ("train_step(" in line or call or block is not None and indent > block):
            pytest.fail(f"{name}: untagged change in train(): {line.strip()}")
        call = ("train_step(" in line or call) and line.count("(") > line.count(")")


def test_config_shared_fields_identical():
    shared = ["data", "model", "senteval", "dev_file", "device", "precision", "seed", "batch_size",
              "chunk_size", "max_len", "lr", "epochs", "max_steps", "temp", "eval_every", "test",
              "dropout", "out_dir", "save_every", "resume", "overwrite", "compile"]
    for name in SCRIPTS:
        fields = re.findall(r"^    (\w+): \w+ = ", source(name).split("# ---- Views")[0], re.M)
        assert fields[:len(shared)] == shared, name


def test_no_name_is_defined_twice_in_common():
    """A second top-level def of a name silently replaces the first (Part 3's transfer tasks once
    redefined the training loop's optimizer_step and epoch_batches)."""
    names = [n.name for n in ast.parse(source("common.py")).body
             if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    assert not {n for n in names if names.count(n) > 1}
