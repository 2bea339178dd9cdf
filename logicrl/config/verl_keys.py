"""Keys of current verl's config that logicrl's schema lacks: each mapped, ignored or refused, in one line.

A verl run script sets keys that tune verl's own machinery (fused kernels, FSDP wrap policies, vLLM's
scheduler, shared-memory loading, profilers). logicrl takes such a script with only the entry point and
paths changed, so every such key found in verl's example scripts has one rule here:

  rename   the same meaning under a logicrl key; a warning says what it became
  ignore   changes how verl computes, not what: dropped with a warning naming it
  refuse   would change results and logicrl cannot do it: a ConfigError naming what to use
  (some keys are ignored at verl's default value and refused at any other)

A key under a subtree rule (`global_profiler`) goes with its subtree; a verl key missing here is an
unknown-key error. Hydra's struct mode rejects keys its config lacks, so cli.check_overrides rewrites
these as `++key=value` and `take_verl_keys` (validate's first step) removes them before the schema
merge; conf/ and the schema keep none of them (they would be keys that do nothing).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from logicrl.config.errors import ConfigError, log
from logicrl.config.phases import ARR
from logicrl.config.schema import all_keys

# A rule gets the key and its plain value, logs its one line or raises, and returns the logicrl
# (key, value) pairs to set.
Rule = Callable[[str, Any], list[tuple[str, Any]]]


def shown(key: str, value: Any) -> str:
    """`key=value`, or for a subtree each leaf set under it: `k.a=1, k.b.c=2`."""
    if not isinstance(value, dict) or not value:
        return f"{key}={value}"
    return ", ".join(shown(f"{key}.{k}", v) for k, v in value.items())


def ignore(why: str) -> Rule:
    def rule(key: str, value: Any) -> list[tuple[str, Any]]:
        log.warning(f"{shown(key, value)} is ignored: {why}")
        return []
    return rule


def ignore_only(allowed: tuple, why: str, refusal: str) -> Rule:
    """Ignored at the values in `allowed` (they ask for what logicrl does anyway); refused at any other."""
    def rule(key: str, value: Any) -> list[tuple[str, Any]]:
        return (ignore(why) if value in allowed else refuse(refusal))(key, value)
    return rule


def refuse(why: str) -> Rule:
    def rule(key: str, value: Any) -> list[tuple[str, Any]]:
        raise ConfigError(f"{shown(key, value)}: {why}")
    return rule


def rename(target: str) -> Rule:
    def rule(key: str, value: Any) -> list[tuple[str, Any]]:
        log.warning(f"{key}={value} is verl's spelling: using {target}={value}")
        return [(target, value)]
    return rule


def filter_overlong(key: str, value: Any) -> list[tuple[str, Any]]:
    # verl filters over-long prompts when the dataset loads, before truncation could see them, so
    # filtering wins over whatever data.truncation says: the scripts set both (truncation='error').
    if value:
        log.warning(f"{key}={value} is verl's spelling: using data.truncation=filter")
        return [("data.truncation", "filter")]
    return ignore("verl's default; over-long prompts follow data.truncation")(key, value)


def resume_from_path(key: str, value: Any, cfg: DictConfig) -> list[tuple[str, Any]]:
    # verl resumes from it only with trainer.resume_mode=resume_path; logicrl's resume_mode takes the path itself.
    if value is None or OmegaConf.select(cfg, "trainer.resume_mode") != "resume_path":
        return ignore("verl reads it only with trainer.resume_mode=resume_path")(key, value)
    log.warning(f"{key}={value} with trainer.resume_mode=resume_path is verl's spelling: using "
                f"trainer.resume_mode={value}")
    return [("trainer.resume_mode", value)]


resume_from_path.reads_config = True  # type: ignore[attr-defined]


def agent_loop(key: str, value: Any) -> list[tuple[str, Any]]:
    # verl runs the tool loop for tool_agent; here multi_turn.enable does, so the script's choice becomes it
    # rather than quietly generating one turn (verl's own silent fallback to single_turn_agent).
    if value == "tool_agent":
        log.warning(f"{key}={value} is verl's spelling: using {ARR}.rollout.multi_turn.enable=True")
        return [(f"{ARR}.rollout.multi_turn.enable", True)]
    if value == "single_turn_agent":
        return ignore("one response per prompt unless multi_turn.enable=True")(key, value)
    raise ConfigError(f"{key}={value}: logicrl's agent loops are single_turn_agent and tool_agent "
                      f"({ARR}.rollout.multi_turn.enable=True): use one of them")


def rollout_mode(key: str, value: Any) -> list[tuple[str, Any]]:
    # verl's async mode runs the same sampling through an agent loop and a rollout server, for multi-turn
    # and for overlapping requests; for one response per prompt it draws from the same distribution.
    if value == "async":
        log.info(f"{key}=async: single-turn rollout samples the same distribution either way; logicrl "
                 "generates in each rank's engine (sync)")
        return []
    if value == "sync":
        return ignore("logicrl's rollout is synchronous")(key, value)
    raise ConfigError(f"{key}={value} is not sync or async: set actor_rollout_ref.rollout.mode=sync or drop it")


def sandbox_fusion(key: str, value: Any) -> list[tuple[str, Any]]:
    if isinstance(value, dict) and value.get("url"):
        raise ConfigError(f"{key}.url={value['url']}: running code in a sandbox to score it is not implemented: drop "
                          "the sandbox_fusion keys, or score with a reward.custom.path function")
    return ignore("without a url verl runs no sandbox")(key, value)


def subtree_switch(switch: str, what: str) -> Rule:
    """A verl feature's subtree (`key.enable`, `key.enabled`): its settings are ignored while it is off, and the
    subtree is refused once it is on."""
    def rule(key: str, value: Any) -> list[tuple[str, Any]]:
        if isinstance(value, dict) and value.get(switch) not in (None, False):
            raise ConfigError(f"{key}.{switch}={value[switch]}: {what} is not implemented: drop the {key} keys")
        return ignore(f"settings of {what}, which is off")(key, value)
    return rule


def mixed_precision_dtype(key: str, value: Any) -> list[tuple[str, Any]]:
    # FSDP2's param_dtype is the compute dtype, which logicrl takes from model.dtype for every model.
    dtype = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16",
             "fp32": "float32", "float32": "float32"}.get(str(value))
    if dtype is None:
        raise ConfigError(f"{key}={value}: not a dtype logicrl computes in: set {ARR}.model.dtype (bfloat16, float16 "
                          "or float32)")
    log.warning(f"{key}={value} is verl's spelling: using {ARR}.model.dtype={dtype}")
    return [(f"{ARR}.model.dtype", dtype)]


def offload_policy(key: str, value: Any) -> list[tuple[str, Any]]:
    # verl's FSDP2 CPUOffloadPolicy (parameters and gradients on the host, the step there) is what logicrl's
    # param_offload builds (workers/fsdp.py).
    if not value:
        return ignore("verl's default: no FSDP2 CPU offload policy")(key, value)
    target = key.rsplit(".", 1)[0] + ".param_offload"
    log.warning(f"{key}={value} is verl's spelling: using {target}=true (FSDP2's CPUOffloadPolicy)")
    return [(target, True)]


def lora_subtree(key: str, value: Any) -> list[tuple[str, Any]]:
    # verl's model.lora.merge syncs W + BA into the engine instead of adapters: logicrl's rollout.lora_sync. Its
    # other keys (rank, alpha, init) configure Megatron's LoRA.
    value = value if isinstance(value, dict) else {}
    if set(value) - {"merge"}:
        raise ConfigError(f"{shown(key, value)}: Megatron's LoRA settings; logicrl's are {ARR}.model.lora_rank, "
                          "lora_alpha and target_modules")
    sync = "merged" if value.get("merge") else "adapters"
    log.warning(f"{shown(key, value)} is verl's spelling: using {ARR}.rollout.lora_sync={sync}")
    return [(f"{ARR}.rollout.lora_sync", sync)]


STRATEGY = ignore_only(("fsdp", "fsdp2"), "every model trains and runs with FSDP2",
                       "logicrl implements FSDP2 only: set fsdp or fsdp2")
LOGPROB_INTERNALS = ("logicrl computes log-probs and entropy chunked over tokens (models/spec.py "
                     "LOGPROB_CHUNK_TOKENS): the same numbers")
FSDP_INTERNALS = ("FSDP2 wrapping and prefetching in logicrl is fixed (one unit per decoder layer and a root): "
                  "the same results")
OFFLOAD_MEMORY = "only moves memory, which the preflight plan checks: the same results"
REWARD_LOOP = ("how verl serves the reward model (its reward loop, an inference engine); logicrl scores with it "
               "as an FSDP2 forward on every rank: the same scores")
CUSTOM_REWARD_LOOP = "a custom verl reward loop is not loaded: use reward.custom.path"
OTHER_ENGINE = "logicrl trains with FSDP2 only (verl's dp engine): drop the {} keys, or run it under verl"
PROFILER = "logicrl reports each phase's time and memory in its metrics"

VERL_KEYS: dict[str, Rule] = {
    # ---- data
    "data.filter_overlong_prompts": filter_overlong,
    "data.filter_overlong_prompts_workers": ignore("logicrl measures prompts in the driver"),
    "data.dataloader_num_workers": ignore("logicrl loads prompts in the driver"),
    "data.return_raw_chat": ignore("logicrl applies the chat template itself (data/prompts.py); verl's raw chat "
                                   "feeds its async agent loop"),
    "data.use_shm": ignore("logicrl reads the data files where they are"),
    "data.trust_remote_code": ignore("logicrl loads tokenizers without running code from the checkpoint"),
    # ---- actor_rollout_ref.model
    f"{ARR}.model.use_shm": ignore("logicrl loads the checkpoint from its directory, not through /dev/shm"),
    f"{ARR}.model.trust_remote_code": ignore("logicrl loads architectures transformers ships, without running code "
                                            "from the checkpoint"),
    f"{ARR}.model.use_fused_kernels": ignore(LOGPROB_INTERNALS),
    f"{ARR}.model.fused_kernel_options": ignore(LOGPROB_INTERNALS),
    f"{ARR}.model.use_liger": ignore("Liger kernels compute the same numbers faster; logicrl uses "
                                     "transformers' modules"),
    f"{ARR}.model.enable_activation_offload": ignore(OFFLOAD_MEMORY),
    f"{ARR}.nccl_timeout": rename("trainer.collective_timeout_s"),
    # ---- actor and ref internals
    f"{ARR}.actor.use_torch_compile": ignore(LOGPROB_INTERNALS),
    f"{ARR}.ref.use_torch_compile": ignore(LOGPROB_INTERNALS),
    f"{ARR}.actor.entropy_from_logits_with_chunking": ignore(LOGPROB_INTERNALS),
    f"{ARR}.ref.entropy_from_logits_with_chunking": ignore(LOGPROB_INTERNALS),
    f"{ARR}.actor.entropy_checkpointing": ignore(LOGPROB_INTERNALS),
    f"{ARR}.ref.entropy_checkpointing": ignore(LOGPROB_INTERNALS),
    f"{ARR}.ref.strategy": STRATEGY,
    "critic.strategy": STRATEGY,
    f"{ARR}.actor.profiler": ignore(PROFILER),
    f"{ARR}.ref.profiler": ignore(PROFILER),
    "critic.profiler": ignore(PROFILER),
    "global_profiler": ignore(PROFILER),
    f"{ARR}.actor.checkpoint": ignore("a logicrl checkpoint always holds model, optimizer and trainer state"),
    f"{ARR}.actor.optim.clip_grad": rename(f"{ARR}.actor.grad_clip"),
    "critic.optim.clip_grad": rename("critic.grad_clip"),
    f"{ARR}.actor.fsdp_config.model_dtype": refuse(f"logicrl computes in {ARR}.model.dtype (actor, reference and "
                                                   "rollout) and keeps fp32 master weights for the trained models "
                                                   f"when it is narrower: set {ARR}.model.dtype instead"),
    # verl >= 0.4 keeps the critic's FSDP settings under critic.model, and its current config under critic.fsdp.
    "critic.model.fsdp_config.param_offload": rename("critic.fsdp_config.param_offload"),
    "critic.model.fsdp_config.optimizer_offload": rename("critic.fsdp_config.optimizer_offload"),
    "critic.fsdp.param_offload": rename("critic.fsdp_config.param_offload"),
    "critic.fsdp.optimizer_offload": rename("critic.fsdp_config.optimizer_offload"),
    "critic.fsdp.model_dtype": refuse(f"logicrl computes in {ARR}.model.dtype and keeps fp32 master weights for "
                                      f"the critic when it is narrower: set {ARR}.model.dtype instead"),
    # Current verl reads each role's Ulysses group size under its FSDP settings (the role-level key is its
    # deprecated spelling); logicrl keeps it at the role's level.
    f"{ARR}.actor.fsdp_config.ulysses_sequence_parallel_size": rename(f"{ARR}.actor.ulysses_sequence_parallel_size"),
    f"{ARR}.ref.fsdp_config.ulysses_sequence_parallel_size": rename(f"{ARR}.ref.ulysses_sequence_parallel_size"),
    "critic.fsdp.ulysses_sequence_parallel_size": rename("critic.ulysses_sequence_parallel_size"),
    "critic.model.fsdp_config.ulysses_sequence_parallel_size": rename("critic.ulysses_sequence_parallel_size"),
    "reward_model.model.fsdp_config.ulysses_sequence_parallel_size":
        rename("reward_model.ulysses_sequence_parallel_size"),
    # verl's SAPO scripts set these under policy_loss; its loss reads actor.tau_pos / tau_neg, where logicrl
    # keeps them too (the scripts' values are verl's defaults).
    f"{ARR}.actor.policy_loss.tau_pos": rename(f"{ARR}.actor.tau_pos"),
    f"{ARR}.actor.policy_loss.tau_neg": rename(f"{ARR}.actor.tau_neg"),
    "critic.forward_micro_batch_size_per_gpu": ignore("the values pass uses critic.ppo_micro_batch_size_per_gpu"),
    "critic.forward_max_token_len_per_gpu": ignore("the values pass uses critic.ppo_max_token_len_per_gpu"),
    # ---- rollout
    f"{ARR}.rollout.mode": rollout_mode,
    # verl's multi_turn keys that logicrl's (conf/actor_rollout_ref) lack: user turns need an interaction,
    # which logicrl does not run; the others ask for what logicrl does anyway.
    f"{ARR}.rollout.multi_turn.max_user_turns": ignore_only(
        (None,), "no user turns: only tools answer the model",
        "user turns (an interaction answering the model) are not implemented; tools are: drop it"),
    f"{ARR}.rollout.multi_turn.interaction_config_path": ignore_only(
        (None,), "no interaction configured",
        "interactions (a simulated user) are not implemented; tools are: drop it"),
    f"{ARR}.rollout.multi_turn.use_inference_chat_template": ignore_only(
        (False,), "logicrl renders tool turns with the model's own chat template",
        "logicrl renders tool turns with the model's own chat template only: drop it"),
    f"{ARR}.rollout.multi_turn.tokenization_sanity_check_mode": ignore(
        "logicrl never re-tokenizes a conversation (tool turns are appended as token ids); its tests check the "
        "ids equal the chat template's rendering"),
    f"{ARR}.rollout.agent.default_agent_loop": agent_loop,
    f"{ARR}.rollout.agent.num_workers": ignore("each rank runs its own rows' turns; tools run in parallel up to "
                                               "multi_turn.max_parallel_calls"),
    f"{ARR}.rollout.agent.agent_loop_config_path": ignore_only(
        (None,), "no custom agent loop", "custom agent loops are not loaded; multi_turn.enable=true runs the tool "
        "loop: drop it"),
    f"{ARR}.rollout.load_format": ignore("how verl's engine initialises weights before the first sync; logicrl's "
                                         "engine loads model.path"),
    f"{ARR}.rollout.layered_summon": ignore("logicrl syncs weights in buckets of rollout.update_weights_bucket_mb"),
    f"{ARR}.rollout.checkpoint_engine.update_weights_bucket_megabytes":
        rename(f"{ARR}.rollout.update_weights_bucket_mb"),
    f"{ARR}.rollout.enable_chunked_prefill": ignore("vLLM's prefill scheduling, not the samples; logicrl "
                                                    "chunks prefills on CUDA only, by rollout.max_num_batched_tokens"),
    f"{ARR}.rollout.multi_stage_wake_up": ignore(OFFLOAD_MEMORY),
    f"{ARR}.rollout.calculate_log_probs": ignore("logicrl's engines always return the log-probs of what they "
                                                 "sample (rollout correction reads them)"),
    f"{ARR}.rollout.disable_log_stats": ignore("vLLM's own logging"),
    f"{ARR}.rollout.skip_tokenizer_init": ignore("whether vLLM loads a tokenizer; logicrl hands it token ids "
                                                 "either way"),
    f"{ARR}.rollout.cudagraph_capture_sizes": ignore("CUDA graph sizes change speed, not samples"),
    f"{ARR}.rollout.max_model_len": ignore("logicrl sizes the engine to data.max_prompt_length + "
                                           "data.max_response_length"),
    f"{ARR}.rollout.engine_kwargs": ignore("engine-specific tuning passed to vLLM/SGLang by verl"),
    # ---- algorithm, reward, trainer
    "ray_kwargs": ignore("how verl's launcher starts Ray (runtime env, interpreter, CPUs, GPUs); logicrl starts "
                         "its own Ray for trainer.n_gpus ranks, or joins trainer.ray_address"),
    "algorithm.use_pf_ppo": ignore_only((False,), "verl's default: no reweighting",
                                        "PF-PPO's reward-weighted resampling is not implemented: drop it"),
    # ---- reward_model (the group itself is logicrl's, conf/reward_model/default.yaml)
    "reward_model.strategy": STRATEGY,
    "reward_model.enable_resource_pool": ignore_only(
        (False,), "the reward model shares every rank with the other models",
        "logicrl holds the reward model beside actor, critic and reference on every rank (the hybrid worker), "
        "not in a pool of its own: drop it"),
    "reward_model.n_gpus_per_node": ignore("verl reads it only with enable_resource_pool=True"),
    "reward_model.nnodes": ignore("verl reads it only with enable_resource_pool=True"),
    "reward_model.profiler": ignore(PROFILER),
    "reward_model.model.use_shm": ignore("logicrl loads the checkpoint from its directory, not through /dev/shm"),
    "reward_model.model.use_fused_kernels": ignore("fused kernels compute the same scores faster; logicrl uses "
                                                   "transformers' modules"),
    "reward_model.model.external_lib": ignore_only(
        (None,), "no library named", "logicrl imports no model library: it loads architectures transformers ships, "
        "or the checkpoint's own code with reward_model.model.trust_remote_code=true"),
    "reward_model.model.override_config": ignore_only(
        ({},), "no override given", "overriding the reward model's config.json is not implemented: edit a copy "
        "of the checkpoint"),
    "reward_model.reward_manager": ignore("verl's reward manager for rule rewards; logicrl scores rules by "
                                          "data_source (reward.custom.path replaces them), with DAPO's overlong "
                                          "penalty as reward.overlong_buffer.*"),
    # verl's DAPO recipe (recipe/dapo, tests/special_e2e/run_dapo.sh) spells the overlong penalty here.
    "reward_model.overlong_buffer.enable": rename("reward.overlong_buffer.enable"),
    "reward_model.overlong_buffer.len": rename("reward.overlong_buffer.len"),
    "reward_model.overlong_buffer.penalty_factor": rename("reward.overlong_buffer.penalty_factor"),
    "reward_model.overlong_buffer.log": ignore("logicrl always logs reward/overlong_penalty/mean"),
    "reward_model.reward_kwargs": refuse("logicrl's reward manager takes no kwargs: DAPO's overlong penalty is "
                                         "reward.overlong_buffer.*, a custom reward function reward.custom.path"),
    "reward_model.launch_reward_fn_async": ignore("when rule rewards are computed, not what they are"),
    "reward_model.sandbox_fusion": sandbox_fusion,
    "reward_model.use_reward_loop": ignore(REWARD_LOOP),
    "reward_model.num_workers": ignore(REWARD_LOOP),
    "reward_model.rollout": ignore(REWARD_LOOP),
    "reward_model.reward_loop_source": ignore_only(("register",), REWARD_LOOP,
                                                   "a custom verl reward loop is not loaded: use reward.custom.path"),
    "reward_model.reward_loop_module_path": ignore_only((None,), REWARD_LOOP, CUSTOM_REWARD_LOOP),
    "reward_model.reward_loop_class_name": ignore_only((None,), REWARD_LOOP, CUSTOM_REWARD_LOOP),
    "trainer.resume_from_path": resume_from_path,
    "trainer.use_legacy_worker_impl": ignore("logicrl has one worker implementation"),
    "trainer.log_val_generations": ignore("logicrl writes validation samples to val_generations/ in the run dir"),
    "trainer.max_critic_ckpt_to_keep": ignore("a checkpoint holds actor and critic together: "
                                              "trainer.max_actor_ckpt_to_keep prunes both"),
    # ---- what verl's current example scripts set besides (tests/config/verl_examples.json)
    "model_engine": ignore_only(("dp",), "verl's FSDP engine, the one logicrl has",
                                "logicrl trains with FSDP2 only (verl's dp engine): drop it, or run it under verl"),
    f"{ARR}.actor.model_engine": ignore_only(("dp",), "verl's FSDP engine, the one logicrl has",
                                             "logicrl trains with FSDP2 only (verl's dp engine): drop it"),
    f"{ARR}.actor.fsdp_config.offload_policy": offload_policy,
    f"{ARR}.ref.fsdp_config.offload_policy": offload_policy,
    f"{ARR}.actor.fsdp_config.mixed_precision.param_dtype": mixed_precision_dtype,
    f"{ARR}.actor.fsdp_config.mixed_precision.reduce_dtype": ignore("logicrl reduces gradients in fp32 whatever is "
                                                                   "asked: the same sums, rounded less"),
    f"{ARR}.actor.fsdp_config.mixed_precision.buffer_dtype": ignore("logicrl keeps buffers in the dtype they load in"),
    f"{ARR}.actor.fsdp_config.entropy_checkpointing": ignore(LOGPROB_INTERNALS),
    f"{ARR}.actor.fsdp_config.entropy_from_logits_with_chunking": ignore(LOGPROB_INTERNALS),
    f"{ARR}.ref.fsdp_config.entropy_from_logits_with_chunking": ignore(LOGPROB_INTERNALS),
    f"{ARR}.ref.fsdp_config.optimizer_offload": ignore("the reference has no optimizer"),
    f"{ARR}.ref.fsdp_config.model_dtype": ignore_only(
        ("bf16", "bfloat16"), f"the reference computes in {ARR}.model.dtype: bfloat16 on CUDA",
        f"the reference computes in {ARR}.model.dtype: set that instead"),
    f"{ARR}.actor.pad_to_length": ignore("pads rows to fixed lengths for verl's compiled kernels; logicrl packs or "
                                         "pads per micro-batch: the same log-probs"),
    f"{ARR}.actor.use_prefix_grouper": ignore("computes a group's shared prompt once; logicrl computes each row "
                                              "whole: the same log-probs"),
    f"{ARR}.actor.calculate_sum_pi_squared": ignore_only(
        (False,), "verl's default", "the sum of squared probabilities feeds verl's optimal-token-baseline "
        "estimator, which logicrl does not implement: drop it"),
    f"{ARR}.actor.optim.optimizer": ignore_only(("AdamW", "adamw"), "logicrl's optimizer is AdamW",
                                                "logicrl trains with AdamW only: drop it"),
    f"{ARR}.actor.optim.betas": ignore_only(([0.9, 0.999],), "torch's AdamW betas, which logicrl uses",
                                            "logicrl's AdamW keeps torch's betas [0.9, 0.999]: drop it"),
    f"{ARR}.actor.optim.lr_decay_style": rename(f"{ARR}.actor.optim.lr_scheduler_type"),
    f"{ARR}.actor.optim.min_lr": refuse("a floor for the learning-rate schedule is not implemented (logicrl's cosine "
                                        "decays to 0): drop it"),
    f"{ARR}.actor.optim.override_optimizer_config": refuse(
        f"Megatron's optimizer settings; logicrl's optimizer offload is {ARR}.actor.fsdp_config.optimizer_offload"),
    f"{ARR}.model.exclude_modules": ignore_only((None,), "no module excluded",
                                                f"logicrl's LoRA takes {ARR}.model.target_modules only: list the "
                                                "modules to adapt there"),
    f"{ARR}.model.lora": lora_subtree,
    f"{ARR}.model.lora_adapter_path": ignore_only((None,), "no adapter to start from",
                                                  "starting from a saved LoRA adapter is not implemented: merge it "
                                                  "into the checkpoint first"),
    f"{ARR}.model.mtp": subtree_switch("enable", "multi-token prediction (MTP)"),
    f"{ARR}.model.override_config": ignore_only(({},), "no override given", "overriding the checkpoint's config.json "
                                                "is not implemented: edit a copy of the checkpoint"),
    f"{ARR}.rollout.data_parallel_size": ignore("each rank (or tensor-parallel group) runs its own engine: "
                                                "generation is data-parallel over them already"),
    f"{ARR}.rollout.dtype": ignore_only(("bfloat16", "bf16"), f"the engine computes in {ARR}.model.dtype: bfloat16 "
                                        "on CUDA", f"the engine computes in {ARR}.model.dtype: set that instead"),
    f"{ARR}.rollout.expert_parallel_size": ignore_only((1,), "no expert parallelism",
                                                       "expert parallelism (MoE) is not implemented: drop it"),
    f"{ARR}.rollout.moe_tensor_parallel_size": refuse("MoE tensor parallelism in the engine is not implemented: "
                                                      "drop it"),
    f"{ARR}.rollout.enable_rollout_routing_replay": ignore_only((False,), "verl's default",
                                                                "MoE routing replay is not implemented: drop it"),
    f"{ARR}.rollout.ignore_eos": ignore_only((False,), "logicrl's engines stop at EOS",
                                             "generating past EOS is not implemented: drop it"),
    f"{ARR}.rollout.profiler": ignore(PROFILER),
    f"{ARR}.rollout.prompt_length": ignore("the engine's room for the prompt: logicrl sizes it to "
                                           "data.max_prompt_length"),
    f"{ARR}.rollout.response_length": rename("data.max_response_length"),
    "algorithm.gdpo_reward_keys": refuse("GDPO's per-reward normalisation is not implemented: drop it"),
    "critic.enable": ignore_only((None, False), "logicrl builds a critic exactly when algorithm.adv_estimator=gae",
                                 "logicrl builds a critic exactly when algorithm.adv_estimator=gae: set that"),
    "data.apply_chat_template_kwargs": ignore_only(({},), "no arguments", "passing arguments to the chat template "
                                                   "is not implemented: render the prompts with them into the data"),
    "data.custom_cls": ignore_only(({"path": None, "name": None}, {"path": None}), "verl's own dataset class",
                                   "a custom dataset class is not loaded: write the prompts into .parquet or .jsonl "
                                   "in verl's schema"),
    "data.image_key": ignore("logicrl reads text prompts; a multimodal checkpoint is refused by its architecture"),
    "data.image_patch_size": ignore("logicrl reads text prompts; a multimodal checkpoint is refused by its "
                                    "architecture"),
    "distillation": subtree_switch("enabled", "on-policy distillation"),
    # verl's newest spellings of the reward settings, under reward.
    "reward.custom_reward_function.path": rename("reward.custom.path"),
    "reward.custom_reward_function.name": rename("reward.custom.name"),
    "reward.num_workers": ignore(REWARD_LOOP),
    "reward.reward_manager.name": ignore_only(("naive", "dapo"), "logicrl scores rules by data_source (DAPO's "
                                              "overlong penalty is reward.overlong_buffer.*)",
                                              "verl's other reward managers are not implemented: score with a "
                                              "reward.custom.path function"),
    "reward.reward_kwargs.overlong_buffer_cfg.enable": rename("reward.overlong_buffer.enable"),
    "reward.reward_kwargs.overlong_buffer_cfg.len": rename("reward.overlong_buffer.len"),
    "reward.reward_kwargs.overlong_buffer_cfg.penalty_factor": rename("reward.overlong_buffer.penalty_factor"),
    "reward.reward_kwargs.overlong_buffer_cfg.log": ignore("logicrl always logs reward/overlong_penalty/mean"),
    "reward.reward_kwargs.max_resp_len": ignore("the overlong penalty counts to data.max_response_length"),
    "reward.reward_model.enable": rename("reward_model.enable"),
    "reward.reward_model.model_path": rename("reward_model.model.path"),
    "reward.reward_model.rollout": ignore(REWARD_LOOP),
}
# Other training engines' subtrees (Megatron-LM, Megatron-lite, VeOmni, FSDP-turbo's plans).
for _role in (f"{ARR}.actor", f"{ARR}.ref", "critic"):
    VERL_KEYS[f"{_role}.megatron"] = refuse(OTHER_ENGINE.format("megatron"))
    VERL_KEYS[f"{_role}.veomni"] = refuse(OTHER_ENGINE.format("veomni"))
    VERL_KEYS[f"{_role}.engine"] = refuse(OTHER_ENGINE.format("Megatron-lite engine"))
for _root in (f"{ARR}.actor.fsdp_config", f"{ARR}.ref.fsdp_config", "critic.fsdp"):
    VERL_KEYS[f"{_root}.turbo_config"] = refuse("FSDP-turbo's expert-parallel, sharding and recompute plans are not "
                                                "implemented: drop the turbo_config keys")
# FSDP wrapping and prefetch settings under each role's fsdp_config (the critic's under critic.model).
for _root in (f"{ARR}.actor.fsdp_config", f"{ARR}.ref.fsdp_config", "critic.model.fsdp_config", "critic.fsdp",
              "reward_model.model.fsdp_config"):
    for _leaf in ("wrap_policy", "fsdp_size", "forward_prefetch", "use_orig_params", "reshard_after_forward"):
        VERL_KEYS[f"{_root}.{_leaf}"] = ignore(FSDP_INTERNALS)
    VERL_KEYS[f"{_root}.strategy"] = STRATEGY


def verl_rule_key(key: str) -> str | None:
    """The table entry that handles `key` (itself, or the subtree it lies in), or None."""
    parts = key.split(".")
    for i in range(len(parts), 0, -1):
        prefix = ".".join(parts[:i])
        if prefix in VERL_KEYS:
            return prefix
    return None


def take_verl_keys(cfg: DictConfig) -> DictConfig:
    """`cfg` without verl-only keys, their logicrl equivalents set (a copy; `cfg` is left as it is).

    Raises ConfigError for a key logicrl refuses. Each key found logs one line.
    """
    absent = object()
    found = [(k, OmegaConf.select(cfg, k, default=absent)) for k in VERL_KEYS]
    found = [(k, v) for k, v in found if v is not absent]
    if not found:
        return cfg
    cfg = copy.deepcopy(cfg)
    updates = []
    for key, value in found:
        plain = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
        rule = VERL_KEYS[key]
        updates += rule(key, plain, cfg) if getattr(rule, "reads_config", False) else rule(key, plain)
        _delete(cfg, key)
    for key, value in updates:
        OmegaConf.update(cfg, key, value, merge=False)
    return cfg


def _delete(cfg: DictConfig, key: str) -> None:
    """Remove `key`, then every parent it leaves empty that the schema does not know."""
    schema_keys = set(all_keys())
    with open_dict(cfg):
        while key:
            parent, _, leaf = key.rpartition(".")
            node = OmegaConf.select(cfg, parent) if parent else cfg
            del node[leaf]
            if not parent or parent in schema_keys or len(OmegaConf.select(cfg, parent)):
                return
            key = parent
