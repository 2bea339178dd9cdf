"""Adapter-only weight sync into vLLM: the LoRA A/B tensors handed over in memory, the base never re-sent.

The engine is built with LoRA enabled (`engine_args`): max_lora_rank the smallest rank vLLM offers
that holds the run's, the run's target modules, one adapter slot and one cached adapter. Each sync
builds a `LoRAModel` from the tensors with vLLM's own `LoRAModel.from_lora_tensors` inside the worker
(`load_adapter`, run through `collective_rpc` in this process: the tensors go by reference), removes
the adapter it replaces, and registers the new one under a new int id. The next generate() names
that id in a `LoRARequest`; the worker's LRU manager finds it already registered and only activates
it, so the request's `lora_path` is never read. This is how vLLM's own warm-up registers its dummy
adapters (`LoRAModelRunnerMixin.maybe_setup_dummy_loras`); verl instead subclasses LoRARequest and
patches the worker manager's loader. The one internal this reaches is the worker manager's
`_adapter_manager` (the same call vLLM's `add_dummy_lora` makes); tests/workers/test_rollout_vllm_lora.py
fails when it moves. docs/engines.md.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from logicrl.models.loading import LoraSpec

IN_MEMORY = "in-memory"  # LoRARequest insists on a non-empty lora_path; never read (module docstring)
ADAPTER = "default"  # peft's adapter name, which vLLM's tensor names do not carry


def max_lora_rank(rank: int) -> int:
    """The smallest max_lora_rank vLLM accepts (its MaxLoRARanks) that holds `rank`."""
    from typing import get_args

    from vllm.config.lora import MaxLoRARanks

    allowed = sorted(get_args(MaxLoRARanks))
    fits = [r for r in allowed if r >= rank]
    if not fits:
        raise ValueError(f"LoRA rank {rank} is above vLLM's largest max_lora_rank {allowed[-1]}: lower "
                         "actor_rollout_ref.model.lora_rank or set actor_rollout_ref.rollout.lora_sync=merged")
    return fits[0]


def engine_args(lora: LoraSpec) -> dict:
    """vllm.LLM keyword arguments that enable LoRA for this run's adapters."""
    targets = None if isinstance(lora.target_modules, str) else list(lora.target_modules)  # "all-linear": no filter
    return dict(enable_lora=True, max_lora_rank=max_lora_rank(lora.rank), max_loras=1, max_cpu_loras=1,
                lora_target_modules=targets)


def peft_config(lora: LoraSpec) -> dict:
    """The adapter_config.json fields vLLM's PEFTHelper needs (models/loading.py builds the same LoraConfig)."""
    targets = lora.target_modules if isinstance(lora.target_modules, str) else list(lora.target_modules)
    return dict(r=lora.rank, lora_alpha=lora.alpha, target_modules=targets, bias="none")


def vllm_name(peft_name: str) -> str:
    """peft's '...q_proj.lora_A.default.weight' -> '...q_proj.lora_A.weight' (the adapter file's name)."""
    return peft_name.replace(f".{ADAPTER}.", ".")


def load_adapter(worker, adapter_id: int, tensors: dict[str, torch.Tensor], config: dict) -> list[int]:
    """Run inside vLLM's worker: register `tensors` as adapter `adapter_id`, dropping every other one.

    Returns the adapter ids registered afterwards (just `adapter_id`), which the tests check.
    """
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper

    manager = worker.model_runner.lora_manager  # LRUCacheWorkerLoRAManager
    helper = PEFTHelper.from_dict({**config, "vllm_max_position_embeddings": manager.max_position_embeddings})
    helper.validate_legal(manager.lora_config)
    model = manager._adapter_manager.model
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    # device="cpu": the manager's cache lives on the host; activation copies it into the device slots.
    adapter = LoRAModel.from_lora_tensors(adapter_id, tensors, helper, device="cpu",
                                          dtype=manager.lora_config.lora_dtype, model_vocab_size=manager.vocab_size,
                                          weights_mapper=None if mapper is None else mapper.get_rename_mapper())
    # The old adapter goes first, so at most one is held (memory flat over a run: max_cpu_loras=1).
    for old in manager.list_adapters():
        manager.remove_adapter(old)
    manager._adapter_manager.add_adapter(adapter)
    return sorted(manager.list_adapters())


def adapter_tensors(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """peft-named adapter tensors (weight_sync.iter_adapter_weights: none aliases a trained parameter)
    -> {vLLM name: tensor}."""
    return {vllm_name(name): tensor for name, tensor in named_tensors}
