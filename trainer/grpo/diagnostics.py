"""Where generation and training disagree most: the worst token of a batch (issue 21).

`loss/token_mult_prob_error` is a mean over tokens, so one token with |logp_train - logp_gen| ~ 10 lifts a whole
step's value to 30-80 and says nothing about which token it was. These metrics name that token: how far apart the
two log-probs are, where it sits in its answer (0 = the first generated token; whether it is the answer's last
token, i.e. the stop token of an answer that stopped or the token at the `max_new_tokens` cap), and how probable it
was under each side (an improbable sample, exp(logp_gen) small, that the trainer finds far less probable still is
drift; a token both sides find probable but disagree on is a numerics or alignment bug).
"""

from __future__ import annotations

import torch

__all__ = ["WORST_TOKEN_KEYS", "merge_worst", "worst_token"]

WORST_TOKEN_KEYS = ("max_abs_logprob_diff", "worst_token_position", "worst_token_is_last", "worst_token_gen_prob",
                    "worst_token_train_prob", "worst_token_response_len")


@torch.no_grad()
def worst_token(old_logprobs: torch.Tensor, generation_logprobs: torch.Tensor,
                mask: torch.Tensor) -> dict[str, float]:
    """The valid token of ``[B, T]`` tensors with the largest |old - gen| (old: the trainer's log-probs before the
    update). Empty mask: ``max_abs_logprob_diff`` = -1 and the rest -1."""
    valid = mask != 0
    if not bool(valid.any()):
        return dict.fromkeys(WORST_TOKEN_KEYS, -1.0)
    old, gen = old_logprobs.double(), generation_logprobs.double()
    diff = torch.where(valid, (old - gen).abs(), torch.full_like(old, -1.0))
    flat = int(diff.argmax())
    row, col = divmod(flat, diff.shape[1])
    length = int(valid[row].sum())
    last = int(valid[row].nonzero().max())
    return {"max_abs_logprob_diff": float(diff[row, col]), "worst_token_position": float(col),
            "worst_token_is_last": float(col == last), "worst_token_gen_prob": float(gen[row, col].exp()),
            "worst_token_train_prob": float(old[row, col].exp()), "worst_token_response_len": float(length)}


def merge_worst(a: dict[str, float] | None, b: dict[str, float]) -> dict[str, float]:
    """The worse of two `worst_token` results (None: b)."""
    return b if a is None or b["max_abs_logprob_diff"] > a["max_abs_logprob_diff"] else a
