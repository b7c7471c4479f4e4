"""Models made on this machine: the tiny Qwen2 and Qwen2-VL the embedded default trains, their tokenizers and the short
pre-training that gives them a format; no model made here is needed to train a real one.

`tinymodel.py` makes `tiny-qwen2` (and random-weight Qwen2 shapes for benchmarks), `tinyvlm.py` makes
`tiny-qwen2-vl`, `pretrain.py` pre-trains the tiny model on an environment's format corpus, and `resolve.py` turns
`policy.model_name` into a loadable folder, making the tiny models on first use. Beside them, the model-side code the
trainer and the rollout workers share for Qwen2-VL-family models, the tiny one and real ones alike:
`tinyvlm.load_processor` / `is_vision_model`, Qwen2-VL's processor without torchvision (`vlm_compat.py`) and
screenshots as pixel values (`vision.py`). It imports nothing of the project but `fleet`.
"""
