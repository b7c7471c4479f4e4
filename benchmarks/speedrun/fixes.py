"""SFT examples of the SWE speedrun (CPU): generated fixes, as the policy will see and answer them in GRPO.

Two sources. `build`: each example is a task of the SFT task set (`sft.yaml`, built by `grpo-fleet data build`:
the builder's mutation kinds applied to packages outside the evaluation repositories, each bug validated by its
failing tests, the problem statement written from them). Prompt: `envs.swe.prompt.build_prompt`, the project's
single-shot SWE prompt in the speedrun tokenizer's chat template with the same context and budget GRPO uses.
Completion: the fixing diff in one ```diff fence, which is the answer format the prompt asks for
(`envs/swe/patch.py` reads it back).

An example whose prompt does not show the lines the fix changes is left out (the counts say how many): a model
cannot read the fix off code it was not shown, and training it to write such diffs anyway teaches it to invent
context lines. (This reads the gold patch to choose training data; no prompt contains anything from it.)

`corpus_examples`: the same mutation kinds (`launch/data/mutations.py`) applied to functions of the pre-training
corpus, thousands of them in minutes, since nothing is run: no tests, so the statement names the function that
misbehaves (an easier issue than a task's failing tests) and the code context is ranked the same way
(`bm25_functions`) over the functions of the package's files next to it, the buggy one among them. They teach what
a few hundred tasks cannot: the answer format, and copying context lines exactly from code never seen before.

A completion never has git's `index` line: blob ids are nothing a model can read off its prompt, and `git apply`
does not need them.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import lzma
import os
import random
import re
import warnings
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

from prompting import Prompting

from envs.swe.patch import HUNK_HEADER
from envs.swe.retrieval import function_spans, is_test_path

T = TypeVar("T")


def trim_context(patch: str, lines: int) -> str:
    """`patch` with at most `lines` context lines before the first and after the last change of each hunk, the
    hunk headers renumbered: what `git diff -U<lines>` prints for a single change. Fewer lines to copy exactly is
    fewer ways for a small model's diff not to apply; context between two changes of a hunk stays."""
    if lines < 1:
        raise ValueError(f"context lines must be >= 1 (a diff without context needs --unidiff-zero), got {lines}")
    text = patch.rstrip("\n").split("\n")
    out: list[str] = []
    i = 0
    while i < len(text):
        m = HUNK_HEADER.match(text[i])
        if not m:
            out.append(text[i])
            i += 1
            continue
        j = i + 1
        while j < len(text) and not HUNK_HEADER.match(text[j]) and not text[j].startswith(("diff --git ", "--- ")):
            j += 1
        body = text[i + 1:j]
        changed = [k for k, line in enumerate(body) if line[:1] in "+-"]
        lo, hi = (max(0, changed[0] - lines), min(len(body), changed[-1] + 1 + lines)) if changed else (0, len(body))
        if hi < len(body) and body[hi].startswith("\\"):  # "\ No newline at end of file" belongs to its line
            hi += 1
        kept = body[lo:hi]
        old = sum(1 for line in kept if line[:1] in " -")
        new = sum(1 for line in kept if line[:1] in " +")
        out.append(f"@@ -{int(m.group(1)) + lo},{old} +{int(m.group(3)) + lo},{new} @@{m.group(5)}")
        out.extend(kept)
        i = j
    return "\n".join(out) + "\n"


def completion(patch: str, context_lines: int = 3) -> str:
    """The SFT target: the diff in one ```diff fence, without git's `index` line, with at most `context_lines` lines
    of context around each hunk's changes."""
    # rstrip("\n") only: a diff may end with a blank context line (" "), and a hunk that loses its last context
    # line is read by `git apply` as one that must match at the end of the file.
    body = "\n".join(line for line in trim_context(patch, context_lines).rstrip("\n").splitlines()
                     if not line.startswith("index "))
    return f"```diff\n{body}\n```"


def removed_lines(patch: str) -> list[str]:
    return [line[1:] for line in patch.splitlines() if line.startswith("-") and not line.startswith("---")]


def fix_visible(prompt_text: str, patch: str) -> bool:
    """Whether every line the fix removes or changes is in the prompt (a pure insertion needs its hunk's context)."""
    lines = removed_lines(patch) or [line[1:] for line in patch.splitlines()
                                     if line.startswith(" ") and line[1:].strip()][:3]
    return bool(lines) and all(line in prompt_text for line in lines)


