"""rollout.lora_sync=adapters on vLLM: targets and ranks its LoRA layers cannot take are refused in one
line naming the key and the fix (config/validate.py check_lora_sync), before anything loads."""

import pytest
from omegaconf import OmegaConf

from logicrl.config.errors import ConfigError
from logicrl.config.validate import check_lora_sync


def arr(rank=8, targets=("q_proj", "v_proj"), sync="adapters", engine="vllm"):
    return OmegaConf.create({"model": {"lora_rank": rank, "target_modules": targets},
                             "rollout": {"lora_sync": sync, "name": engine}})


@pytest.mark.parametrize("case", [
    arr(), arr(targets="all-linear"), arr(targets=["self_attn.o_proj", "mlp.down_proj"]), arr(rank=512),
    arr(targets=["embed_tokens"], sync="merged"), arr(targets=["lm_head"], engine="hf"), arr(rank=0),
    arr(targets=["qq_proj"]),  # a typo: the preflight's "did you mean" (preflight/lora.py), not this check's
], ids=["q-v", "all-linear", "dotted", "rank-512", "merged", "hf", "no-lora", "typo"])
def test_what_vllm_adapter_sync_takes_passes(case):
    check_lora_sync(case)


@pytest.mark.parametrize("case, says", [
    (arr(targets=["q_proj", "lm_head"]), "target_modules has lm_head"),
    (arr(targets=["model.embed_tokens"]), "target_modules has model.embed_tokens"),
    (arr(rank=1024), "lora_rank=1024 is above vLLM's largest max_lora_rank 512"),
])
def test_what_it_cannot_take_is_one_line_naming_merged(case, says):
    with pytest.raises(ConfigError) as err:
        check_lora_sync(case)
    assert says in str(err.value) and "lora_sync=merged" in str(err.value) and "\n" not in str(err.value)
