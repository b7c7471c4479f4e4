"""The one dtype table of the weight wire (and of the trainer's precision): header dtype names <-> torch dtypes.

A header names a dtype by its torch name without the `torch.` prefix; these are the dtypes a push may carry.
"""

from __future__ import annotations

import torch

DTYPES: dict[str, torch.dtype] = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}


def element_size(dtype: str) -> int:
    """Bytes per element of a wire dtype name."""
    return torch.empty((), dtype=DTYPES[dtype]).element_size()
