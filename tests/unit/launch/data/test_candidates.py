from pathlib import Path

from launch.data import candidates as cand
from launch.data.candidates import plan_candidates, source_files
from launch.data.recipe import RepoRecipe

LIB = '''\
def add(a, b):
    return a + b - 0


def _helper(x):
    if x > 1:
        return x * 2
    return x


class Stack:
    def __init__(self, items):
        self.items = list(items) + [0]

    def push(self, x):
        self.items.append(x + 1)
        return len(self.items) - 1


def untested(x):
    return x - 1
'''

TESTS = {
    "tests/test_add.py": "from pkg.core import add\n\ndef test_add():\n    assert add(1, 2) == 3\n",
    "tests/test_stack.py": "from pkg.core import Stack\n\ndef test_push():\n    s = Stack([])\n    s.push(1)\n"
                           "    s.push(2)\n    assert s.push(3) == 3\n",
    "tests/test_core_module.py": "import pkg.core as core\n\ndef test_mod():\n    assert core\n",
}


def make_repo(tmp_path: Path) -> tuple[Path, RepoRecipe]:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "core.py").write_text(LIB)
    (tmp_path / "pkg" / "_version.py").write_text("v = 1 + 1\n")
    for name, text in TESTS.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    recipe = RepoRecipe(name="pkg", package="pkg", version="1.0", sha256="0" * 64, source=["pkg"],
                        exclude=["pkg/_version.py"], tests=["tests"])
    return tmp_path, recipe


def test_sources_and_tests_follow_the_recipe(tmp_path):
    root, recipe = make_repo(tmp_path)
    assert source_files(root, recipe) == ["pkg/__init__.py", "pkg/core.py"]
    assert cand.test_files(root, recipe) == sorted(TESTS)


def test_only_functions_some_test_reaches_are_candidates_with_their_test_files(tmp_path):
    root, recipe = make_repo(tmp_path)
    cands, _ = plan_candidates(root, recipe, seed=0, per_function=2)
    files = {c.qualname: c.test_files for c in cands}
    assert files["add"] == ("tests/test_add.py",)
    assert files["Stack.push"] == ("tests/test_stack.py",)
    assert files["Stack.__init__"] == ("tests/test_stack.py",)  # dunders: the tests naming the class
    assert files["_helper"] == tuple(sorted(TESTS))  # private helpers: the tests naming their module (`core`)
    assert "untested" not in files


def test_plan_is_deterministic_per_seed_and_round_robin_over_functions(tmp_path):
    root, recipe = make_repo(tmp_path)
    a, _ = plan_candidates(root, recipe, seed=5, per_function=2)
    b, _ = plan_candidates(root, recipe, seed=5, per_function=2)
    c, _ = plan_candidates(root, recipe, seed=6, per_function=2)
    assert a == b and a != c
    assert [x.order for x in a] == list(range(len(a)))
    functions = {x.function_id for x in a}
    assert {x.function_id for x in a[: len(functions)]} == functions  # every function once before any twice
    assert all(sum(x.function_id == f for x in a) <= 6 for f in functions)  # 3 x per_function at most


def test_test_files_are_capped_to_those_naming_the_function_most(tmp_path):
    root, recipe = make_repo(tmp_path)
    (root / "tests" / "test_more.py").write_text("from pkg.core import add\n\n" + "def test_x():\n    add(1, 1)\n" * 3)
    cands, _ = plan_candidates(root, recipe, seed=0, per_function=1, max_test_files=1)
    assert {c.test_files for c in cands if c.qualname == "add"} == {("tests/test_more.py",)}


def test_files_naming_the_module_are_preferred_for_generic_names(tmp_path):
    root, recipe = make_repo(tmp_path)
    # `push` is named more often here, but this file tests another module.
    (root / "tests" / "test_other.py").write_text("def test_q():\n    q.push(1)\n    q.push(2)\n    q.push(3)\n")
    (root / "tests" / "test_stack.py").write_text(TESTS["tests/test_stack.py"] + "import pkg.core\n")
    cands, _ = plan_candidates(root, recipe, seed=0, per_function=1, max_test_files=1)
    assert {c.test_files for c in cands if c.qualname == "Stack.push"} == {("tests/test_stack.py",)}
