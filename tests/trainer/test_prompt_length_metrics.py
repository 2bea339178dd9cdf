"""prompt_length/* (trainer/batch.py): each row's real prompt tokens, read off the prompt columns of the
attention mask, whatever the response holds; the closing memory table plans again at their longest."""

import torch
from tensordict import TensorDict

from logicrl.trainer.batch import prompt_length_metrics


def test_prompt_lengths_are_the_prompt_columns_attended():
    # Prompts left-padded to 3 columns: 2 and 3 real tokens. Responses of 2 columns: the first row's both
    # attended, the second's one (its end), which must not count.
    attention = torch.tensor([[0, 1, 1, 1, 1],
                              [1, 1, 1, 1, 0]])
    batch = TensorDict({"input_ids": torch.zeros(2, 5, dtype=torch.long), "attention_mask": attention,
                        "responses": torch.zeros(2, 2, dtype=torch.long)}, batch_size=[2])
    assert prompt_length_metrics(batch, max_len=3) == {
        "prompt_length/mean": 2.5, "prompt_length/max": 3.0, "prompt_length/min": 2.0,
        "prompt_length/clip_ratio": 0.5}  # the second row is at data.max_prompt_length
