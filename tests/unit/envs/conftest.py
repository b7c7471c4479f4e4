from typing import Any

import pytest

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="session")
def chat_tokenizer() -> Any:
    """A small byte-level BPE tokenizer with a chat template (no hub access needed)."""
    # Imported here: transformers takes seconds to import, and most tests here do not need it.
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["def foo(x):\n    return x + 1\n", "What is 7 + 12? Answer with <answer>N</answer>."] * 20,
                            trainer)
    out = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>")
    out.chat_template = CHAT_TEMPLATE
    return out
