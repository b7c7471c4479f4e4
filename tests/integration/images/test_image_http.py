"""Image tasks over the seed-compatible HTTP API: the client sends the image fields, prefetches, reads /healthz."""

from __future__ import annotations

import asyncio
from pathlib import Path

from image_helpers import ImageSet

from fleet.config.infra import SandboxConfig
from sandbox_client import SandboxClient
from services.sandbox.server import SandboxServer


async def test_client_prefetches_then_gets_a_full_verdict_and_healthz_reports_the_cache(
        images: ImageSet, image_cfg: SandboxConfig, tmp_path: Path) -> None:
    cfg = image_cfg.model_copy(update={"image_cache_dir": str(tmp_path / "own-cache" / "images")})
    server = SandboxServer(cfg)
    port = await server.start()
    url = f"http://127.0.0.1:{port}"
    try:
        async with SandboxClient([url], task_timeout=120) as client:
            assert await client.prefetch(images.image) == 1
            for _ in range(600):  # the pull runs in the executor; wait until the image is held
                if server.executor.health()["images_held"] == 1:
                    break
                await asyncio.sleep(0.1)
            verdict = await client.run(images.spec(images.repo.gold))
            session = client._ensure_session()
            async with session.get(f"{url}/healthz") as resp:
                health = await resp.json()
            async with session.post(f"{url}/image/prefetch", json={"image": "bad name"}) as resp:
                bad = (resp.status, await resp.json())
    finally:
        await server.stop(1.0)
    assert verdict.status == "completed" and verdict.resolution == "FULL", verdict.error
    assert health["images_held"] == 1 and health["image_unpacks"] == 1 and health["pulls_in_flight"] == 0
    assert health["image_cache_bytes"] > 0 and health["runtime"] == "bwrap-image"
    assert bad[0] == 400 and bad[1]["field"] == "image"