def build(task_dir: Path, tokenizer_dir: Path, out: Path, *, prompting: Prompting,
          splits: tuple[str, ...] = ("train", "validation"), context_lines: int = 3) -> dict[str, Any]:
    """Write `out` (JSONL, xz) of {"instance_id", "repo", "bug_kind", "prompt", "completion"} and the prompting
    they were made for; return the counts."""
    from envs.swe.taskset import read_split
    from fleet.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer_dir)
    counts: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    with lzma.open(out, "wt") as f:
        for split in splits:
            for task in read_split(task_dir, split):
                r = prompting.build(task, tok, task_dir / "repos")
                counts["tasks"] += 1
                if not fix_visible(r.text, task.patch):
                    counts["fix_not_in_prompt"] += 1
                    continue
                counts["examples"] += 1
                kind = str(task.metadata.get("bug_kind", ""))
                kinds[kind] += 1
                f.write(json.dumps({"instance_id": task.instance_id, "repo": task.repo, "bug_kind": kind,
                                    "prompt": r.text, "completion": completion(task.patch, context_lines),
                                    **prompting.figures()}) + "\n")
    return {**counts, "bug_kinds": dict(kinds), **prompting.figures(), "context_lines": context_lines}


def localisation(task_dir: Path, tokenizer_dir: Path, *, prompting: Prompting,
                 split: str = "validation") -> dict[str, Any]:
    """How well a split's prompts localise the bug, read against the gold patch (never shown to the model): the
    buggy function in the code context at all, first in it, every line the fix changes in the context (the
    statement aside), and in the statement itself; the buggy function named by one of the statement's traceback
    frames. The ceiling a model answering from its prompt has, before any training."""
    from envs.swe.taskset import read_split
    from fleet.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer_dir)
    counts: Counter[str] = Counter()
    statement_tokens = 0
    for task in read_split(task_dir, split):
        r = prompting.build(task, tok, task_dir / "repos")
        where, qualname = str(task.metadata["file"]), str(task.metadata["function"])
        hits = [i for i, label in enumerate(r.context_files) if label.startswith(where + ":")
                and label.endswith(" " + qualname)]
        statement = task.problem_statement
        counts["tasks"] += 1
        counts["function_in_context"] += bool(hits)
        counts["function_first"] += hits[:1] == [0]
        counts["fix_in_context"] += fix_visible(r.text.replace(statement, ""), task.patch)
        counts["buggy_line_in_statement"] += any(line.strip() and line.strip() in statement
                                                 for line in removed_lines(task.patch))
        counts["function_in_a_frame"] += f"in {qualname.rsplit('.', 1)[-1]}\n" in statement
        statement_tokens += len(tok(statement)["input_ids"])
    return {**counts, "statement_tokens_mean": statement_tokens / max(1, counts["tasks"]), "split": split,
            **prompting.figures()}


def _fix_shown(job: tuple[Any, str, Prompting]) -> bool:
    task, repos_root, prompting = job
    return fix_visible(prompting.build(task, _worker_tok, Path(repos_root)).text, task.patch)


def fixes_shown(task_dir: Path, tokenizer_dir: Path, tasks: Sequence[Any], *, prompting: Prompting,
                workers: int | None = None) -> list[bool]:
    """For each task, whether its prompt shows every line its fix changes: `build`'s criterion for an SFT pair,
    read here to choose GRPO's training tasks. A task failing it yields a group with no resolve and so no gradient
    (in the tenth run's in-place training tasks, 104 of 313). Reads the gold patch of training tasks only; the
    prompts are built on `workers` processes (~0.1 s each)."""
    workers = max(1, min(workers or os.cpu_count() or 1, len(tasks) or 1))
    jobs = [(t, str(task_dir / "repos"), prompting) for t in tasks]
    with ProcessPoolExecutor(workers, initializer=_init_worker, initargs=(str(tokenizer_dir),)) as pool:
        return list(pool.map(_fix_shown, jobs, chunksize=8))


def read(path: Path) -> list[dict[str, str]]:
    with lzma.open(path, "rt") as f:
        return [json.loads(line) for line in f]


# git's default hunk-header function line (no diff driver configured): the nearest line above the hunk that starts
# with a letter, `_` or `$`, as `git diff` prints it for the tasks' gold patches.
_FUNCNAME = re.compile(r"^[A-Za-z_$]")
_MAX_FUNCNAME = 80


def header_and_diff(path: str) -> tuple[str, str]:
    """A single-shot prompt's code context showing `path`, and a diff of it as the SFT targets write it."""
    from envs.swe.prompt import _user_message

    old, new = "def f(x):\n    return x + 1\n", "def f(x):\n    return x - 1\n"
    return _user_message("A test fails.", [(f"{path}:1 f", old)], []), git_diff(path, old, new, context=1)


