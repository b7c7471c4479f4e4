"""Computer-use tasks: small local HTML pages generated from a seed, each with a trusted check of its final state.

A task is (family, parameters). `make_tasks(seed, split, n, families, viewport)` is deterministic: the same
arguments always give the same pages, instructions and ids. The splits are disjoint by construction: a parameter
set belongs to `validation` iff a hash of it (not of the seed) falls in one bucket in ten, so no validation page is
ever a training page, whatever the seeds.

Families (a page draws only large targets, so a tiny model can learn some):
  click_button  2-4 buttons, click the one labelled X (and no other).
  type_submit   a text field and a Submit button: type the word, then submit (button or Enter).
  checkboxes    3-4 labelled checkboxes: tick exactly the named ones.
  pick_option   a list box of 3-5 options: select the named one.

Pages record what the agent did in the DOM (a pressed button keeps `data-pressed`; a submitted form keeps
`data-submitted`), so a pressed button looks pressed in the next screenshot too. `check` is a JS expression over
that DOM, evaluated by the sandbox in an isolated world after `done`; it answers `{passed, detail}`.
"""

from __future__ import annotations

import hashlib
import html
import json
import random
from dataclasses import dataclass
from typing import Any

FAMILIES = ("click_button", "type_submit", "checkboxes", "pick_option")
LABELS = ("Save", "Cancel", "Open", "Close", "Send", "Delete", "Next", "Back", "Print", "Share", "Copy", "Edit",
          "Help", "Stop", "Play", "Start", "Reset", "Apply", "Search", "Undo")
WORDS = ("apple", "river", "cloud", "tiger", "lemon", "piano", "stone", "grape", "honey", "maple", "ocean", "pearl",
         "robin", "sugar", "tulip", "zebra", "amber", "cedar", "daisy", "eagle", "fern", "glass", "hill", "iron",
         "jade", "kite", "lamp", "moon", "nest", "olive", "plum", "quilt", "rose", "salt", "tree", "vase", "wolf",
         "yarn", "bread", "chalk")
ITEMS = ("cat", "dog", "fox", "owl", "bee", "cow", "pig", "hen", "ant", "elk", "yak", "ram")
OPTIONS = ("red", "blue", "green", "yellow", "black", "white", "orange", "purple", "pink", "brown", "gray", "gold")
_VALIDATION_BUCKETS = 10  # one parameter set in ten is validation
_STYLE = ("*{box-sizing:border-box}html,body{margin:0;width:%dpx;height:%dpx;overflow:hidden;background:#fff;"
          "font-family:'DejaVu Sans',sans-serif;font-size:20px}body{padding:8px 16px}"
          "button{display:block;width:100%%;font-size:20px;border:2px solid #333;border-radius:6px;background:#eee}"
          "button[data-pressed]{background:#1a4fa0;color:#fff}")


@dataclass(frozen=True)
class PageTask:
    """One generated task: what the model is told, the page, and the check of the page's final state."""

    family: str
    params: tuple[Any, ...]
    instruction: str
    html: str
    check: str
    """A JS expression over the DOM answering {passed: bool, detail: string}."""
    solution: str = ""
    """A JS expression answering the actions (`[{name, arguments}]`) that solve the page from its first state:
    the reference solution for tests, benchmarks and docs. Never sent to the sandbox."""

    @property
    def key(self) -> str:
        return json.dumps([self.family, self.params])


def split_of(family: str, params: tuple[Any, ...]) -> str:
    """`validation` for one parameter set in ten (by hash), else `train`."""
    digest = hashlib.sha256(json.dumps([family, params]).encode()).digest()
    return "validation" if int.from_bytes(digest[:8], "big") % _VALIDATION_BUCKETS == 0 else "train"


def _page(viewport: tuple[int, int], body: str) -> str:
    return f"<!doctype html><html><head><style>{_STYLE % viewport}</style></head><body>{body}</body></html>"


