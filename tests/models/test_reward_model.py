"""The reward model's scores equal a direct HF forward of the same checkpoint on the same tokens,
padded and packed, for a sequence classifier and for OpenRLHF's decoder + value_head layout."""

import json

import pytest
import torch
import transformers
from safetensors.torch import save_file

from logicrl.models.packing import last_token_index
from logicrl.models.reward_head import reward_head
from logicrl.models.reward_model import RewardModelLoadError, load_reward_model, score_rows, token_level_scores
from logicrl.models.spec import ModelSpecError

VOCAB, PAD = 300, 0
# Left-padded prompts then right-padded responses, as workers/hybrid.py lays a batch out.
PROMPTS, RESPONSES, P, R = [3, 7, 1, 5, 7], [6, 1, 9, 9, 4], 7, 9


def tiny_config(**extra):
    # hidden 64 with one 64-wide head: the smallest Qwen2 shape the project's models use.
    return transformers.Qwen2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=1, num_key_value_heads=1,
                                    head_dim=64, intermediate_size=128, vocab_size=VOCAB, pad_token_id=PAD,
                                    num_labels=1, **extra)


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory):
    """A random-weight Qwen2ForSequenceClassification with one label, saved as a checkpoint."""
    torch.manual_seed(0)
    model = transformers.AutoModelForSequenceClassification.from_config(tiny_config())
    # A random head is near zero everywhere; scale it so differing scores show.
    with torch.no_grad():
        model.score.weight.mul_(50)
    path = tmp_path_factory.mktemp("rm-classifier")
    model.save_pretrained(path)
    return path


def trainer_batch(seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.full((len(PROMPTS), P + R), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (p, r) in enumerate(zip(PROMPTS, RESPONSES)):
        ids[i, P - p: P + r] = torch.randint(1, VOCAB, (p + r,), generator=g)
        mask[i, P - p: P + r] = 1
    # Row 1's response is the pad id itself (pad = eos in many tokenizers): a real token all the same.
    ids[1, P] = PAD
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def direct_scores(path, ids, mask, pad_token_id=None):
    """transformers' own sequence classifier on each row's real tokens alone. Without a pad id it reads
    a lone row at its last token; with one it reads the last token that is not the pad id."""
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).eval()
    hf.config.pad_token_id = pad_token_id
    with torch.no_grad():
        return torch.stack([hf(input_ids=row[m.bool()][None]).logits[0, 0] for row, m in zip(ids, mask)])


@pytest.mark.parametrize("remove_padding", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("micro", [2, 5])
def test_scores_equal_a_direct_hf_forward(classifier_dir, remove_padding, micro):
    ids, mask, pos = trainer_batch()
    expected = direct_scores(classifier_dir, ids, mask)
    model = load_reward_model(str(classifier_dir), torch.float32)
    scores = score_rows(model, ids, mask, pos, micro_batch_size=micro, remove_padding=remove_padding)
    assert scores.dtype == torch.float32 and scores.shape == (len(PROMPTS),)
    assert expected.std() > 0.1  # the rows really score differently
    torch.testing.assert_close(scores, expected, atol=1e-5, rtol=0)


def test_a_response_ending_in_the_pad_id_is_scored_at_that_token(classifier_dir):
    # Why the scorer does not let transformers pool: with pad = eos, a response that ends with eos
    # would be read one token early.
    ids, mask, pos = trainer_batch()
    pooled_by_hf = direct_scores(classifier_dir, ids, mask, pad_token_id=PAD)
    model = load_reward_model(str(classifier_dir), torch.float32)
    scores = score_rows(model, ids, mask, pos, micro_batch_size=5)
    assert (scores - pooled_by_hf).abs().gt(1e-3).tolist() == [False, True, False, False, False]


def test_the_model_is_frozen_and_in_eval_mode(classifier_dir):
    model = load_reward_model(str(classifier_dir), torch.float32)
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    assert reward_head(str(classifier_dir)).kind == "classifier"


def test_openrlhf_value_head_checkpoint_scores_like_the_classifier(classifier_dir, tmp_path):
    # OpenRLHF's older layout: the decoder under `model.`, the head as `value_head.weight`, and a
    # config that names no classifier.
    state = transformers.AutoModelForSequenceClassification.from_pretrained(classifier_dir).state_dict()
    state["value_head.weight"] = state.pop("score.weight")
    save_file({k: v.contiguous() for k, v in state.items()}, tmp_path / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((classifier_dir / "config.json").read_text())
    cfg.pop("id2label"), cfg.pop("label2id")
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "architectures": ["Qwen2ForCausalLM"]}))
    head = reward_head(str(tmp_path))
    assert (head.kind, head.prefix, head.bias) == ("value_head", "value_head", False)

    ids, mask, pos = trainer_batch(seed=2)
    model = load_reward_model(str(tmp_path), torch.float32)
    torch.testing.assert_close(score_rows(model, ids, mask, pos, micro_batch_size=3),
                               direct_scores(classifier_dir, ids, mask), atol=1e-5, rtol=0)


