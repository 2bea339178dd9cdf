"""check_checkpoint: a checkpoint that cannot load into the run is refused before Ray starts, in one
line naming the difference and the ways out; one that fits, or one from before shape.json
(roles compared only), goes through."""

from __future__ import annotations

import json

import pytest

from logicrl.checkpoint_layout import COMPLETE_MARKER, SHAPE_FILE
from logicrl.config import compose, validate
from logicrl.config.errors import ConfigError
from logicrl.config.phases import ARR
from logicrl.preflight.checkpoints import check_checkpoint, run_shape, write_run_shape


def ways_out(root) -> str:
    return ("to start a new run, give it a directory of its own (trainer.default_local_dir=<another directory>) or "
            f"move this one aside first: mv {root} {root}.old")


def config(data_files, root, *overrides):
    cfg, _, _ = validate(compose([*data_files, f"{ARR}.rollout.name=hf", f"trainer.default_local_dir={root}",
                                  "algorithm.adv_estimator=grpo", f"{ARR}.rollout.n=8", *overrides]))
    return cfg


def saved(root, step: int, cfg=None, roles=("actor",)):
    """A complete global_step_N with the role directories and, given a config, its shape.json."""
    path = root / f"global_step_{step}"
    for role in roles:
        (path / role).mkdir(parents=True)
    if cfg is not None:
        write_run_shape(path, cfg)
    (path / COMPLETE_MARKER).write_text(f"{step}\n")
    return path


def test_a_lora_rank_other_than_the_saved_one_is_refused_with_the_ways_out(data_files, tmp_path):
    root = tmp_path / "ckpt"
    saved(root, 3, config(data_files, root, f"{ARR}.model.lora_rank=8"))
    with pytest.raises(ConfigError) as err:
        check_checkpoint(config(data_files, root, f"{ARR}.model.lora_rank=16"))
    assert str(err.value) == (f"trainer.default_local_dir={root}: global_step_3 was saved with "
                              f"{ARR}.model.lora_rank=8, this run has 16: resume it with {ARR}.model.lora_rank=8; or, "
                              f"{ways_out(root)}")
    with pytest.raises(ConfigError, match=f"saved with {ARR}.model.lora_rank=8, this run has 0: "):
        check_checkpoint(config(data_files, root))  # the full model from a LoRA checkpoint
    with pytest.raises(ConfigError, match=f"saved with {ARR}.model.lora_alpha=16, this run has 32: "):
        check_checkpoint(config(data_files, root, f"{ARR}.model.lora_rank=8", f"{ARR}.model.lora_alpha=32"))
    with pytest.raises(ConfigError, match=rf"saved with {ARR}.model.target_modules=all-linear, this run has "
                                          r"\[q_proj,v_proj\]: resume it with"):
        check_checkpoint(config(data_files, root, f"{ARR}.model.lora_rank=8",
                                f"{ARR}.model.target_modules=[v_proj,q_proj]"))
    check_checkpoint(config(data_files, root, f"{ARR}.model.lora_rank=8"))  # the same run fits
    # Adapters trained over the bf16 base do not fit an NF4 one (docs/quantization.md); a dry run needs no torchao.
    with pytest.raises(ConfigError, match=f"saved with {ARR}.model.quantization=null, this run has nf4: "):
        check_checkpoint(config(data_files, root, f"{ARR}.model.lora_rank=8", f"{ARR}.model.quantization=nf4",
                                "trainer.dry_run=true"))
    check_checkpoint(config(data_files, root, f"{ARR}.model.lora_rank=16", "trainer.resume_mode=disable"))


def test_a_grpo_checkpoint_resumed_with_gae_names_the_missing_critic(data_files, tmp_path):
    root = tmp_path / "ckpt"
    saved(root, 2, config(data_files, root))
    with pytest.raises(ConfigError) as err:
        check_checkpoint(config(data_files, root, "algorithm.adv_estimator=gae"))
    assert str(err.value) == (f"trainer.default_local_dir={root}: global_step_2 holds no critic (it was saved with "
                              f"algorithm.adv_estimator=grpo) and this run's algorithm.adv_estimator=gae trains one: "
                              f"resume it with algorithm.adv_estimator=grpo; or, {ways_out(root)}")
    # The other way round loads: the saved critic is left unread.
    gae_root = tmp_path / "gae"
    saved(gae_root, 2, config(data_files, gae_root, "algorithm.adv_estimator=gae"), roles=("actor", "critic"))
    check_checkpoint(config(data_files, gae_root))