def mentions(pieces: Sequence[tuple[T, tuple[int, int]]], text: str, path: str) -> list[list[T]]:
    """The pieces (tokens or pre-tokens, with their offsets in `text`) that spell each mention of `path`; an empty
    list where a piece crosses one of its ends."""
    runs = []
    start = text.find(path)
    while start >= 0:
        end = start + len(path)
        inside = [(x, (a, b)) for x, (a, b) in pieces if start <= a and b <= end]
        runs.append([x for x, _ in inside] if "".join(text[a:b] for _, (a, b) in inside) == path else [])
        start = text.find(path, end)
    return runs


def path_spelling(tokenizer: Any, path: str) -> list[tuple[int, ...]]:
    """The token ids that spell `path` at each of its mentions in the code header and in the diff
    (`header_and_diff`). A model names the file by copying the header's tokens: they must be the diff's."""
    spellings = []
    for text in header_and_diff(path):
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        spellings += [tuple(run) for run in mentions(list(zip(enc["input_ids"], enc["offset_mapping"], strict=True)),
                                                      text, path)]
    return spellings


def paths_spelt_alike(model_dir: Path, task_dir: Path) -> dict[str, int]:
    """Of the task set's gold-patch files, those `model_dir`'s tokenizer, loaded as every stage loads it, spells
    with the same tokens in the code header and in the diff. Measured on the model folder itself: a qwen2 folder
    once loaded Qwen2's split in place of its own (docs/swe-learning.md, "Ninth run")."""
    from envs.swe.taskset import read_split
    from fleet.tokenizer import load_tokenizer

    tok = load_tokenizer(model_dir)
    paths = {str(t.metadata["file"]) for split in ("train", "validation") for t in read_split(task_dir, split)}
    alike = sum(len(set(s)) == 1 and () not in s for s in (path_spelling(tok, p) for p in paths))
    return {"paths": len(paths), "alike": alike}


def git_diff(path: str, old: str, new: str, context: int = 3) -> str:
    """The text `git diff` prints for one modified file (`old` -> `new`), without the `index` line."""
    a, b = old.splitlines(), new.splitlines()
    out = [f"diff --git a/{path} b/{path}", f"--- a/{path}", f"+++ b/{path}"]
    for group in difflib.SequenceMatcher(None, a, b, autojunk=False).get_grouped_opcodes(context):
        i1, i2, j1, j2 = group[0][1], group[-1][2], group[0][3], group[-1][4]
        func = next((a[k] for k in range(i1 - 1, -1, -1) if _FUNCNAME.match(a[k])), "")
        # git numbers an empty side from the line before it (`-0,0` for a file's start).
        old_start, new_start = (i1 + 1 if i2 > i1 else i1), (j1 + 1 if j2 > j1 else j1)
        out.append(f"@@ -{old_start},{i2 - i1} +{new_start},{j2 - j1} @@" + (f" {func[:_MAX_FUNCNAME]}".rstrip()
                                                                            if func else ""))
        for tag, x1, x2, y1, y2 in group:
            if tag == "equal":
                out += [" " + line for line in a[x1:x2]]
                continue
            out += ["-" + line for line in a[x1:x2]]
            out += ["+" + line for line in b[y1:y2]]
    return "\n".join(out) + "\n"


_SYMPTOMS = (
    "`{call}` returns wrong results.",
    "`{call}` does not do what its code and docstring say it should.",
    "There is a regression in {pkg}: `{call}` misbehaves.",
    "I think `{call}` in {pkg} has a bug: its behaviour is wrong for ordinary inputs.",
)
_MAX_MODULE_BYTES = 60_000  # libcst parses a large module in seconds; big modules are few and alike
_NEIGHBOURS = 6  # other files of the package's folder whose functions are ranked beside the buggy one's


def _statement(seed: str, package: str, qualname: str) -> str:
    call = f"{qualname}()"
    h = int(hashlib.sha256(seed.encode()).hexdigest(), 16)
    symptom = _SYMPTOMS[h % len(_SYMPTOMS)].format(call=call, pkg=package)
    # No file path: a task's statement never names one (it names failing tests), and a model taught to copy the
    # path from the statement invents one where there is none (100 of 286 held-out answers in the third run,
    # docs/swe-learning.md). The path is read off the context's `[start of PATH:LINE ...]` header instead.
    return f"{symptom}\n\nPlease fix the library code so that `{call}` works again."


_worker_tok: Any = None


