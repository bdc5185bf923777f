"""The method files read like nanoGPT's [issue 61, STYLE §2.6]: a comment that explains sits on its
own line above what it explains, so at most 25 % of a file's non-blank lines end in a trailing
comment (nanoGPT's train.py 13 %, ours were 43-48 %); at most 15 % of the lines are over 90
characters (nanoGPT 7-10 %, ours were 28-31 %); train() is at most 50 lines. The diffs against
simcse_min.py stay within budget (test_structure.py). Counted with tokenize and ast, so a `#` in a
string is no comment."""
import ast
import io
import tokenize

import pytest

from test_structure import SCRIPTS, source

TRAILING_SHARE = 0.25
LONG_SHARE = 0.15
LONG = 90
TRAIN_LINES = 50


def trailing_comments(text):
    """The lines that hold code and then a comment."""
    lines = text.splitlines()
    found = set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT and lines[tok.start[0] - 1][:tok.start[1]].strip():
            found.add(tok.start[0])
    return found


def nonblank(text):
    return [line for line in text.splitlines() if line.strip()]


def train_lines(text):
    node = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef)
                and n.name == "train")
    return node.end_lineno - node.lineno + 1


@pytest.mark.parametrize("name", SCRIPTS)
def test_few_trailing_comments(name):
    text = source(name)
    share = len(trailing_comments(text)) / len(nonblank(text))
    assert share <= TRAILING_SHARE, f"{name}: {share:.1%} of the non-blank lines end in a comment"


@pytest.mark.parametrize("name", SCRIPTS)
def test_few_long_lines(name):
    lines = source(name).splitlines()
    long = [i for i, line in enumerate(lines, 1) if len(line) > LONG]
    assert len(long) <= LONG_SHARE * len(lines), f"{name}: lines over {LONG}: {long}"


@pytest.mark.parametrize("name", SCRIPTS)
def test_train_is_short(name):
    assert train_lines(source(name)) <= TRAIN_LINES


def test_the_counters_count_what_they_name():
    text = ('x = 1  # a trailing comment\n'
            '# a comment on its own line\n'
            '\n'
            's = "# not a comment"\n'
            'def train(cfg):\n'
            '    return cfg  # trailing\n')
    assert trailing_comments(text) == {1, 6}
    assert len(nonblank(text)) == 5
    assert train_lines(text) == 2
