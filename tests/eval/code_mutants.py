"""One-operator mutations of a reference solution, by AST edits, in a fixed order.

`mutants(text)` lists the programs that differ from `text` by one edit: a binary or
augmented operator swapped (+ and -, * to +, / and // to *, % to //), a comparison flipped
(< and <=, > and >=, == and !=, in and not in, is and is not), `and` and `or` swapped, an
int constant plus one, a bool constant negated, `-x` or `not x` to `x`, `min` and `max`
swapped, a call of a name on one argument (`set(x)`, `abs(x)`) replaced by its argument.
Sites come in `ast.walk` order; a mutant whose source is unchanged is skipped. A HumanEval
reference (an indented body) is mutated as a body.
"""

from __future__ import annotations

import ast
import textwrap

_BINOPS = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Add, ast.Div: ast.Mult,
           ast.FloorDiv: ast.Mult, ast.Mod: ast.FloorDiv}  # fmt: skip
_CMPOPS = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
           ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot,
           ast.IsNot: ast.Is}  # fmt: skip


def _sites(tree: ast.AST) -> list[tuple[int, int]]:
    """(node index in ast.walk order, sub-site) of every possible edit."""
    out = []
    for i, node in enumerate(ast.walk(tree)):
        if isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in _BINOPS:
            out.append((i, 0))
        elif isinstance(node, ast.Compare):
            out += [(i, j) for j, op in enumerate(node.ops) if type(op) in _CMPOPS]
        elif isinstance(node, ast.BoolOp):
            out.append((i, 0))
        elif isinstance(node, ast.Constant) and isinstance(node.value, (bool, int)):
            out.append((i, 0))
        elif isinstance(node, ast.Name) and node.id in _SWAPS:
            out.append((i, 0))
        for j, child in enumerate(_children(node)):
            if _unwrappable(child):
                out.append((i, 100 + j))
    return out


_SWAPS = {'min': 'max', 'max': 'min'}


def _children(node: ast.AST) -> list[ast.AST]:
    return [c for c in ast.iter_child_nodes(node) if isinstance(c, ast.expr)]


def _unwrappable(node: ast.AST) -> bool:
    """`-x`, `not x`, or a call of a name on one positional argument."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.Not)):
        return True
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and len(node.args) == 1
        and not node.keywords
        and not isinstance(node.args[0], ast.Starred)
    )


def _replace(parent: ast.AST, old: ast.AST, new: ast.AST) -> None:
    for field, value in ast.iter_fields(parent):
        if value is old:
            setattr(parent, field, new)
            return
        if isinstance(value, list):
            for k, item in enumerate(value):
                if item is old:
                    value[k] = new
                    return


def _apply(tree: ast.AST, site: tuple[int, int]) -> None:
    index, sub = site
    node = next(n for i, n in enumerate(ast.walk(tree)) if i == index)
    if sub >= 100:
        child = _children(node)[sub - 100]
        inner = child.operand if isinstance(child, ast.UnaryOp) else child.args[0]
        _replace(node, child, inner)
    elif isinstance(node, ast.Name):
        node.id = _SWAPS[node.id]
    elif isinstance(node, (ast.BinOp, ast.AugAssign)):
        node.op = _BINOPS[type(node.op)]()
    elif isinstance(node, ast.Compare):
        node.ops[sub] = _CMPOPS[type(node.ops[sub])]()
    elif isinstance(node, ast.BoolOp):
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    elif isinstance(node.value, bool):
        node.value = not node.value
    else:
        node.value += 1


def mutants(text: str) -> list[str]:
    """The one-edit mutants of `text` (see the module docstring)."""
    body = text.lstrip('\n')[:1].isspace()
    source = 'def __mutant__():\n' + text if body else text
    base = ast.unparse(ast.parse(source))
    out = []
    for site in _sites(ast.parse(source)):
        tree = ast.parse(source)
        _apply(tree, site)
        new = ast.unparse(tree)
        if new == base:
            continue
        if body:
            inner = '\n'.join(ast.unparse(s) for s in tree.body[0].body)
            new = textwrap.indent(inner, '    ')
        out.append(new)
    return out
