"""Qwen2-VL's processor without torchvision (image inputs only).

transformers' `Qwen2VLProcessor` always loads a video processor, and every transformers video processor is a
torchvision backend; torchvision is not installed here (PyPI's build breaks next to the CPU torch wheel:
/work/shared/REFERENCE.md). Screenshots are images, so when torchvision is missing `install()` makes the video slot
load `NoVideoProcessor`, a stand-in that refuses videos by name. The image processor stays transformers' own PIL /
numpy backend (`Qwen2VLImageProcessorPil`), so pixel values are exactly what transformers computes.

`install()` must run in every process that builds the processor: ours (trainer, rollout worker) and vLLM's engine
core, where vLLM's `general_plugins` entry point (pyproject.toml) runs it. With torchvision present it does
nothing.
"""

from __future__ import annotations

import importlib.util
from typing import Any

_INSTALLED = False


def torchvision_available() -> bool:
    return importlib.util.find_spec("torchvision") is not None


def _no_video_class() -> type:
    from transformers.video_processing_utils import VideoProcessorMixin

    class NoVideoProcessor(VideoProcessorMixin):
        """Fills the processor's video slot; any use of it is an error naming the cause."""

        merge_size = 2

        def __init__(self, **kwargs: Any) -> None:
            self.merge_size = int(kwargs.get("merge_size", 2))

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("video inputs need torchvision, which is not installed (the computer-use path "
                               "uses images only)")

        get_num_of_video_patches = __call__

        def to_dict(self) -> dict[str, Any]:
            return {"merge_size": self.merge_size}

        def save_pretrained(self, *args: Any, **kwargs: Any) -> list[str]:
            return []

    return NoVideoProcessor


class NoVideoProcessorLoader:
    """What `AutoVideoProcessor` is for the processor's loader once `install()` ran without torchvision."""

    @staticmethod
    def from_pretrained(*args: Any, **kwargs: Any) -> Any:
        return _no_video_class()()


def install() -> None:
    """Let `Qwen2VLProcessor` load without torchvision (idempotent; a no-op when torchvision is importable)."""
    global _INSTALLED
    if _INSTALLED or torchvision_available():
        return
    import transformers
    from transformers import processing_utils
    from transformers.video_processing_utils import VideoProcessorMixin

    # The processor checks each part's class by looking its base-class name up on the transformers module, which
    # exports VideoProcessorMixin only with torchvision.
    setattr(processing_utils.transformers_module, "VideoProcessorMixin", VideoProcessorMixin)  # noqa: B010
    setattr(transformers, "VideoProcessorMixin", VideoProcessorMixin)  # noqa: B010
    names = processing_utils._LazyAutoProcessorMapping._MAPPING_NAMES
    names["video_processor"] = (__name__, "NoVideoProcessorLoader")
    _alias_image_module()
    _INSTALLED = True


def _alias_image_module() -> None:
    """`transformers.models.qwen2_vl.image_processing_qwen2_vl` (the torchvision backend, which vLLM's Qwen2-VL
    imports for `smart_resize` and the processor's type) resolves to the PIL backend's module, whose class computes
    the same pixel values (transformers tests both backends against each other)."""
    import sys
    import types

    from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl as pil

    name = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
    if name in sys.modules:
        return
    alias = types.ModuleType(name)
    alias.__dict__.update({k: v for k, v in vars(pil).items() if not k.startswith("__")})
    alias.Qwen2VLImageProcessor = pil.Qwen2VLImageProcessorPil  # type: ignore[attr-defined]
    sys.modules[name] = alias
