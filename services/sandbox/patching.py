"""A host task's patch steps, between the checkout and the test run (`executor.py`).

The task's test patch is read first (its paths must stay in the tree), then the agent's patch is applied through
SWE-bench's apply chain, as image tasks apply it (`not_applied` if nothing in it can), checked (`integrity.py`:
`refused` if it touches tests or what the runner reads), and every test file and runner input it touched goes back
to its pristine content; last, the test patch is applied by force over whatever the agent left. Image tasks have
their own steps (`images/contract.py`).
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import PurePosixPath

from fleet.contracts.sandbox import TaskSpec, Verdict
from services.sandbox.integrity import CONFIG_FILES, check_patch, unsafe_path
from services.sandbox.runner.testpaths import is_protected
from services.sandbox.workspace import InfraError, PatchError, TreeFull, Workspace


async def apply_patches(ws: Workspace, spec: TaskSpec, config_names: Collection[str]) -> Verdict | None:
    """Apply both patches to `ws`; a verdict when the run stops here (not_applied, refused), None when the tests are
    to run. `config_names`: the file names the trusted runner reads as test configuration. Raises InfraError for a
    malformed test patch (the task's fault, not the agent's)."""
    test_paths: list[str] = []
    if spec.test_patch.strip():
        try:
            test_paths = await ws.patch_paths("test.diff", spec.test_patch)
        except PatchError as exc:
            raise InfraError(f"the task's test_patch is malformed: {exc}") from exc
        if any(unsafe_path(p) for p in test_paths):
            raise InfraError("the task's test_patch touches paths outside the tree")
    try:
        if spec.patch.strip():
            try:
                paths = await ws.patch_paths("agent.diff", spec.patch)
                await ws.apply_as_harness("agent.diff", spec.patch)
            except PatchError as exc:
                return Verdict(status="not_applied", error=f"patch does not apply: {exc}")
            if spec.integrity_check:
                reason = await _integrity(ws, paths, test_paths, spec.task_paths, config_names)
                if reason is not None:
                    return Verdict(status="refused", patch_applied=True, error=f"integrity check: {reason}")
        if test_paths:
            await ws.force_apply("test.diff", spec.test_patch, test_paths)
    except TreeFull as exc:  # the agent's files filled the task's tree: its doing, a verdict
        return Verdict(status="not_applied", patch_applied=False, error=str(exc))
    return None


async def _integrity(ws: Workspace, paths: list[str], test_paths: list[str], task_paths: list[str],
                     config_names: Collection[str]) -> str | None:
    """Why the patch is refused (None: accepted); either way every test file and runner input it touched goes back
    to its pristine content, so the run never depends on what this check's parsers make of them."""
    # What git read from the patch, plus what actually changed on disk (renames, modes, symlinks included).
    touched = sorted({*paths, *await ws.changed_paths()})
    configs = [p for p in touched if PurePosixPath(p).name in CONFIG_FILES]
    before = {p: await ws.base_text(p) for p in configs}
    reason = check_patch(touched, test_paths, before.get, ws.read_text, task_paths)
    if reason is None:
        names = frozenset(config_names)
        owned = set(task_paths) - set(test_paths)  # the task's own fix is code, whatever its name
        await ws.restore_pristine([p for p in touched if p not in owned
                                   and (is_protected(p, names) or (names and PurePosixPath(p).name in names))])
    return reason