def test_another_model_shape_is_refused_naming_the_fields_and_the_old_path(data_files, tmp_path):
    small, large = tmp_path / "small", tmp_path / "large"
    for path, hidden in ((small, 64), (large, 128)):
        path.mkdir()
        (path / "config.json").write_text(json.dumps({
            "model_type": "qwen2", "hidden_size": hidden, "num_hidden_layers": 2, "num_attention_heads": 2,
            "num_key_value_heads": 1, "intermediate_size": 256, "vocab_size": 2048, "tie_word_embeddings": True}))
    root = tmp_path / "ckpt"
    saved(root, 5, config(data_files, root, f"{ARR}.model.path={small}"))
    with pytest.raises(ConfigError) as err:
        check_checkpoint(config(data_files, root, f"{ARR}.model.path={large}"))
    assert str(err.value) == (f"trainer.default_local_dir={root}: global_step_5 was saved from a model with "
                              f"hidden_size=64, head_dim=32 ({ARR}.model.path={small}), and {ARR}.model.path={large} "
                              f"has hidden_size=128, head_dim=64: resume it with {ARR}.model.path={small}; or, "
                              f"{ways_out(root)}")


def test_resume_mode_naming_a_checkpoint_is_compared_and_named(data_files, tmp_path):
    root, other = tmp_path / "ckpt", tmp_path / "other"
    path = saved(other, 4, config(data_files, other, f"{ARR}.model.lora_rank=8"))
    with pytest.raises(ConfigError) as err:
        check_checkpoint(config(data_files, root, f"trainer.resume_mode={path}"))
    assert str(err.value) == (f"trainer.resume_mode={path} was saved with {ARR}.model.lora_rank=8, this run has 0: "
                              f"resume it with {ARR}.model.lora_rank=8; or, name another checkpoint in "
                              "trainer.resume_mode")


def test_the_newest_complete_checkpoint_is_the_one_compared(data_files, tmp_path):
    root = tmp_path / "ckpt"
    saved(root, 1, config(data_files, root, f"{ARR}.model.lora_rank=8"))
    saved(root, 2, config(data_files, root))
    (root / "global_step_3").mkdir()  # no COMPLETE: never resumed from, never compared
    check_checkpoint(config(data_files, root))


def test_a_checkpoint_from_before_shape_json_is_compared_on_its_roles_only(data_files, tmp_path):
    root = tmp_path / "ckpt"
    saved(root, 2)  # actor/ only, no shape.json
    check_checkpoint(config(data_files, root, f"{ARR}.model.lora_rank=16"))  # nothing recorded to compare
    with pytest.raises(ConfigError, match=r"global_step_2 holds no critic \(it was saved by a run without one\) and "
                                          r"this run's algorithm.adv_estimator=gae trains one: to start a new "
                                          r"run, give"):
        check_checkpoint(config(data_files, root, "algorithm.adv_estimator=gae"))
    (root / "global_step_2" / SHAPE_FILE).write_text("{not json")
    check_checkpoint(config(data_files, root, f"{ARR}.model.lora_rank=16"))  # unreadable: the trainer's check


def test_run_shape_records_the_roles_and_the_model(data_files, tmp_path):
    shape = run_shape(config(data_files, tmp_path, "algorithm.adv_estimator=gae"))
    assert shape["roles"] == ["actor", "critic"] and shape["algorithm.adv_estimator"] == "gae"
    actor = shape["models"][f"{ARR}.model.path"]
    assert actor["path"] == "embedded:tiny" and actor["shape"]["model_type"] == "qwen2"
    assert shape["lora"][f"{ARR}.model.lora_rank"] == 0
