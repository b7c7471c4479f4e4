"""`WorkerExtension`: the grpo-fleet methods of vLLM's worker process, named in the engine args
(`worker_extension_cls`), which vLLM mixes into its worker class. `VllmEngine` calls them by name through
`AsyncLLM.collective_rpc("grpo_fleet_...", args=...)`, on every worker at once.

Arguments travel msgpack-encoded (strings, ints, lists: a staging file's path and index), so a push staged on tmpfs
crosses the process boundaries as a path and the worker maps the file (rollout/engine/vllm_staging.py). Tensors would
arrive as plain lists that way: a push without a staging file travels pickled inside an `InlinePush` instead.

The state these methods keep between calls (the off-pause packing jobs, by staging path) lives on the worker object,
as attributes of this class: it is one object per worker process for the life of the engine.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rollout.engine import vllm_cpu
from rollout.engine.vllm_staging import StageIndex, map_stage, staged_tensors

if TYPE_CHECKING:
    import torch

QUALNAME = f"{__name__}.WorkerExtension"
"""What `worker_extension_cls` names (vLLM imports it in the worker process, which inherits our sys.path)."""


class InlinePush:
    """A push's tensors, pickled whole into the RPC: (client -> engine core -> worker), measured ~85 MB/s here, fine
    for small models only. A plain class on purpose: vLLM's msgpack encoder pickles what it does not know, but it
    knows dataclasses (sent as a map, tensors as lists)."""

    def __init__(self, items: list[tuple[str, torch.Tensor]]) -> None:
        self.items = items


@dataclass
class _PackingJob:
    """One push being packed off the pause (`vllm_cpu.pack_gemms`) on a thread of the worker process."""

    thread: threading.Thread | None = None
    state: str = "running"  # "running" | "done" | the error text
    packed: vllm_cpu.PackedPush | None = None


@dataclass
class _Arrival:
    """Blocks the packer until the receiver's progress word (`vllm_staging.Progress`) shows a tensor's bytes in."""

    words: torch.Tensor  # the staging file's first two int64 words: push id, tensors arrived
    push_id: int
    arrival_of_load_position: list[int] = field(default_factory=list)

    def ready(self, i: int) -> None:
        need = self.arrival_of_load_position[i] + 1
        while True:
            pid, done = int(self.words[0]), int(self.words[1])
            if pid != self.push_id or done < 0:
                raise RuntimeError("the push was abandoned before all its bytes arrived")
            if done >= need:
                return
            time.sleep(0.002)


class WorkerExtension:
    """Mixed into vLLM's worker class. Every public method is an RPC of `VllmEngine`; names carry a `grpo_fleet_`
    prefix because vLLM refuses an extension attribute that its worker class already has."""

    if TYPE_CHECKING:  # provided by vLLM's worker class, which this is mixed into
        model_runner: Any
        vllm_config: Any
        _grpo_fleet_packing: dict[str, _PackingJob]

        def reload_weights(self, *, weights_iterator: Iterator[tuple[str, torch.Tensor]]) -> None: ...

    # -- loading ---------------------------------------------------------------------------------------------------
    def grpo_fleet_unpack_and_load(self, model_dir: str) -> int:
        """CPU, `cpu_weight_layout="plain"`, once at start: unpack the GEMM weights and fill them from the checkpoint.
        Returns the number of layers unpacked."""
        from vllm.config import set_current_vllm_config

        with set_current_vllm_config(self.vllm_config):
            return vllm_cpu.load_checkpoint_unpacked(self.model_runner.get_model(), model_dir)

    def grpo_fleet_load_inline(self, push: InlinePush, mode: str) -> None:
        """Load a push that came pickled inside the RPC."""
        self._grpo_fleet_load(push.items, mode)

    def grpo_fleet_load_staged(self, path: str, index: StageIndex, mode: str) -> None:
        """Load the tensors of `index` from a staging file: the loaders copy from the mapped pages into the
        parameters."""
        self._grpo_fleet_load(staged_tensors(map_stage(path), index), mode)

    def _grpo_fleet_load(self, items: Iterable[tuple[str, torch.Tensor]], mode: str) -> None:
        """`mode` (see `VllmEngine`): "plain" (CPU, GEMM weights unpacked at start): the checkpoint loaders copy
        straight into the live parameters. "packed" (CPU): the same loaders copy into scratch weights one decoder
        layer at a time, and only the GEMM packing is re-run. "reload" (GPU): vLLM's `reload_weights`."""
        if mode == "reload":
            self.reload_weights(weights_iterator=iter(items))
            vllm_cpu.refresh_tied_cpu_heads(self.model_runner.model)
            return
        from vllm.config import set_current_vllm_config

        model = self.model_runner.get_model()
        with set_current_vllm_config(self.vllm_config):
            loaded = model.load_weights(items) if mode == "plain" else vllm_cpu.load_packed(model, list(items))
            vllm_cpu.check_loaded(model, loaded)
        self._grpo_fleet_reset_after_load()

    def _grpo_fleet_reset_after_load(self) -> None:
        runner = self.model_runner
        for reset in ("reset_lora_state", "reset_encoder_cache", "reset_mm_cache"):  # what reload_weights resets
            if hasattr(runner, reset):
                getattr(runner, reset)()

    # -- packing off the pause (CPU, packed layout) -----------------------------------------------------------------
    def _grpo_fleet_jobs(self) -> dict[str, _PackingJob]:
        jobs: dict[str, _PackingJob] | None = getattr(self, "_grpo_fleet_packing", None)
        if jobs is None:  # no __init__ of ours runs: vLLM appends this class to its worker class's bases
            jobs = {}
            self._grpo_fleet_packing = jobs
        return jobs

    def grpo_fleet_start_packing(self, path: str, index: StageIndex, push_id: int, load: Collection[str]) -> None:
        """Start packing a staged push on a thread and return at once: generation goes on meanwhile (the worker's
        RPCs and model steps share one thread). `index` lists every tensor of the push in the order its bytes arrive;
        each layer is packed as soon as the progress word shows its tensors in. `load`: the names to load (a tied
        head's alias is received but not loaded)."""
        jobs = self._grpo_fleet_jobs()
        for key, earlier in list(jobs.items()):  # two packers must never touch the layers at once
            if earlier.thread is not None:
                earlier.thread.join(timeout=120)  # an abandoned one stops at its next layer
                if earlier.thread.is_alive():
                    raise RuntimeError("the packing of an earlier push is still running")
            del jobs[key]
        import torch

        buf = map_stage(path)
        wanted = set(load)
        arrival = _Arrival(buf[:16].view(torch.int64), push_id,
                           [n for n, entry in enumerate(index) if entry[0] in wanted])
        job = _PackingJob()
        job.thread = threading.Thread(target=self._grpo_fleet_pack, args=(job, buf, index, wanted, arrival),
                                      name="grpo-fleet-pack", daemon=True)
        jobs[path] = job
        job.thread.start()

    def _grpo_fleet_pack(self, job: _PackingJob, buf: torch.Tensor, index: StageIndex, load: set[str],
                         arrival: _Arrival) -> None:
        from vllm.config import set_current_vllm_config

        try:
            items = [(n, t) for n, t in staged_tensors(buf, index) if n in load]
            with set_current_vllm_config(self.vllm_config):
                job.packed = vllm_cpu.pack_gemms(self.model_runner.get_model(), items, arrival.ready)
            job.state = "done"
        except BaseException as exc:  # reported through `grpo_fleet_packing_state`; the live model is untouched
            job.state = f"{type(exc).__name__}: {exc}"

    def grpo_fleet_packing_state(self, path: str) -> str:
        """"running", "done", or what went wrong (a failed job is dropped once reported)."""
        jobs = self._grpo_fleet_jobs()
        job = jobs.get(path)
        if job is None:
            return "lost: no packing started for this push in this worker"
        if job.state not in ("running", "done"):
            jobs.pop(path, None)
        return job.state

    def grpo_fleet_commit_packed(self, path: str) -> None:
        """Serve a packed push (under the pause): swap its kernels in and load the rest."""
        from vllm.config import set_current_vllm_config

        job = self._grpo_fleet_jobs().pop(path)
        if job.packed is None:
            raise RuntimeError(f"the packing of {path} did not finish ({job.state})")
        model = self.model_runner.get_model()
        with set_current_vllm_config(self.vllm_config):
            vllm_cpu.check_loaded(model, vllm_cpu.commit_packed(model, job.packed))
        self._grpo_fleet_reset_after_load()

    def grpo_fleet_drop_packed(self, path: str) -> None:
        """Forget a packing job that will not be served (a running one is joined by the next start)."""
        jobs = self._grpo_fleet_jobs()
        job = jobs.get(path)
        if job is not None and (job.thread is None or not job.thread.is_alive()):
            del jobs[path]
