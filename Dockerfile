# Two targets: `cpu` (vLLM's CPU build) and `cuda` (vLLM with CUDA). compose.yaml builds `cpu` by default.
FROM python:3.11-slim AS base
RUN apt-get update && apt-get install -y --no-install-recommends git bubblewrap build-essential \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY protos ./protos
COPY fleet ./fleet
COPY services ./services
COPY trainer ./trainer
COPY rollout ./rollout
COPY sandbox_client ./sandbox_client
COPY envs ./envs
COPY examples ./examples

FROM base AS cpu
RUN pip install --no-cache-dir --extra-index-url https://download.pytorch.org/whl/cpu -e ".[cpu,dev]" \
    && pip uninstall -y torchvision torchaudio torchcodec \
    && python -m fleet.protogen && pip install --no-cache-dir --no-deps -e .

FROM nvidia/cuda:12.8.0-runtime-ubuntu24.04 AS cuda
RUN apt-get update && apt-get install -y --no-install-recommends python3.11 python3.11-venv python3-pip git \
    bubblewrap && rm -rf /var/lib/apt/lists/*
RUN python3.11 -m venv /venv
ENV PATH=/venv/bin:$PATH
WORKDIR /app
COPY --from=base /app /app
RUN pip install --no-cache-dir -e ".[gpu,dev]" && python -m fleet.protogen && pip install --no-cache-dir --no-deps -e .
