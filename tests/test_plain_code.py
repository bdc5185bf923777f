"""Plain over short [issue 39, STYLE §2.1]: no packing idioms in any part of common.py [issue 53]
(counted by tests/tools/packing.py), Part 2 one guarantee a section, its map in docs/reliability.md
generated from the code (tests/tools/guarantees.py). Run's state: tests/test_run_state.py (it
replaced a 120-line limit on Run, which pushed Run's state out into functions). The oracle:
tests/tools/packing.py's counts (each idiom planted and found) and the generated map."""
import ast

import guarantees
import packing
from conftest import ROOT

SOURCE = (ROOT / "common.py").read_text(encoding="utf-8")


def idioms_by_part():
    part = packing.part_of(SOURCE.splitlines())
    found = {}
    for line, kind in packing.idioms(ast.parse(SOURCE)):
        found.setdefault(part(line), []).append(f"{line}: {kind}")
    return found


def test_no_part_holds_a_packing_idiom():
    found = idioms_by_part()
    assert not found, found


def test_the_counter_finds_each_idiom():
    """Each idiom the counter names, in a small source: it must not miss what it guards."""
    source = ("x = a if p else b if q else c\n"
              "y = ' (truncated?)' * flag\n"
              "p and f()\n"
              "a.append(x), b.append(y)\n"
              "ids, start = [], 0\n"
              "a, b = a.double(), b.double()\n"  # parallel: one idea, not counted
              "a, b = b, a\n")
    kinds = [kind for _, kind in packing.idioms(ast.parse(source))]
    assert kinds == ["chained conditional", "string times boolean", "and/or as a statement",
                     "tuple as a statement", "unrelated tuple assignment"]


def test_every_part_2_section_states_its_guarantee_and_its_tests():
    found = guarantees.sections(SOURCE)
    assert len(found) >= 10
    for title, guarantee, *_ in found:
        assert guarantee, f"Part 2 section {title!r} opens with no comment stating its guarantee"
        assert title in guarantees.TESTS, f"tests/tools/guarantees.py names no tests for {title!r}"
    assert set(guarantees.TESTS) == {title for title, *_ in found}, "a stale entry in TESTS"
    for files in guarantees.TESTS.values():
        for name in files:
            assert (ROOT / "tests" / name).is_file(), f"tests/{name} is named but gone"


def test_the_guarantee_table_in_the_docs_is_the_generated_one():
    doc = (ROOT / "docs" / "reliability.md").read_text(encoding="utf-8")
    assert f"{guarantees.BEGIN}\n{guarantees.table()}\n{guarantees.END}" in doc, \
        "docs/reliability.md: run `python tests/tools/guarantees.py --write`"


def test_every_part_2_definition_sits_in_a_section():
    """No definition between the Part 2 banner and its first ruler: each belongs to a guarantee."""
    lines = SOURCE.splitlines()
    start = next(i for i, line in enumerate(lines, 1) if line.startswith("# Part 2:"))
    first_ruler = guarantees.sections(SOURCE)[0][2]
    early = [n.lineno for n in ast.parse(SOURCE).body
             if start < n.lineno < first_ruler and not isinstance(n, (ast.Import, ast.ImportFrom))]
    assert not early, f"definitions before Part 2's first section: lines {early}"
