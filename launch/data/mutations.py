"""Procedural bugs: single-site LibCST rewrites of one function, enumerated deterministically.

Why not swesmith's modifiers: they flip a seeded coin at every site of a function, so one "bug" is a random
multi-site rewrite whose content depends on the order of RNG calls, and the package's harness needs swebench<5.
Here a candidate bug is `(file, qualname, kind, index)`: the `index`-th site of `kind` inside one function body.
That makes every candidate enumerable, its id stable, and its gold patch minimal. Kind names follow swesmith's.

Sites are counted only in the function's own body: decorators, defaults and annotations are never touched, and a
nested function's body belongs to the nested function. Nothing inside a `while` loop is a site (a whole loop may
still be removed): rewrites there mostly make the loop endless, which only teaches the sandbox's timeout.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

BUG_KINDS: tuple[str, ...] = (
    "op_change", "op_swap", "op_break_chain", "cmp_flip", "cmp_boundary", "bool_swap", "const_change",
    "ctrl_invert_if", "ctrl_negate_cond", "remove_cond", "remove_assign", "remove_loop", "call_swap_args",
)

_OP_CHANGE: dict[type[cst.BaseBinaryOp], type[cst.BaseBinaryOp]] = {
    cst.Add: cst.Subtract, cst.Subtract: cst.Add, cst.Multiply: cst.Divide, cst.Divide: cst.Multiply,
    cst.FloorDivide: cst.Multiply, cst.Modulo: cst.FloorDivide, cst.Power: cst.Multiply,
    cst.LeftShift: cst.RightShift, cst.RightShift: cst.LeftShift, cst.BitAnd: cst.BitOr, cst.BitOr: cst.BitAnd,
    cst.BitXor: cst.BitOr,
}
# Swapping the operands of a commutative operator is (usually) no bug at all; `+` is swapped only next to a
# string or sequence literal, where it is concatenation.
_NON_COMMUTATIVE = (cst.Subtract, cst.Divide, cst.FloorDivide, cst.Modulo, cst.Power, cst.LeftShift, cst.RightShift)
_SEQUENCE_LITERALS = (cst.SimpleString, cst.FormattedString, cst.ConcatenatedString, cst.List, cst.Tuple)
_CMP_FLIP: dict[type[cst.BaseCompOp], type[cst.BaseCompOp]] = {
    cst.Equal: cst.NotEqual, cst.NotEqual: cst.Equal, cst.LessThan: cst.GreaterThanEqual,
    cst.GreaterThanEqual: cst.LessThan, cst.GreaterThan: cst.LessThanEqual, cst.LessThanEqual: cst.GreaterThan,
    cst.In: cst.NotIn, cst.NotIn: cst.In, cst.Is: cst.IsNot, cst.IsNot: cst.Is,
}
_CMP_BOUNDARY: dict[type[cst.BaseCompOp], type[cst.BaseCompOp]] = {
    cst.LessThan: cst.LessThanEqual, cst.LessThanEqual: cst.LessThan,
    cst.GreaterThan: cst.GreaterThanEqual, cst.GreaterThanEqual: cst.GreaterThan,
}


def _same_ws(new_cls: type, old: cst.CSTNode) -> cst.CSTNode:
    """An operator of `new_cls` keeping `old`'s surrounding whitespace, so the diff is one token."""
    kwargs = {k: getattr(old, k) for k in ("whitespace_before", "whitespace_after") if hasattr(old, k)}
    return new_cls(**kwargs)


def _needs_parens(expr: cst.BaseExpression) -> bool:
    return not expr.lpar and isinstance(expr, cst.BooleanOperation | cst.IfExp | cst.Lambda | cst.NamedExpr)


