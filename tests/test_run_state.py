"""Run owns its state [issue 61]: every attribute of a Run is declared in Run.__init__ (or on the
class), and only Run's methods set one. Before, ten functions outside Run set 21 of its attributes
(run.pooler came from the data loader), which the 120-line limit on Run had forced; a reader of Run
could not list what a run holds. Checked with ast over common.py, and the checker on small sources
so that it cannot pass by finding nothing."""
import ast
import textwrap

from conftest import ROOT

SOURCE = (ROOT / "common.py").read_text(encoding="utf-8")


def assigned_attributes(tree, owner):
    """{attribute: first line} of the `owner.X = ...` (also +=, annotated) anywhere under tree."""
    found = {}
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            for x in ast.walk(target):
                if isinstance(x, ast.Attribute) and isinstance(x.value, ast.Name) \
                        and x.value.id == owner:
                    found.setdefault(x.attr, x.lineno)
    return found


def state_problems(source):
    """-> lines that break the rule: an attribute set outside __init__ first, or `run.X = ...` in
    a function outside the class Run."""
    tree = ast.parse(source)
    run = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Run")
    init = next(n for n in run.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    declared = set(assigned_attributes(init, "self"))
    declared |= {t.id for n in run.body if isinstance(n, ast.Assign) for t in n.targets
                 if isinstance(t, ast.Name)}
    problems = []
    for method in (n for n in run.body if isinstance(n, ast.FunctionDef) and n is not init):
        for name, line in assigned_attributes(method, "self").items():
            if name not in declared:
                problems.append(f"{line}: Run.{method.name} sets self.{name}, not declared in "
                                f"__init__")
    for node in (n for n in tree.body if n is not run):
        for name, line in assigned_attributes(node, "run").items():
            problems.append(f"{line}: {getattr(node, 'name', '?')} sets run.{name} outside Run")
    return problems


def test_every_attribute_of_a_run_is_declared_in_init_and_set_by_run_alone():
    assert state_problems(SOURCE) == []


def test_the_checker_finds_an_undeclared_attribute_and_an_outside_setter():
    source = textwrap.dedent('''
        class Run:
            limit = 3
            def __init__(self):
                self.total = None
            def start(self, total):
                self.total = total
                self.limit += 1
                self.clock = 0
        def load(run):
            run.pooler = "cls"
            run.histories += []
        ''')
    assert [p.split(":")[0] for p in state_problems(source)] == ["9", "11", "12"]
    assert "self.clock, not declared" in state_problems(source)[0]
    assert "load sets run.pooler outside Run" in state_problems(source)[1]


def test_a_method_that_sets_state_is_found_inside_nested_functions():
    """catch_signals' handler counts the signals in self.signals: declared in __init__ too."""
    source = textwrap.dedent('''
        class Run:
            def __init__(self):
                pass
            def catch(self):
                def handler(signum):
                    self.signals += 1
        ''')
    assert state_problems(source) == ["7: Run.catch sets self.signals, not declared in __init__"]
