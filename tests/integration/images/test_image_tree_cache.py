"""`sandbox.tree_cache_size` on image tasks: after the patch applies inside the image, git there names the tree
(`contract.tree_id_script`), and a tree graded before answers from the cache without the eval script running."""

from __future__ import annotations

from image_helpers import ImageSet
from sandbox_helpers import CORE, ONE_LINE_CONTEXT

from fleet.config.infra import SandboxConfig
from services.sandbox.executor import Executor


async def test_an_image_task_tree_graded_before_answers_from_the_cache(images: ImageSet,
                                                                      image_cfg: SandboxConfig) -> None:
    half = images.repo.diff({"calc/core.py": CORE.replace("return a - b", "return a + b")})  # add fixed, mul not
    async with Executor(image_cfg.model_copy(update={"tree_cache_size": 8})) as ex:
        gold = await ex.run(images.spec(images.repo.gold))
        spelt_otherwise = await ex.run(images.spec(ONE_LINE_CONTEXT))
        other_tree = await ex.run(images.spec(half))
        assert ex.trees is not None and ex.trees.stats() == {"hits": 1, "misses": 2, "kept": 2}
    assert (gold.status, gold.resolution) == ("completed", "FULL"), gold.error + gold.stdout_tail[-1500:]
    assert (spelt_otherwise.resolution, spelt_otherwise.test_status) == ("FULL", gold.test_status)
    assert "tests_s" in gold.timings and "tree_key_s" in gold.timings
    assert "tests_s" not in spelt_otherwise.timings and "tree_key_s" in spelt_otherwise.timings
    assert other_tree.status == "completed" and other_tree.resolution != "FULL" and "tests_s" in other_tree.timings


async def test_image_tasks_run_every_time_with_the_cache_off(images: ImageSet, image_cfg: SandboxConfig) -> None:
    async with Executor(image_cfg) as ex:
        first = await ex.run(images.spec(images.repo.gold))
        again = await ex.run(images.spec(ONE_LINE_CONTEXT))
        assert ex.trees is None
    assert first.resolution == again.resolution == "FULL"
    assert "tests_s" in again.timings and "tree_key_s" not in again.timings
