"""How outputs and asserts are judged, so that a program cannot fake its way to a pass.

stdout rule (`outputs_match`): both texts are split on whitespace and must have the same tokens
in the same order. Tokens match when they are equal strings, or when the expected token is a
non-integer decimal (it has a '.', 'e' or 'E') and the actual token parses as a float within
`1e-6 * max(1, |expected|)`. Line breaks and repeated spaces do not matter; case does.

assert rule (`strict_checks`): the trusted check code is rewritten so that every value an assert
compares must be plain builtin data (None, bool, int, float, complex, str, bytes, and lists,
tuples, sets, frozensets and dicts of them), and `==` / `!=` compare by type and value recursively
(an int and a float of equal value count as equal; True and 1 do not). An object whose `__eq__`
always returns True is therefore not equal to anything. The helpers run in their own namespace
and the runner restores the builtins before the checks, so a solution that shadows or patches
`type`, `len` or `isinstance` changes nothing.
"""

from __future__ import annotations

import ast
import math

EQ, PLAIN = "__softrl_eq__", "__softrl_plain__"

# executed inside the sandbox in a namespace of its own (only builtins)
HELPERS = '''
_SCALARS = (type(None), bool, int, float, complex, str, bytes)
_SEQUENCES = (list, tuple)

def plain(v):
    t = type(v)
    if t in _SCALARS:
        return v
    if t in _SEQUENCES or t in (set, frozenset):
        for x in v:
            plain(x)
        return v
    if t is dict:
        for k, x in v.items():
            plain(k)
            plain(x)
        return v
    raise AssertionError("not plain data: " + t.__name__)

def eq(a, b):
    ta, tb = type(a), type(b)
    if ta is not tb:
        return ta in (int, float) and tb in (int, float) and plain(a) == plain(b)
    if ta in _SEQUENCES:
        return len(a) == len(b) and all(eq(x, y) for x, y in zip(a, b))
    if ta is dict:
        return plain(a).keys() == plain(b).keys() and all(eq(a[k], b[k]) for k in a)
    return plain(a) == plain(b)
'''
HELPER_NAMES = {EQ: "eq", PLAIN: "plain"}


def outputs_match(actual: str, expected: str, tolerance: float = 1e-6) -> bool:
    a, e = actual.split(), expected.split()
    return len(a) == len(e) and all(_token_match(x, y, tolerance) for x, y in zip(a, e))


def _token_match(actual: str, expected: str, tolerance: float) -> bool:
    if actual == expected:
        return True
    if not any(c in expected for c in ".eE"):
        return False
    try:
        x, y = float(actual), float(expected)
    except ValueError:
        return False
    return math.isfinite(x) and math.isfinite(y) and abs(x - y) <= tolerance * max(1.0, abs(y))


class _StrictAsserts(ast.NodeTransformer):
    """Rewrites assert statements only; comparisons elsewhere in the check code are left alone."""

    def visit_Assert(self, node: ast.Assert) -> ast.Assert:
        test = _StrictComparisons().visit(node.test)
        if not isinstance(node.test, ast.Compare):
            test = _call(PLAIN, test)
        return ast.copy_location(ast.Assert(test=test, msg=node.msg), node)


class _StrictComparisons(ast.NodeTransformer):
    def visit_Compare(self, node: ast.Compare) -> ast.expr:
        node = self.generic_visit(node)
        if len(node.ops) == 1 and isinstance(node.ops[0], (ast.Eq, ast.NotEq)):
            call = _call(EQ, node.left, node.comparators[0])
            return ast.copy_location(ast.UnaryOp(ast.Not(), call) if isinstance(node.ops[0], ast.NotEq) else call, node)
        node.left = _call(PLAIN, node.left)
        node.comparators = [_call(PLAIN, c) for c in node.comparators]
        return node


def _call(name: str, *args: ast.expr) -> ast.Call:
    return ast.Call(func=ast.Name(id=name, ctx=ast.Load()), args=list(args), keywords=[])


def strict_checks(check_source: str) -> str:
    """Rewrite trusted check code (asserts) into its strict form; raises ValueError if it does not parse."""
    try:
        tree = ast.parse(check_source)
    except SyntaxError as e:
        raise ValueError(f"check code does not parse: {e}") from e
    return ast.unparse(ast.fix_missing_locations(_StrictAsserts().visit(tree)))
