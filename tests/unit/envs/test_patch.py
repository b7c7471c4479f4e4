import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from envs.swe.patch import MalformedDiff, extract_patch, normalize_diff

DIFF = (
    "diff --git a/pkg/mod.py b/pkg/mod.py\n"
    "--- a/pkg/mod.py\n"
    "+++ b/pkg/mod.py\n"
    "@@ -1,3 +1,3 @@\n"
    " a = 1\n"
    "-b = 2\n"
    "+b = 3\n"
    " c = 4\n"
)


def test_fenced_diff_block_is_extracted():
    r = extract_patch(f"The bug is in mod.py.\n\n```diff\n{DIFF}```\n")
    assert (r.status, r.source) == ("ok", "diff_fence")
    assert r.patch == DIFF


def test_patch_tags_are_extracted():
    r = extract_patch(f"<patch>\n{DIFF}</patch>")
    assert (r.status, r.source, r.patch) == ("ok", "patch_tag", DIFF)


def test_fence_inside_patch_tags_is_unwrapped():
    r = extract_patch(f"<patch>\n```diff\n{DIFF}```\n</patch>")
    assert (r.status, r.source, r.patch) == ("ok", "patch_tag", DIFF)


@pytest.mark.parametrize("call", [
    {"name": "submit_patch", "arguments": {"patch": DIFF}},
    {"name": "submit_patch", "arguments": json.dumps({"patch": DIFF})},
    {"type": "function", "function": {"name": "submit_patch", "arguments": json.dumps({"patch": DIFF})}},
])
def test_submit_patch_tool_call_is_extracted(call):
    r = extract_patch(f"<tool_call>\n{json.dumps(call)}\n</tool_call>")
    assert (r.status, r.source, r.patch) == ("ok", "tool_call", DIFF)


def test_last_complete_block_wins_among_several():
    second = DIFF.replace("+b = 3", "+b = 5")
    text = f"First try:\n```diff\n{DIFF}```\nActually:\n<patch>\n{second}</patch>\n"
    assert extract_patch(text).patch == second
    text = f"<patch>\n{second}</patch>\nor rather\n```diff\n{DIFF}```"
    assert extract_patch(text).patch == DIFF


def test_complete_block_is_kept_when_a_later_one_is_cut_off():
    r = extract_patch(f"```diff\n{DIFF}```\nLet me refine:\n```diff\n{DIFF[:70]}")
    assert (r.status, r.patch) == ("ok", DIFF)


@pytest.mark.parametrize("text", [
    f"```diff\n{DIFF[:80]}",
    f"<patch>\n{DIFF[:80]}",
    '{"name": "submit_patch", "arguments": {"patch": "diff --git a/pkg/mod.py b/pkg/mod.py\\n--- a/p',
])
def test_output_ending_inside_a_block_is_truncated(text):
    assert extract_patch(text).status == "truncated"


@pytest.mark.parametrize("text", [
    "```diff\nI would change b to 3.\n```",
    "<patch></patch>",
    "```diff\n@@ -1 +1 @@\n-a\n+b\n```",  # hunk without file header
    '{"name": "submit_patch", "arguments": {"diff": "x"}}',
])
def test_complete_block_without_a_diff_is_malformed(text):
    r = extract_patch(text)
    assert r.status == "malformed", r
    assert r.detail


@pytest.mark.parametrize("text", ["", "I could not find the bug.", "```python\nprint('hi')\n```"])
def test_no_block_is_missing(text):
    assert extract_patch(text).status == "missing"


def test_tool_name_mentioned_in_prose_is_not_a_call():
    r = extract_patch(f'```diff\n{DIFF}```\nThat is my "submit_patch" answer.')
    assert (r.status, r.patch) == ("ok", DIFF)


def test_other_language_fences_do_not_hide_a_later_diff():
    r = extract_patch(f"```python\nx = '```'\n```\n\n```diff\n{DIFF}```")
    assert (r.status, r.patch) == ("ok", DIFF)


def test_bare_diff_without_markers_is_accepted_and_trailing_prose_dropped():
    r = extract_patch(f"Here it is:\n{DIFF}\nThis should fix it.")
    assert (r.status, r.source, r.patch) == ("ok", "bare_diff", DIFF)


