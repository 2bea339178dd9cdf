"""Validation's scored samples (trainer/validation.py): problem and sample indices of a prompt-major batch,
`completed` from the stop tokens and the length limit, people counts; per-people accuracy keys."""

import torch
from tensordict import TensorDict

from logicrl.trainer.validation import scored_samples, validation_metrics


def _batch():
    # One problem, n=3, responses of up to 4 tokens: ends on stop token 2 after 2 tokens; runs to the limit
    # on 7s; runs to the limit but its last token is stop token 9.
    responses = torch.tensor([[5, 2, 0, 0], [7, 7, 7, 7], [3, 9, 9, 9]])
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1]])
    truth = {"name": "Zoey", "role": "knight"}
    return TensorDict({"responses": responses, "response_attention_mask": mask,
                       "data_source": ["kk_role"] * 3, "ground_truth": [truth] * 3,
                       "extra_info": [{"n_people": 3}] * 3}, batch_size=[3])


def test_scored_samples():
    results = [{"score": 1.0, "acc": 1.0}, {"score": 0.0, "acc": 0.0}, {"score": -1.0, "acc": 0.0}]
    samples = scored_samples(_batch(), [" knight", " knave said", " ..."], results, n=3, max_len=4, stop_ids=[2, 9])
    assert [(s["problem"], s["sample"]) for s in samples] == [(0, 0), (0, 1), (0, 2)]
    assert [s["completed"] for s in samples] == [True, False, True]
    assert [s["answer"] for s in samples] == ["knight", "knave", None]
    assert [s["correct"] for s in samples] == [1.0, 0.0, 0.0] and samples[0]["people"] == 3


def test_accuracy_per_people_for_every_source():
    results = [{"score": 1.0, "acc": 1.0}, {"score": 0.0, "acc": 0.0}, {"score": 0.0, "acc": 0.0}]
    metrics = validation_metrics(_batch(), results)
    assert metrics["val/kk_role/3ppl/acc"] == metrics["val/kk_role/acc"] == 1 / 3
