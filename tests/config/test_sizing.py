"""A recipe sized for a real model says so in one line when it gets the embedded stand-in or the CPU
(config/sizing.py); a run sized for what it gets says nothing. The console line itself: test_dry_run.py."""

from dataclasses import replace

from logicrl.config import compose, validate
from logicrl.config.sizing import sizing_note
from logicrl.models.spec import ModelSpec

# Qwen2.5-7B's config.json, the fields the parameter count reads: 7.6B parameters.
QWEN_7B = ModelSpec.from_dict({"model_type": "qwen2", "num_hidden_layers": 28, "hidden_size": 3584,
                               "num_attention_heads": 28, "num_key_value_heads": 4, "intermediate_size": 18944,
                               "vocab_size": 152064, "tie_word_embeddings": False}, "Qwen2.5-7B")


def test_stage1_on_the_stand_in_names_what_sized_it_and_what_to_do(data_files):
    cfg, spec, _ = validate(compose(["+recipe=stage1", *data_files[:2]]))
    note = sizing_note(cfg, spec, on_cpu=True)
    assert "\n" not in note and note.startswith("note: this run is sized for a real model")
    # The two settings of stage1.yaml that no stand-in run uses, and the fixes.
    assert "data.max_response_length=4096" in note and "actor_rollout_ref.actor.optim.lr=4e-07" in note
    assert "actor_rollout_ref.model.path" in note and "make train" in note and "+recipe=tiny_curriculum" in note
    # The same recipe on GPUs with the stand-in still would not learn: said there too.
    assert sizing_note(cfg, spec, on_cpu=False) == note


def test_the_embedded_runs_say_nothing(data_files):
    for recipe in ([], ["+recipe=tiny_rm_ppo"]):
        cfg, spec, _ = validate(compose([*recipe, *data_files]))
        assert sizing_note(cfg, spec, on_cpu=True) is None


def test_a_7b_model_on_the_cpu_is_told_to_use_gpus_but_not_on_gpus(data_files):
    cfg, _, _ = validate(compose(["+recipe=stage1", *data_files[:2]]))
    cfg.actor_rollout_ref.model.path = "/ckpt/Qwen2.5-7B-Instruct-1M"  # not read: the spec stands in for it
    assert QWEN_7B.num_params() > 7.6e9
    note = sizing_note(cfg, QWEN_7B, on_cpu=True)
    assert note.startswith("note: a 7.62B-parameter model on the CPU") and "trainer.device=cuda" in note
    assert sizing_note(cfg, QWEN_7B, on_cpu=False) is None
    # Just under the bound (a 100M model) trains on the CPU without a note.
    assert sizing_note(cfg, replace(QWEN_7B, num_layers=0, vocab_size=27000, tie_word_embeddings=True),
                       on_cpu=True) is None