def test_a_causal_lm_without_a_trained_head_is_refused(tmp_path):
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(tiny_config()).save_pretrained(tmp_path)
    with pytest.raises(ModelSpecError, match=r"Qwen2ForCausalLM is neither a sequence classifier .* \[1, 64\]"):
        reward_head(str(tmp_path))


def test_a_classifier_whose_head_weights_are_missing_is_refused(classifier_dir, tmp_path):
    state = transformers.AutoModelForSequenceClassification.from_pretrained(classifier_dir).state_dict()
    del state["score.weight"]
    save_file({k: v.contiguous() for k, v in state.items()}, tmp_path / "model.safetensors", metadata={"format": "pt"})
    (tmp_path / "config.json").write_text((classifier_dir / "config.json").read_text())
    with pytest.raises(RewardModelLoadError, match="score.weight is not in the checkpoint"):
        load_reward_model(str(tmp_path), torch.float32)


def test_two_labels_are_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForSequenceClassification"],
                                                      "id2label": {"0": "a", "1": "b"}}))
    with pytest.raises(ModelSpecError, match="LlamaForSequenceClassification has 2 labels"):
        reward_head(str(tmp_path))


def test_last_token_and_token_level_scores_by_hand():
    # Left-padded prompt + right-padded response; a right-padded re-tokenised row; a full row.
    mask = torch.tensor([[0, 1, 1, 1, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]])
    assert last_token_index(mask).tolist() == [3, 1, 4]
    response_attention_mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]])
    out = token_level_scores(torch.tensor([0.5, -1.0, 2.0]), response_attention_mask)
    assert out.tolist() == [[0.0, 0.5, 0.0], [-1.0, 0.0, 0.0], [0.0, 0.0, 2.0]]


def test_on_meta_builds_the_same_architecture_without_reading_weights(classifier_dir):
    model = load_reward_model(str(classifier_dir), torch.float32, on_meta=True)
    assert all(p.is_meta for p in model.parameters()) and model.score.bias is None
    assert model.score.weight.shape == (1, 64) and not any(p.requires_grad for p in model.parameters())


def test_a_token_classifier_keeps_its_head_bias(tmp_path):
    # A trained one-label token classifier (what logicrl's critic saves) has a biased head.
    torch.manual_seed(1)
    hf = transformers.AutoModelForTokenClassification.from_config(tiny_config()).eval()
    with torch.no_grad():
        hf.score.bias.fill_(0.75)
    hf.save_pretrained(tmp_path)
    head = reward_head(str(tmp_path))
    assert (head.kind, head.bias) == ("classifier", True)
    ids, mask, pos = trainer_batch(seed=3)
    model = load_reward_model(str(tmp_path), torch.float32)
    with torch.no_grad():
        want = torch.stack([hf(input_ids=row[m.bool()][None]).logits[0, -1, 0] for row, m in zip(ids, mask)])
    torch.testing.assert_close(score_rows(model, ids, mask, pos, micro_batch_size=4, remove_padding=True), want,
                               atol=1e-5, rtol=0)
