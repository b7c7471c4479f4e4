import difflib

import pytest

from launch.data.mutations import BUG_KINDS, ModuleSites, mutate, scan_module

MODULE = '''\
import re


@decorator(1 + 2)
def compute(a, b=3, *rest):
    """Docstring with 5 numbers."""
    total = a - b
    if a < b and b != 0:
        total += 1
    else:
        total = total * 2
    for x in rest:
        total = total + x
    while total > 100:
        total -= 10
    if total is None:
        return 0
    name = "p" + str(total)
    return re.sub("a", "b", name)


class Box:
    def __init__(self, items):
        self.items = items

    def size(self):
        def inner(k):
            return k - 1
        n = len(self.items)
        return inner(n) if n >= 1 else 0

    def size(self):  # a redefinition (think property setters)
        return len(self.items) // 2
'''


def changed_lines(old: str, new: str) -> list[str]:
    return [line for line in difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]


def sites(qualname: str) -> dict[str, int]:
    return next(f.sites for f in scan_module(MODULE, "m.py") if f.qualname == qualname)


def test_functions_methods_and_redefinitions_get_distinct_qualnames():
    names = [f.qualname for f in scan_module(MODULE, "m.py")]
    assert names == ["compute", "Box.__init__", "Box.size", "Box.size.inner", "Box.size#2"]
    box = next(f for f in scan_module(MODULE, "m.py") if f.qualname == "Box.size")
    assert (box.name, box.class_name, box.start_line) == ("size", "Box", 26)


def test_sites_cover_the_body_only_not_decorators_defaults_or_docstrings():
    s = sites("compute")
    # `1 + 2` in the decorator and `b=3` are not sites; the docstring's digits are text.
    assert s["op_change"] == 4  # a - b, total * 2, total + x, "p" + str(total)
    assert s["const_change"] == 4  # 1, 2, 0, 0: not 100 and 10, which are inside the `while`
    assert (s["cmp_flip"], s["cmp_boundary"]) == (3, 1)  # `total > 100` is the while's test
    # Single-statement blocks are never emptied: only `total = a - b` and `name = ...` can go.
    assert s["remove_assign"] == 2


def test_while_loops_can_be_removed_but_nothing_inside_them_changes():
    new = mutate(MODULE, "compute", "remove_loop", 1)
    assert new is not None and changed_lines(MODULE, new) == ["-    while total > 100:", "-        total -= 10"]


def test_nested_function_sites_belong_to_the_nested_function():
    assert sites("Box.size.inner") == {"op_change": 1, "op_swap": 1, "const_change": 1}
    assert "op_swap" not in sites("Box.size")


@pytest.mark.parametrize(("kind", "index", "expected"), [
    ("op_change", 0, ["-    total = a - b", "+    total = a + b"]),
    ("op_swap", 0, ["-    total = a - b", "+    total = b - a"]),
    ("cmp_flip", 0, ["-    if a < b and b != 0:", "+    if a >= b and b != 0:"]),
    ("cmp_boundary", 0, ["-    if a < b and b != 0:", "+    if a <= b and b != 0:"]),
    ("bool_swap", 0, ["-    if a < b and b != 0:", "+    if a < b or b != 0:"]),
    ("ctrl_negate_cond", 0, ["-    if a < b and b != 0:", "+    if not (a < b and b != 0):"]),
    ("remove_loop", 0, ["-    for x in rest:", "-        total = total + x"]),
    ("remove_cond", 0, ["-    if total is None:", "-        return 0"]),
    ("call_swap_args", 0, ["-    return re.sub(\"a\", \"b\", name)", "+    return re.sub(\"b\", \"a\", name)"]),
])
def test_each_kind_rewrites_exactly_one_site(kind, index, expected):
    new = mutate(MODULE, "compute", kind, index)
    assert new is not None
    assert changed_lines(MODULE, new) == expected


def test_invert_if_swaps_the_branches():
    new = mutate(MODULE, "compute", "ctrl_invert_if", 0)
    assert new is not None
    assert "if a < b and b != 0:\n        total = total * 2\n    else:\n        total += 1" in new


def test_string_concatenation_is_swappable_but_numeric_addition_is_not():
    new = mutate(MODULE, "compute", "op_swap", 1)
    assert new is not None and 'name = str(total) + "p"' in new
    assert mutate(MODULE, "compute", "op_swap", 2) is None


def test_every_site_of_every_kind_yields_valid_distinct_code_or_none():
    mod = ModuleSites(MODULE, "m.py")
    seen = set()
    for fn in mod.functions:
        for kind, count in fn.sites.items():
            for i in range(count):
                new = mod.mutate(fn.qualname, kind, i)
                assert new is not None, (fn.qualname, kind, i)
                compile(new, "m.py", "exec")
                assert new != MODULE and new not in seen
                seen.add(new)
        assert mod.mutate(fn.qualname, "op_change", fn.sites.get("op_change", 0)) is None  # past the last site


def test_mutation_is_deterministic_and_unknown_inputs_are_handled():
    assert mutate(MODULE, "compute", "const_change", 2) == mutate(MODULE, "compute", "const_change", 2)
    assert mutate(MODULE, "nope", "op_change", 0) is None
    with pytest.raises(ValueError, match="unknown bug kind"):
        mutate(MODULE, "compute", "explode", 0)
    assert set(BUG_KINDS) >= set(sites("compute"))