def _init_worker(tokenizer_dir: str) -> None:
    global _worker_tok
    from fleet.tokenizer import load_tokenizer

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.simplefilter("ignore", SyntaxWarning)  # compile() of old corpus code: `is` with a literal, etc.
    _worker_tok = load_tokenizer(tokenizer_dir)


def _mutate_function(text: str, path: str, start: int, end: int, rng: random.Random) -> tuple[str, str] | None:
    """(buggy module, kind) with one site of the function at lines start..end rewritten, or None. libcst parses the
    function alone, dedented (a whole module costs it ~0.4 s), and the result is spliced back."""
    from launch.data.mutations import ModuleSites

    lines = text.split("\n")
    snippet = lines[start - 1:end]
    ind = snippet[0][: len(snippet[0]) - len(snippet[0].lstrip())]
    stripped = []
    for line in snippet:
        if line.startswith(ind):
            stripped.append(line[len(ind):])
        elif line.strip():
            return None
        else:
            stripped.append(line)

    def indent(body: list[str]) -> list[str]:
        return [ind + line if line else line for line in body]

    if indent(stripped) != snippet:  # a whitespace-only line shorter than the indent: not spliced back exactly
        return None
    try:
        module = ModuleSites("\n".join(stripped) + "\n", path)
    except Exception:  # noqa: BLE001 - libcst rejects some valid Python: no example from this function
        return None
    fn = next((f for f in module.functions if "." not in f.qualname and "#" not in f.qualname), None)
    if fn is None or not fn.sites:
        return None
    kind = rng.choice(sorted(fn.sites))
    mutated = module.mutate(fn.qualname, kind, rng.randrange(fn.sites[kind]))
    if mutated is None:
        return None
    buggy = "\n".join([*lines[: start - 1], *indent(mutated.rstrip("\n").split("\n")), *lines[end:]])
    try:
        compile(buggy, path, "exec")
    except (SyntaxError, ValueError):
        return None
    return buggy, kind


def _one_file(job: tuple[str, str, str, list[tuple[str, str]], Prompting, str, int, float]
              ) -> tuple[dict[str, str] | None, str]:
    """One example from one corpus file, or None and why: a random function, kind and site, mutated; the fix is the
    mutation undone. With probability `rename_share` (the job's last item) the project gets an unseen name first
    (`rename_project`)."""
    from envs.swe.prompt import render_prompt
    from envs.swe.retrieval import function_docs, rank

    package, path, text, neighbours, prompting, seed, context_lines, rename_share = job
    renamed = None
    if rename_share > 0:  # its own generator: the same file draws the same function and site either way
        rename_rng = random.Random(f"{seed}-rename")
        if rename_rng.random() < rename_share:
            renamed = rename_project(path, text, neighbours, package, rename_rng)
    if renamed is not None:
        path, text, neighbours, package, _ = renamed
    rng = random.Random(seed)
    functions = [f for f in function_spans(text) if f[2] - f[1] < 150]
    rng.shuffle(functions)
    picked: tuple[str, str, str] | None = None
    for qualname, start, end in functions[:3]:
        mutated = _mutate_function(text, path, start, end, rng)
        if mutated is not None:
            picked = (qualname, *mutated)
            break
    if picked is None:
        return None, "no_mutation"
    qualname, buggy, kind = picked
    statement = _statement(seed, package, qualname)
    docs = function_docs([(path, buggy), *neighbours])
    ranked = [(d.path, d.text) for d in rank(docs, statement, prompting.functions)]
    prompt = render_prompt(statement, ranked, _worker_tok, prompting.max_prompt_length, name_omitted=False)
    patch = git_diff(path, buggy, text, context_lines)
    if not fix_visible(prompt.text, patch):
        return None, "fix_not_in_prompt"
    example = {"instance_id": f"corpus__{package}__{seed}", "repo": package, "bug_kind": kind, "prompt": prompt.text,
               "completion": completion(patch, context_lines), **prompting.figures()}
    return ({**example, "renamed": renamed[-1]} if renamed else example), "examples"


