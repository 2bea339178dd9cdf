"""The critic's model (models/loading.py load_value_model): the decoder with a one-output token head."""

import torch

from logicrl.models.loading import load_value_model


def test_the_value_head_has_no_dropout_so_train_mode_values_are_the_rollouts():
    # transformers' token heads default to dropout 0.1: the update (train mode) then saw other values
    # than the rollout's (eval mode), and an OOM-retried micro-batch drew other masks (caught by
    # tests/trainer/test_reward_model_train.py's injected-OOM run: critic loss off by 0.5%).
    torch.manual_seed(0)
    model = load_value_model("embedded:tiny", torch.float32)
    assert model.config.num_labels == 1 and model.score.out_features == 1
    assert all(m.p == 0.0 for m in model.modules() if isinstance(m, torch.nn.Dropout))
    ids = torch.randint(3, 100, (2, 12))
    model.eval()
    evaluated = model(input_ids=ids).logits
    model.train()
    torch.testing.assert_close(model(input_ids=ids).logits, evaluated, rtol=0, atol=0)
    meta = load_value_model("embedded:tiny", torch.float32, on_meta=True)  # the sharded load's skeleton
    assert all(m.p == 0.0 for m in meta.modules() if isinstance(m, torch.nn.Dropout))
