"""Shared test settings. Fixtures that start services live next to the tests that use them."""

import os

# Child processes started by tests (services, torchrun) must not fight over the two cores with BLAS threads.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