def _jobs(records: list[dict[str, str]], prompting: Prompting, seed: int,
          context_lines: int = 3, per_file: int = 1, rename_share: float = 0.0) -> Iterator[tuple[Any, ...]]:
    """One job per library file in a seeded order; `per_file` passes over them, each pass drawing other functions
    (the seed differs), so that a corpus smaller than `n` files still gives `n` examples."""
    folders: dict[tuple[str, str], list[dict[str, str]]] = defaultdict(list)
    for r in records:
        folders[(r["package"], str(PurePosixPath(r["path"]).parent))].append(r)
    rng = random.Random(seed)
    order = list(range(len(records)))
    rng.shuffle(order)
    for k in range(per_file):
        for i in order:
            r = records[i]
            # A test file's function is no library bug: the prompt says to leave the tests alone.
            if len(r["text"]) > _MAX_MODULE_BYTES or not r["text"].endswith("\n") or is_test_path(r["path"]):
                continue
            others = [o for o in folders[(r["package"], str(PurePosixPath(r["path"]).parent))] if o is not r]
            rng.shuffle(others)
            neighbours = [(o["path"], o["text"]) for o in others[:_NEIGHBOURS]]
            job_seed = f"{seed}-{i}" if k == 0 else f"{seed}-{i}-{k}"
            yield (r["package"], r["path"], r["text"], neighbours, prompting, job_seed, context_lines,
                   rename_share)


_CONSONANTS, _VOWELS = "bcdfgklmnprstvz", "aeiou"
_IDENT_EDGE = r"(?<![A-Za-z0-9_]){}(?![A-Za-z0-9_])"


def import_root(path: str) -> str | None:
    """The top-level package (or module) a library file belongs to: `src/accelerate/utils.py` -> `accelerate`."""
    parts = [p for p in PurePosixPath(path).parts[:-1] if p not in ("src", "lib")]
    root = parts[0] if parts else PurePosixPath(path).stem
    return root if root.isidentifier() and root != "__init__" else None


def synthetic_name(rng: random.Random) -> str:
    """A package name no corpus file uses: two or three syllables, sometimes a trailing consonant."""
    name = "".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(rng.randint(2, 3)))
    return name + (rng.choice(_CONSONANTS) if rng.random() < 0.5 else "")


def rename_project(path: str, text: str, neighbours: list[tuple[str, str]], package: str, rng: random.Random
                   ) -> tuple[str, str, list[tuple[str, str]], str, str] | None:
    """The file, its neighbours and the package's name as if its top-level package had an unseen name: every
    identifier-bounded mention renamed alike (paths, imports, code), so the fix made of them applies to the code shown.
    A model pre-trained on the corpus knows its ~230 package names and writes them from memory; the held-out
    repositories' names it mangles (117 of 286 base answers of the fourth run named a file that does not exist,
    docs/swe-learning.md). An unseen name can only be copied off the context's `[start of PATH]` headers.
    Returns (path, text, neighbours, package, "old->new"), or None when the root is no identifier."""
    old = import_root(path)
    if old is None:
        return None
    texts = [text, *(t for _, t in neighbours)]
    new = synthetic_name(rng)
    while any(re.search(_IDENT_EDGE.format(re.escape(new)), t) for t in texts):
        new = synthetic_name(rng)
    mention = re.compile(_IDENT_EDGE.format(re.escape(old)))
    return (mention.sub(new, path), mention.sub(new, text), [(mention.sub(new, p), mention.sub(new, t))
                                                             for p, t in neighbours],
            mention.sub(new, package), f"{old}->{new}")


def corpus_examples(corpus_file: Path, tokenizer_dir: Path, out: Path, *, n: int, prompting: Prompting,
                    seed: int = 0, workers: int | None = None, context_lines: int = 3,
                    per_file: int = 1, rename_share: float = 0.0) -> dict[str, Any]:
    """Write up to `n` examples from the corpus's files (up to `per_file` per file, in a seeded order) to `out`
    (JSONL, xz) as `build` does; return the counts. `rename_share` of the files get an unseen package name
    (`rename_project`)."""
    with lzma.open(corpus_file, "rt") as f:
        records = [json.loads(line) for line in f]
    counts: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    workers = workers or max(1, (os.cpu_count() or 2) - 1)
    with lzma.open(out, "wt") as f, ProcessPoolExecutor(workers, initializer=_init_worker,
                                                        initargs=(str(tokenizer_dir),)) as pool:
        jobs = _jobs(records, prompting, seed, context_lines, per_file, rename_share)
        while counts["examples"] < n:
            batch = [j for _, j in zip(range(4 * workers), jobs, strict=False)]
            if not batch:
                break
            for example, outcome in pool.map(_one_file, batch, chunksize=2):
                if example is not None and counts["examples"] >= n:
                    break  # the batch's last files are not counted: their examples are not kept
                counts["files"] += 1
                counts[outcome] += 1
                if example is not None:
                    kinds[example["bug_kind"]] += 1
                    counts["renamed"] += "renamed" in example
                    f.write(json.dumps(example) + "\n")
    return {**counts, "bug_kinds": dict(kinds), **prompting.figures(), "context_lines": context_lines,
            "per_file": per_file, "rename_share": rename_share}
