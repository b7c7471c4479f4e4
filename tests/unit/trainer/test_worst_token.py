import torch

from trainer.grpo.diagnostics import merge_worst, worst_token


def test_worst_token_names_the_valid_token_where_trainer_and_engine_disagree_most():
    old = torch.log(torch.tensor([[0.5, 0.9, 0.2, 0.1], [0.5, 0.0001, 0.3, 0.3]]))
    gen = torch.log(torch.tensor([[0.5, 0.8, 0.2, 0.9], [0.4, 0.5, 0.3, 0.3]]))
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])  # row 0's last token is padding
    w = worst_token(old, gen, mask)
    assert abs(w["max_abs_logprob_diff"] - float(torch.log(torch.tensor(0.5 / 0.0001)))) < 1e-5
    assert w["worst_token_position"] == 1.0 and w["worst_token_is_last"] == 1.0  # row 1 has 2 valid tokens
    assert w["worst_token_response_len"] == 2.0
    assert abs(w["worst_token_gen_prob"] - 0.5) < 1e-6 and abs(w["worst_token_train_prob"] - 1e-4) < 1e-8
    empty = worst_token(old, gen, torch.zeros_like(mask))
    assert empty["max_abs_logprob_diff"] == -1.0
    assert merge_worst(empty, w) is w and merge_worst(w, empty) is w and merge_worst(None, empty) is empty
