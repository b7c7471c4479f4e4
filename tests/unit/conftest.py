"""Fixtures of the unit tests that build a model (the trainer's, the weight transports'): the locally made tiny Qwen2,
small configs around it, and a snapshot of its weights with the spec a rollout worker derives from its checkpoint;
and a package index serving PEP 691 pages (the sdist fetchers')."""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
from collections.abc import Callable, Iterator

import pytest
import torch

from fleet.config import MasterConfig, parse_config
from fleet.contracts.weights import WeightsId
from rollout.engine.base import checkpoint_weight_spec
from trainer.dist import Dist, DistEnv
from trainer.model import build_policy
from trainer.weights import gather_snapshot


@pytest.fixture(scope="session")
def tiny_model_path() -> str:
    from workshop.resolve import resolve_model

    return resolve_model("tiny-qwen2")


@pytest.fixture
def make_cfg(tiny_model_path: str, tmp_path) -> Callable[..., MasterConfig]:  # type: ignore[no-untyped-def]
    """A small trainer config (4 prompts x 4 generations, global batch 16, micro-batch 4); overrides on top."""

    def make(*overrides: str) -> MasterConfig:
        base = [
            f"policy.model_name={tiny_model_path}", "policy.max_total_sequence_length=256",
            "policy.generation.max_new_tokens=64", "policy.train_global_batch_size=16",
            "policy.train_micro_batch_size=4", "policy.optimizer.lr=1.0e-3", "grpo.num_prompts_per_step=4",
            "grpo.num_generations_per_prompt=4", "loss_fn.reference_policy_kl_penalty=0.0",
            f"run.dir={tmp_path / 'run'}", "logger.progress_bar=false", "logger.tensorboard_enabled=false",
        ]
        return parse_config({}, [*base, *overrides])

    return make


@pytest.fixture
def snapshot_and_spec(make_cfg):  # type: ignore[no-untyped-def]
    cfg: MasterConfig = make_cfg()
    policy = build_policy(cfg.policy, cfg.policy.model_name, Dist(DistEnv(0, 1, 0), torch.device("cpu"), 60))
    snap = gather_snapshot(policy, torch.float32, keep=True, weights=WeightsId(2, 3))
    assert snap is not None
    spec, _ = checkpoint_weight_spec(cfg.policy.model_name, "float32")
    return cfg, snap, {k: (v.shape, v.dtype) for k, v in spec.items()}


class Index:
    """A package index on a loopback port: `pages[path] = (content type, body)`, every request recorded."""

    def __init__(self) -> None:
        self.pages: dict[str, tuple[str, bytes]] = {}
        self.requests: list[str] = []
        index = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                index.requests.append(self.path)
                kind, body = index.pages.get(self.path, ("text/plain", b""))
                self.send_response(200 if self.path in index.pages else 404)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/simple"

    def publish(self, project: str, files: dict[str, bytes], listed_sha: dict[str, str] | None = None) -> None:
        """`project`'s JSON simple page (PEP 691, the keys PyPI serves) listing `files`, and the files themselves
        under /packages/ (linked relative to the page, which PEP 691 allows)."""
        entries = []
        for name, data in files.items():
            sha = (listed_sha or {}).get(name) or hashlib.sha256(data).hexdigest()
            entries.append({"filename": name, "hashes": {"sha256": sha}, "requires-python": ">=3.8",
                            "size": len(data), "upload-time": "2025-01-01T00:00:00.000000Z",
                            "url": f"../../packages/{name}", "yanked": False})
            self.pages[f"/packages/{name}"] = ("application/octet-stream", data)
        page = {"meta": {"api-version": "1.1"}, "name": project, "files": entries, "versions": ["1.0"]}
        self.pages[f"/simple/{project}/"] = ("application/vnd.pypi.simple.v1+json", json.dumps(page).encode())


@pytest.fixture
def package_index(monkeypatch: pytest.MonkeyPatch) -> Iterator[Index]:
    """A package index on a loopback port, the one pip is configured with for the test (`PIP_INDEX_URL`)."""
    from launch.data.sdist import index_url

    served = Index()
    thread = threading.Thread(target=served.server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("PIP_INDEX_URL", served.url)
    index_url.cache_clear()
    yield served
    index_url.cache_clear()
    served.server.shutdown()
    served.server.server_close()