def test_wrong_hunk_counts_and_stripped_blank_context_lines_are_repaired():
    sloppy = "--- a/m.py\n+++ b/m.py\n@@ -1,9 +1,9 @@\n a = 1\n\n-b = 2\n+b = 3\n c = 4\n"
    r = extract_patch(f"```diff\n{sloppy}```")
    assert r.status == "ok"
    assert "@@ -1,4 +1,4 @@\n a = 1\n \n-b = 2\n+b = 3\n c = 4\n" in r.patch


def test_normalize_rejects_prose_inside_a_diff():
    with pytest.raises(MalformedDiff):
        normalize_diff("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\nthen some words\n")


@given(st.text(max_size=300))
def test_extraction_never_raises_on_arbitrary_text(text):
    r = extract_patch(text)
    assert r.status in ("ok", "missing", "malformed", "truncated")
    assert (r.status == "ok") == bool(r.patch)


def test_a_removed_line_that_starts_like_a_file_header_stays_in_its_hunk(tmp_path):
    """`--- ` opens a file only with its `+++ ` line; alone it is a removed `-- ` line (an SQL comment here), and the
    normalised diff still applies with git."""
    import subprocess

    sql = "select 1;\n-- drop me\nselect 2;\n"
    diff = ("diff --git a/q.sql b/q.sql\n--- a/q.sql\n+++ b/q.sql\n@@ -1,3 +1,2 @@\n select 1;\n--- drop me\n"
            " select 2;\n")
    r = extract_patch(f"```diff\n{diff}```\n")
    assert r.ok, r.detail
    assert r.patch == diff
    (tmp_path / "q.sql").write_text(sql)
    (tmp_path / "fix.diff").write_text(r.patch)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["git", "apply", "fix.diff"], cwd=tmp_path, check=True)
    assert (tmp_path / "q.sql").read_text() == "select 1;\nselect 2;\n"


def _diff(*hunk: str, path: str = "pkg/mod.py") -> str:
    body = "".join(line + "\n" for line in hunk)
    return f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n@@ -1,9 +1,9 @@\n{body}"


def test_a_diff_that_rewrites_lines_as_they_were_changes_nothing_and_keeps_its_patch():
    r = extract_patch("```diff\n" + _diff(" a = 1", "-b = 2", "-c = 4", "+b = 2", "+c = 4") + "```\n")
    assert (r.status, r.ok, r.source) == ("no_change", False, "diff_fence")
    assert "-b = 2\n-c = 4\n+b = 2\n+c = 4\n" in r.patch  # kept: diagnosis reads where it points
    assert "changes nothing" in r.detail


@pytest.mark.parametrize("hunk", [
    (" a = 1", "-b = 2", "+b = 2 "),  # trailing whitespace is a change
    (" a = 1", "-b = 2", "-c = 4", "+c = 4", "+b = 2"),  # so is the order
    ("-b = 2", "+b = 2", " x", "-c = 4"),  # one pair no-op, then a real removal in the same hunk
    ("--- a comment", "+--- a comment", "-x = 1", "+x = 2"),  # a removed line that reads like a file header
])
def test_a_diff_that_changes_anything_stays_ok(hunk):
    assert extract_patch("```diff\n" + _diff(*hunk) + "```\n").status == "ok"


def test_only_every_hunk_unchanged_makes_a_multi_hunk_diff_a_no_change():
    noop = _diff("-b = 2", "+b = 2")
    second = "@@ -20,1 +20,1 @@\n-y = 1\n+y = 1\n"
    assert extract_patch(f"<patch>\n{noop}{second}</patch>").status == "no_change"
    changed = "@@ -20,1 +20,1 @@\n-y = 1\n+y = 0\n"
    assert extract_patch(f"<patch>\n{noop}{changed}</patch>").status == "ok"


def test_header_changes_count_even_with_unchanged_hunks():
    new_mode = _diff("-b = 2", "+b = 2").replace("--- a/", "old mode 100644\nnew mode 100755\n--- a/", 1)
    assert extract_patch(f"<patch>\n{new_mode}</patch>").status == "ok"
    renamed = _diff("-b = 2", "+b = 2").replace("+++ b/pkg/mod.py", "+++ b/pkg/other.py")
    assert extract_patch(f"<patch>\n{renamed}</patch>").status == "ok"
    newline = _diff(" a = 1", "-b = 2", "\\ No newline at end of file", "+b = 2")
    assert extract_patch(f"<patch>\n{newline}</patch>").status == "ok"