class _SiteTransformer(cst.CSTTransformer):
    """Walks one function body. Counts every site of every kind; rewrites only site `index` of `kind`."""

    def __init__(self, kind: str | None = None, index: int = -1) -> None:
        super().__init__()
        self.kind, self.index = kind, index
        self.counts: dict[str, int] = dict.fromkeys(BUG_KINDS, 0)
        self.applied = False
        self.in_while = 0

    def _site(self, kind: str) -> bool:
        if self.in_while:
            # Inside a `while` (test or body) most rewrites stop the loop from ending: the tests hang until the
            # sandbox kills them, which costs a whole timeout per candidate and gives the agent no traceback.
            return False
        n = self.counts[kind]
        self.counts[kind] = n + 1
        hit = kind == self.kind and n == self.index
        self.applied |= hit
        return hit

    # Nested functions and classes are separate candidates; their bodies are not this function's sites.
    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return False

    def visit_While(self, node: cst.While) -> bool:
        self.in_while += 1
        return True

    def leave_While(self, original: cst.While, updated: cst.While) -> cst.While:
        self.in_while -= 1
        return updated

    def leave_BinaryOperation(self, original: cst.BinaryOperation, updated: cst.BinaryOperation) -> cst.BaseExpression:
        op = type(updated.operator)
        out: cst.BaseExpression = updated
        if op in _OP_CHANGE and self._site("op_change"):
            out = updated.with_changes(operator=_same_ws(_OP_CHANGE[op], updated.operator))
        literal_sides = isinstance(updated.left, _SEQUENCE_LITERALS) + isinstance(updated.right, _SEQUENCE_LITERALS)
        swappable = issubclass(op, _NON_COMMUTATIVE) or (op is cst.Add and literal_sides == 1)
        if swappable and not original.left.deep_equals(original.right) and self._site("op_swap"):
            out = updated.with_changes(left=updated.right, right=updated.left)
        if isinstance(updated.left, cst.BinaryOperation) and not updated.left.lpar and self._site("op_break_chain"):
            out = updated.with_changes(left=updated.left.left)
        return out

    def leave_Comparison(self, original: cst.Comparison, updated: cst.Comparison) -> cst.BaseExpression:
        targets = list(updated.comparisons)
        for i, target in enumerate(targets):
            op = type(target.operator)
            if op in _CMP_FLIP and self._site("cmp_flip"):
                targets[i] = target.with_changes(operator=_same_ws(_CMP_FLIP[op], target.operator))
            if op in _CMP_BOUNDARY and self._site("cmp_boundary"):
                targets[i] = target.with_changes(operator=_same_ws(_CMP_BOUNDARY[op], target.operator))
        return updated.with_changes(comparisons=targets)

    def leave_BooleanOperation(
        self, original: cst.BooleanOperation, updated: cst.BooleanOperation
    ) -> cst.BaseExpression:
        if self._site("bool_swap"):
            new_op = cst.Or if isinstance(updated.operator, cst.And) else cst.And
            return updated.with_changes(operator=_same_ws(new_op, updated.operator))
        return updated

    def leave_Integer(self, original: cst.Integer, updated: cst.Integer) -> cst.BaseExpression:
        if self._site("const_change"):
            n = int(updated.value.replace("_", ""), 0)
            # Off by one, downwards on even sites and upwards on odd ones (never negative: `-` is a separate node).
            new = n + 1 if n == 0 or self.index % 2 else n - 1
            text = hex(new) if updated.value.lower().startswith("0x") else str(new)
            return updated.with_changes(value=text)
        return updated

    def leave_If(self, original: cst.If, updated: cst.If) -> cst.If:
        out = updated
        if isinstance(updated.orelse, cst.Else) and self._site("ctrl_invert_if"):
            out = updated.with_changes(body=updated.orelse.body, orelse=updated.orelse.with_changes(body=updated.body))
        if self._site("ctrl_negate_cond"):
            test = updated.test
            if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not) and not test.lpar:
                negated: cst.BaseExpression = test.expression
            else:
                inner = test
                if _needs_parens(test):  # `not a and b` would negate `a` only
                    inner = test.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
                negated = cst.UnaryOperation(operator=cst.Not(), expression=inner)
            out = out.with_changes(test=negated)
        return out

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        positional = [i for i, a in enumerate(updated.args) if a.keyword is None and not a.star]
        if len(positional) >= 2 and positional[:2] == [0, 1]:
            a, b = updated.args[0], updated.args[1]
            if not a.value.deep_equals(b.value) and self._site("call_swap_args"):
                args = [a.with_changes(value=b.value), b.with_changes(value=a.value), *updated.args[2:]]
                return updated.with_changes(args=args)
        return updated

    def leave_IndentedBlock(self, original: cst.IndentedBlock, updated: cst.IndentedBlock) -> cst.IndentedBlock:
        body = list(updated.body)
        if len(body) < 2:  # removing the only statement would leave an empty block
            return updated
        for i, stmt in enumerate(body):
            kind = _removal_kind(stmt)
            if kind is not None and self._site(kind):
                return updated.with_changes(body=body[:i] + body[i + 1:])
        return updated