def _gap(viewport: tuple[int, int], rows: int) -> tuple[int, int]:
    """(row height, gap) that fit `rows` rows into the viewport, never taller than 44 px."""
    room = viewport[1] - 16
    height = min(44, room // rows - 8)
    return height, min(12, (room - rows * height) // max(1, rows))


def click_button(rng: random.Random, viewport: tuple[int, int]) -> PageTask:
    labels = tuple(rng.sample(LABELS, rng.randint(2, 4)))
    target = rng.choice(labels)
    height, gap = _gap(viewport, len(labels))
    buttons = "".join(f'<button data-label="{html.escape(b)}" style="height:{height}px;margin-bottom:{gap}px" '
                      'onclick="this.dataset.pressed=1">' f"{html.escape(b)}</button>" for b in labels)
    check = ("(() => { const p = [...document.querySelectorAll('button[data-pressed]')].map(b => b.dataset.label);"
             f" const want = {json.dumps(target)};"
             " return {passed: p.length === 1 && p[0] === want,"
             " detail: p.length ? 'pressed: ' + p.join(', ') : 'no button pressed'}; })()")
    solution = f"[{_CENTER}('button[data-label={json.dumps(target)}]')]"
    return PageTask("click_button", (labels, target), f'Click the button labelled "{target}".',
                    _page(viewport, buttons), check, solution)


def type_submit(rng: random.Random, viewport: tuple[int, int]) -> PageTask:
    word = rng.choice(WORDS)
    top = rng.choice((0, 24, 48))  # the field is not always at the same place
    body = (f'<form style="margin-top:{top}px" onsubmit="event.preventDefault();'
            "this.dataset.submitted=this.elements.word.value;"
            "document.getElementById('sent').textContent='Sent: '+this.elements.word.value\">"
            '<input name="word" autocomplete="off" style="width:100%;height:40px;font-size:20px;'
            'border:2px solid #333;border-radius:6px;padding:0 6px">'
            '<button type="submit" style="height:40px;margin-top:12px">Submit</button></form>'
            '<div id="sent" style="margin-top:12px;color:#555"></div>')
    check = ("(() => { const f = document.querySelector('form'); const got = f.dataset.submitted;"
             f" const want = {json.dumps(word)};"
             " if (got === undefined) return {passed: false, detail: 'the form was not submitted'};"
             " return {passed: got.trim() === want, detail: 'submitted ' + JSON.stringify(got)}; })()")
    solution = (f"[{_CENTER}('input'), {{name: 'type', arguments: {{text: {json.dumps(word)}}}}},"
                " {name: 'key', arguments: {key: 'Enter'}}]")
    return PageTask("type_submit", (word, top), f'Type "{word}" into the text field and submit it.',
                    _page(viewport, body), check, solution)


def checkboxes(rng: random.Random, viewport: tuple[int, int]) -> PageTask:
    items = tuple(rng.sample(ITEMS, rng.randint(3, 4)))
    targets = tuple(sorted(rng.sample(items, rng.randint(1, 2))))
    height, gap = _gap(viewport, len(items))
    rows = "".join(f'<label style="display:flex;align-items:center;height:{height}px;margin-bottom:{gap}px">'
                   f'<input type="checkbox" value="{i}" style="width:28px;height:28px;margin:0 12px 0 0">'
                   f"{i}</label>" for i in items)
    check = ("(() => { const got = [...document.querySelectorAll('input[type=checkbox]')].filter(c => c.checked)"
             f".map(c => c.value).sort(); const want = {json.dumps(list(targets))};"
             " return {passed: JSON.stringify(got) === JSON.stringify(want),"
             " detail: 'ticked: ' + (got.join(', ') || 'none')}; })()")
    named = " and ".join(f'"{t}"' for t in targets)
    what = f"the box for {named} and only that one" if len(targets) == 1 else f"the boxes for {named}, and only those"
    solution = "[" + ", ".join(f"{_CENTER}('input[value={t}]')" for t in targets) + "]"
    return PageTask("checkboxes", (items, targets), f"Tick {what}.", _page(viewport, rows), check, solution)


def pick_option(rng: random.Random, viewport: tuple[int, int]) -> PageTask:
    options = tuple(rng.sample(OPTIONS, rng.randint(3, 5)))
    target = rng.choice(options)
    body = (f'<select size="{len(options)}" style="width:100%;font-size:20px;border:2px solid #333">'
            + "".join(f'<option value="{o}" style="padding:2px 6px">{o}</option>' for o in options) + "</select>")
    check = ("(() => { const s = document.querySelector('select');"
             f" const want = {json.dumps(target)};"
             " return {passed: s.value === want, detail: s.value ? 'selected ' + s.value : 'nothing selected'}; })()")
    # A list box's options have no boxes of their own: rows of clientHeight / size from the top.
    solution = ("(() => { const s = document.querySelector('select'), r = s.getBoundingClientRect();"
                f" const i = [...s.options].findIndex(o => o.value === {json.dumps(target)});"
                " const h = s.clientHeight / s.size;"
                " return [{name: 'click', arguments: {x: Math.round(r.left + r.width / 2),"
                " y: Math.round(r.top + s.clientTop + (i + 0.5) * h)}}]; })()")
    return PageTask("pick_option", (options, target), f'Select "{target}" in the list.', _page(viewport, body), check,
                    solution)


# A click at the centre of the element a selector finds (solutions only).
_CENTER = ("((q) => { const r = document.querySelector(q).getBoundingClientRect();"
           " return {name: 'click', arguments: {x: Math.round(r.left + r.width / 2),"
           " y: Math.round(r.top + r.height / 2)}};"
           " })")

_MAKERS = {"click_button": click_button, "type_submit": type_submit, "checkboxes": checkboxes,
           "pick_option": pick_option}


def make_page_task(family: str, rng: random.Random, viewport: tuple[int, int]) -> PageTask:
    if family not in _MAKERS:
        raise ValueError(f"unknown computer-use task family {family!r}; families: {', '.join(FAMILIES)}")
    return _MAKERS[family](rng, viewport)


def make_tasks(seed: int, split: str, n: int, families: tuple[str, ...], viewport: tuple[int, int]) -> list[PageTask]:
    """`n` tasks of `split`, families in turn; parameter sets of the other split are drawn again."""
    if split not in ("train", "validation"):
        raise ValueError(f"split must be train or validation, got {split!r}")
    rng = random.Random(f"computer_use:{seed}:{split}")
    out: list[PageTask] = []
    for i in range(n):
        family = families[i % len(families)]
        for _ in range(1000):
            task = make_page_task(family, rng, viewport)
            if split_of(task.family, task.params) == split:
                out.append(task)
                break
        else:  # unreachable for the built-in families: each split holds thousands of parameter sets
            raise RuntimeError(f"no {split} parameter set found for {family}")
    return out
