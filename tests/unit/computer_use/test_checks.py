"""The trusted state checks of every family, in a real Chromium: a page as it first loads fails, the page solved
by the reference solution's actions passes, and a wrong action fails with a detail saying what the page shows."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from envs.computer_use.actions import Action, Click, Key, Type, action_from_json
from envs.computer_use.tasks import FAMILIES, PageTask, make_tasks
from services.sandbox.computer.renderer import Renderer, RendererSpec, find_chromium

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.skipif(
    shutil.which("bwrap") is None or not any(shutil.which(c) for c in ("/usr/lib/chromium/chromium", "chromium")),
    reason="needs bwrap and chromium")]
LIMIT = 30.0


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def renderer() -> AsyncIterator[Renderer]:
    r = await Renderer.launch(RendererSpec(224, 224, "unit-checks"), chromium=find_chromium())
    try:
        yield r
    finally:
        await r.close()


async def _run(r: Renderer, actions: list[Action]) -> None:
    for a in actions:
        if isinstance(a, Click):
            await r.click(a.x, a.y, limit_s=LIMIT)
        elif isinstance(a, Type):
            await r.type_text(a.text, limit_s=LIMIT)
        elif isinstance(a, Key):
            await r.key(a.key, limit_s=LIMIT)


async def _check(r: Renderer, task: PageTask) -> dict[str, object]:
    value = await r.evaluate_isolated(task.check, limit_s=LIMIT)
    assert isinstance(value, dict)
    return value


@pytest.mark.parametrize("index", range(len(FAMILIES)), ids=list(FAMILIES))
async def test_check_fails_on_the_first_page_and_passes_once_solved(renderer: Renderer, index: int) -> None:
    task = make_tasks(0, "train", 8, FAMILIES, (224, 224))[index]
    await renderer.load(task.html, limit_s=LIMIT)
    assert (await _check(renderer, task))["passed"] is False
    plan = [action_from_json(a, viewport=(224, 224)) for a in await renderer.evaluate_isolated(task.solution,
                                                                                            limit_s=LIMIT)]
    await _run(renderer, plan)
    result = await _check(renderer, task)
    assert result["passed"] is True, (task.instruction, plan, result)


async def test_a_wrong_button_fails_even_after_the_right_one(renderer: Renderer) -> None:
    task = next(t for t in make_tasks(1, "train", 8, FAMILIES, (224, 224)) if t.family == "click_button")
    await renderer.load(task.html, limit_s=LIMIT)
    plan = await renderer.evaluate_isolated(task.solution, limit_s=LIMIT)
    await _run(renderer, [action_from_json(a) for a in plan])
    labels, target = task.params
    wrong = next(b for b in labels if b != target)
    where = f"(() => {{ const r = document.querySelector('button[data-label=\"{wrong}\"]').getBoundingClientRect();"
    box = await renderer.evaluate_isolated(where + " return [r.left + 5, r.top + 5]; })()", limit_s=LIMIT)
    await renderer.click(int(box[0]), int(box[1]), limit_s=LIMIT)
    result = await _check(renderer, task)
    assert result["passed"] is False and wrong in str(result["detail"])


async def test_typing_the_wrong_word_is_reported_in_the_detail(renderer: Renderer) -> None:
    task = next(t for t in make_tasks(2, "train", 8, FAMILIES, (224, 224)) if t.family == "type_submit")
    await renderer.load(task.html, limit_s=LIMIT)
    plan = [action_from_json(a) for a in await renderer.evaluate_isolated(task.solution, limit_s=LIMIT)]
    await _run(renderer, [plan[0], Type("nope"), Key("Enter")])
    assert await _check(renderer, task) == {"passed": False, "detail": 'submitted "nope"'}


async def test_page_scripts_cannot_change_what_the_check_sees_of_javascript(renderer: Renderer) -> None:
    task = next(t for t in make_tasks(0, "train", 8, FAMILIES, (224, 224)) if t.family == "pick_option")
    await renderer.load(task.html, limit_s=LIMIT)
    # A page script that overrides built-ins the checks use: the isolated world has its own.
    await renderer.call("Runtime.evaluate", {"expression": "JSON.stringify = () => 'x'; Array.prototype.map = null"},
                        limit_s=LIMIT)
    assert (await _check(renderer, task))["passed"] is False