def _removal_kind(stmt: cst.BaseStatement) -> str | None:
    if isinstance(stmt, cst.If) and stmt.orelse is None:
        return "remove_cond"
    if isinstance(stmt, cst.For | cst.While):
        return "remove_loop"
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
        small = stmt.body[0]
        if isinstance(small, cst.Assign | cst.AugAssign) or (isinstance(small, cst.AnnAssign) and small.value):
            return "remove_assign"
    return None


@dataclass(frozen=True)
class FunctionSites:
    """One function of a module and how many sites of each bug kind its body has."""

    file: str
    qualname: str
    name: str
    class_name: str | None
    start_line: int
    end_line: int
    sites: dict[str, int] = field(default_factory=dict)


class _FunctionCollector(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[tuple[str, bool]] = []  # (name, is_class)
        self.found: list[tuple[str, str, str | None, cst.FunctionDef]] = []
        self.positions: dict[str, tuple[int, int]] = {}
        self._seen: dict[str, int] = {}

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.stack.append((node.name.value, True))

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self.stack.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        qual = ".".join([n for n, _ in self.stack] + [node.name.value])
        # Redefinitions (property setters, version-dependent defs) get `#2`, `#3`... in source order.
        nth = self._seen.get(qual, 0) + 1
        self._seen[qual] = nth
        if nth > 1:
            qual = f"{qual}#{nth}"
        cls = self.stack[-1][0] if self.stack and self.stack[-1][1] else None
        pos = self.get_metadata(PositionProvider, node)
        self.positions[qual] = (pos.start.line, pos.end.line)
        self.found.append((qual, node.name.value, cls, node))
        self.stack.append((node.name.value, False))

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.stack.pop()


class ModuleSites:
    """One parsed module: its functions, their site counts, and single-site rewrites (parsed once, used often)."""

    def __init__(self, code: str, file: str) -> None:
        self.code, self.file = code, file
        wrapper = MetadataWrapper(cst.parse_module(code))
        collector = _FunctionCollector()
        wrapper.visit(collector)
        self._module = wrapper.module
        self._nodes = {qual: node for qual, _, _, node in collector.found}
        self.functions: list[FunctionSites] = []
        for qual, name, cls, node in collector.found:
            counter = _SiteTransformer()
            node.body.visit(counter)
            start, end = collector.positions[qual]
            sites = {k: v for k, v in counter.counts.items() if v}
            self.functions.append(FunctionSites(file, qual, name, cls, start, end, sites))

    def mutate(self, qualname: str, kind: str, index: int) -> str | None:
        """The module with site `index` of `kind` in `qualname` rewritten; None if that yields no valid change."""
        if kind not in BUG_KINDS:
            raise ValueError(f"unknown bug kind {kind!r}; known: {', '.join(BUG_KINDS)}")
        target = self._nodes.get(qualname)
        if target is None:
            return None
        rewriter = _SiteTransformer(kind, index)
        new_body = target.body.visit(rewriter)
        if not rewriter.applied:
            return None
        new_module = self._module.deep_replace(target, target.with_changes(body=new_body))
        new_code = new_module.code  # type: ignore[union-attr]
        if new_code == self.code:
            return None
        try:
            compile(new_code, self.file, "exec")
        except SyntaxError:
            return None
        return new_code


def scan_module(code: str, file: str) -> list[FunctionSites]:
    """Every function (and method) of a module with its per-kind site counts."""
    return ModuleSites(code, file).functions


def mutate(code: str, qualname: str, kind: str, index: int) -> str | None:
    """One-off form of `ModuleSites.mutate`."""
    return ModuleSites(code, "<module>").mutate(qualname, kind, index)
