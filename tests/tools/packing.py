"""Packing idioms and line widths in common.py [issue 39, STYLE §2.1 "Plain over short"], counted
with ast. Stdlib only.

    python tests/tools/packing.py            # the counts per part, then one line per idiom found
    python tests/tools/packing.py --quiet    # the counts only

The idioms a reader must decode:
- chained conditional: a conditional expression inside another (`a if p else b if q else c`);
- string times boolean: `"text" * flag` (a string literal or f-string multiplied by anything);
- and/or as a statement: `x and f(...)` standing alone as a statement;
- tuple as a statement: `a.append(x), b.append(y)`, two calls made one line;
- unrelated tuple assignment: `a, b = x, y` whose values differ in shape (`ids, start = [], 0`).
  Parallel values, the same expression over other names (`a, b = a.double(), b.double()`,
  `H, I = cfg.hidden_size, cfg.intermediate_size`), are one idea and not counted.
"""
import argparse
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def part_of(lines):
    """{line number: 'Part 1' | 'Part 2' | 'Part 3'}, cut at the '# Part N:' banners."""
    starts = [i for i, line in enumerate(lines, 1) if re.match(r"# Part [23]:", line)]
    return lambda n: f"Part {1 + sum(n >= s for s in starts)}"


def idioms(tree):
    """(line, kind) for each packing idiom in the tree."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.IfExp):
            if isinstance(node.body, ast.IfExp) or isinstance(node.orelse, ast.IfExp):
                found.append((node.lineno, "chained conditional"))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            if is_string(node.left) or is_string(node.right):
                found.append((node.lineno, "string times boolean"))
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.BoolOp):
            found.append((node.lineno, "and/or as a statement"))
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Tuple):
            found.append((node.lineno, "tuple as a statement"))
        elif isinstance(node, ast.Assign) and is_unrelated_tuple(node):
            found.append((node.lineno, "unrelated tuple assignment"))
    return sorted(found)


def is_string(node):
    return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant)
                                               and isinstance(node.value, str))


def is_unrelated_tuple(node):
    target, value = node.targets[0], node.value
    if not (isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple)):
        return False
    if len(target.elts) < 2:
        return False
    return len({shape(v) for v in value.elts}) > 1


def shape(node):
    """The expression with every name, attribute name and constant blanked out."""
    class Blank(ast.NodeTransformer):
        def visit_Name(self, n):
            return ast.Name(id="_")

        def visit_Constant(self, n):
            return ast.Constant(value="_")

        def visit_Attribute(self, n):
            return ast.Attribute(value=self.visit(n.value), attr="_")
    return ast.dump(Blank().visit(ast.parse(ast.unparse(node), mode="eval")))


def main():
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    p.add_argument("--file", default="common.py", help="the file to count (default common.py)")
    p.add_argument("--quiet", action="store_true", help="the counts only, no line list")
    args = p.parse_args()
    text = (ROOT / args.file).read_text(encoding="utf-8")
    lines = text.splitlines()
    part = part_of(lines)
    header = ["lines", "non-blank", "chars/line", "over 90", "idioms"]
    print(f"{'part':8} " + " ".join(f"{h:>10}" for h in header))
    found = idioms(ast.parse(text))
    for name in ("Part 1", "Part 2", "Part 3"):
        numbers = [n for n in range(1, len(lines) + 1) if part(n) == name]
        filled = [lines[n - 1] for n in numbers if lines[n - 1].strip()]
        wide = sum(len(line) > 90 for line in filled)
        mean = sum(len(line) for line in filled) / len(filled)
        count = sum(part(n) == name for n, _ in found)
        row = [len(numbers), len(filled), f"{mean:.1f}", f"{wide / len(filled):.1%}", count]
        print(f"{name:8} " + " ".join(f"{v:>10}" for v in row))
    if not args.quiet:
        for n, kind in found:
            print(f"{args.file}:{n}: {kind}: {lines[n - 1].strip()[:70]}")


if __name__ == "__main__":
    main()
