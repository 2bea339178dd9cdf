"""Typed schemas for every config group.

The YAML files in conf/ hold the values and the comments; these dataclasses hold the types and the
per-key constraints (in field metadata), so neither duplicates the other: every field here is
MISSING and the YAML must supply it (tests/config/test_compose.py checks the two stay in step).
Constraints that involve several keys live in validate.py.

Field metadata understood by validate.py:
  choices     the value must be one of these
  ge/gt/le    numeric bounds (None values are skipped: Optional fields mean "unset")
  finite      the number must be finite (`lr=inf` passes `gt=0`; NaN fails every bound anyway)
Keys kept only so older verl/Logic-RL scripts run (their comments in conf/ say "Deprecated") are
mapped onto current ones by migrate.py.
"""

from __future__ import annotations

from dataclasses import MISSING as NO_FACTORY
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Optional

from omegaconf import MISSING

# The algorithm switches' names, from the torch-free list the registries in algos/ also read
# (config/ imports no torch: logicrl/algo_names.py says why).
from logicrl.algo_names import ADV_ESTIMATORS, KL_CONTROLLERS, KL_ESTIMATORS, LOSS_AGG_MODES, POLICY_LOSS_MODES
from logicrl.config.engines import ENGINES
from logicrl.models.quant_methods import METHODS as QUANT_METHODS

# reward.combine.mode: how a learned score and the rule reward make the sequence reward (its one list).
from logicrl.reward.combine import MODES as COMBINE_MODES

LR_SCHEDULES = ("constant", "cosine")
# fsdp_config.grad_accumulation: how gradients accumulate over micro-batches (workers/update.py).
GRAD_ACCUMULATION = ("auto", "sharded", "unsharded")
LOGGERS = ("console", "jsonl", "wandb", "tensorboard")


def key(*, choices=None, ge=None, gt=None, le=None, finite=None):
    """A schema field whose value comes from YAML, with its constraints as metadata."""
    meta = dict(choices=choices, ge=ge, gt=gt, le=le, finite=finite)
    return field(default=MISSING, metadata={k: v for k, v in meta.items() if v is not None})


def group(cls):
    return field(default_factory=cls)


# ---------------------------------------------------------------- data
@dataclass
class DataConfig:
    train_files: Any = key()  # str or list of str; checked in validate.py
    val_files: Any = key()
    prompt_key: str = key()
    max_prompt_length: int = key(ge=1)
    max_response_length: int = key(ge=1)
    train_batch_size: int = key(ge=1)
    gen_batch_size: Optional[int] = key(ge=1)
    val_batch_size: Optional[int] = key(ge=1)
    shuffle: bool = key()
    truncation: str = key(choices=("error", "filter", "left", "right"))
    skip_bad_rows: bool = key()
    seed: int = key()


# ---------------------------------------------------------------- actor_rollout_ref
@dataclass
class ModelConfig:
    path: str = key()
    enable_gradient_checkpointing: bool = key()
    use_remove_padding: bool = key()
    lora_rank: int = key(ge=0)
    lora_alpha: float = key(gt=0)
    target_modules: Any = key()  # "all-linear" or a list of module names
    dtype: str = key(choices=("auto", "bfloat16", "float16", "float32"))
    # A frozen 4-bit base under LoRA (models/quantize.py): null (none) or nf4.
    quantization: Optional[str] = key(choices=QUANT_METHODS)
    quantization_block_size: int = key(ge=2)
    quantization_scaler_block_size: int = key(ge=1)


@dataclass
class OptimConfig:
    lr: float = key(gt=0, finite=True)
    weight_decay: float = key(ge=0, finite=True)
    lr_warmup_steps_ratio: float = key(ge=0, le=1)
    lr_warmup_steps: int = key(ge=-1)
    lr_scheduler_type: str = key(choices=LR_SCHEDULES)


@dataclass
class ActorFSDPConfig:
    param_offload: bool = key()
    optimizer_offload: bool = key()
    grad_offload: Optional[bool] = key()
    grad_accumulation: str = key(choices=GRAD_ACCUMULATION)


@dataclass
class PolicyLossConfig:
    loss_mode: str = key(choices=POLICY_LOSS_MODES)
    # A user's module that registers more losses (config/loss_module.py); with it, this group takes
    # the keys of their parameters too.
    module: Optional[str] = key()
    clip_cov_ratio: float = key(gt=0, le=1)
    clip_cov_lb: float = key()
    clip_cov_ub: float = key()
    kl_cov_ratio: float = key(gt=0, le=1)
    ppo_kl_coef: float = key(ge=0, finite=True)


@dataclass
class ActorConfig:
    strategy: str = key(choices=("fsdp2", "fsdp"))
    ppo_mini_batch_size: int = key(ge=1)
    ppo_micro_batch_size_per_gpu: int = key(ge=1)
    ppo_micro_batch_size: Optional[int] = key(ge=1)
    use_dynamic_bsz: bool = key()
    ppo_max_token_len_per_gpu: int = key(ge=1)
    ppo_epochs: int = key(ge=1)
    ulysses_sequence_parallel_size: int = key(ge=1)
    clip_ratio: float = key(gt=0)
    clip_ratio_low: Optional[float] = key(gt=0)
    clip_ratio_high: Optional[float] = key(gt=0)
    clip_ratio_c: float = key(gt=1)
    tau_pos: float = key(gt=0)
    tau_neg: float = key(gt=0)
    # Any, not PolicyLossConfig: a user's loss module adds its parameters' keys after validation
    # (config/loss_module.py), which a typed node would refuse. Its keys are still PolicyLossConfig's.
    policy_loss: Any = group(PolicyLossConfig)
    loss_agg_mode: str = key(choices=LOSS_AGG_MODES)
    entropy_coeff: float = key(ge=0, finite=True)
    use_kl_loss: bool = key()
    kl_loss_coef: float = key(ge=0, finite=True)
    kl_loss_type: str = key(choices=KL_ESTIMATORS)
    grad_clip: float = key(gt=0)
    optim: OptimConfig = group(OptimConfig)
    fsdp_config: ActorFSDPConfig = group(ActorFSDPConfig)


@dataclass
class RefFSDPConfig:
    param_offload: bool = key()


@dataclass
class RefConfig:
    log_prob_micro_batch_size_per_gpu: int = key(ge=1)
    log_prob_use_dynamic_bsz: bool = key()
    log_prob_max_token_len_per_gpu: int = key(ge=1)
    log_prob_micro_batch_size: Optional[int] = key(ge=1)
    ulysses_sequence_parallel_size: int = key(ge=1)
    fsdp_config: RefFSDPConfig = group(RefFSDPConfig)


@dataclass
class ValKwargs:
    do_sample: bool = key()
    temperature: float = key(ge=0)
    top_p: float = key(gt=0, le=1)
    top_k: int = key(ge=-1)
    n: int = key(ge=1)


@dataclass
class MultiTurnConfig:
    enable: bool = key()
    max_assistant_turns: Optional[int] = key(ge=1)
    max_parallel_calls: int = key(ge=1)
    max_tool_response_length: int = key(ge=1)
    tool_response_truncate_side: str = key(choices=("left", "right", "middle"))
    tool_config_path: Optional[str] = key()
    function_tool_path: Optional[str] = key()
    format: str = key(choices=("hermes",))
    assistant_opening: str = key()


@dataclass
class RolloutConfig:
    name: str = key(choices=ENGINES)  # the engine table itself: an engine registered later is a choice too
    n: int = key(ge=1)
    temperature: float = key(gt=0)
    top_p: float = key(gt=0, le=1)
    top_k: int = key(ge=-1)
    gpu_memory_utilization: float = key(gt=0, le=1)
    kv_cache_gb: Optional[float] = key(gt=0)
    tensor_model_parallel_size: int = key(ge=1)
    log_prob_micro_batch_size_per_gpu: int = key(ge=1)
    log_prob_use_dynamic_bsz: bool = key()
    log_prob_max_token_len_per_gpu: int = key(ge=1)
    log_prob_micro_batch_size: Optional[int] = key(ge=1)
    max_num_seqs: int = key(ge=1)
    max_num_batched_tokens: int = key(ge=1)
    enforce_eager: Optional[bool] = key()  # None: eager on CPU, CUDA graphs on CUDA
    enable_prefix_caching: bool = key()
    free_cache_engine: bool = key()
    update_weights_bucket_mb: int = key(ge=1)
    lora_sync: str = key(choices=("adapters", "merged"))
    multi_turn: MultiTurnConfig = group(MultiTurnConfig)
    val_kwargs: ValKwargs = group(ValKwargs)


@dataclass
class ActorRolloutRefConfig:
    hybrid_engine: bool = key()  # false: rollout and training on separate device groups (config/async_training.py)
    model: ModelConfig = group(ModelConfig)
    actor: ActorConfig = group(ActorConfig)
    ref: RefConfig = group(RefConfig)
    rollout: RolloutConfig = group(RolloutConfig)


# ---------------------------------------------------------------- critic
@dataclass
class CriticModelConfig:
    path: str = key()
    enable_gradient_checkpointing: bool = key()
    use_remove_padding: bool = key()


@dataclass
class CriticFSDPConfig:
    param_offload: bool = key()
    optimizer_offload: bool = key()
    grad_accumulation: str = key(choices=GRAD_ACCUMULATION)


@dataclass
class CriticConfig:
    model: CriticModelConfig = group(CriticModelConfig)
    ppo_mini_batch_size: int = key(ge=1)
    ppo_micro_batch_size_per_gpu: int = key(ge=1)
    ppo_micro_batch_size: Optional[int] = key(ge=1)
    use_dynamic_bsz: bool = key()
    ppo_max_token_len_per_gpu: int = key(ge=1)
    ppo_epochs: int = key(ge=1)
    cliprange_value: float = key(gt=0)
    grad_clip: float = key(gt=0)
    ulysses_sequence_parallel_size: int = key(ge=1)
    optim: OptimConfig = group(OptimConfig)
    fsdp_config: CriticFSDPConfig = group(CriticFSDPConfig)


# ---------------------------------------------------------------- reward_model
@dataclass
class RewardModelFSDPConfig:
    param_offload: bool = key()


@dataclass
class RewardModelModelConfig:
    path: Optional[str] = key()  # required with enable=true (validate.py)
    input_tokenizer: Optional[str] = key()  # null: score the actor's tokens as they are
    trust_remote_code: bool = key()
    use_remove_padding: bool = key()
    fsdp_config: RewardModelFSDPConfig = group(RewardModelFSDPConfig)


@dataclass
class RewardModelConfig:
    enable: bool = key()
    model: RewardModelModelConfig = group(RewardModelModelConfig)
    micro_batch_size: Optional[int] = key(ge=1)
    micro_batch_size_per_gpu: int = key(ge=1)
    max_length: Optional[int] = key(ge=1)  # null: data.max_prompt_length + data.max_response_length
    use_dynamic_bsz: bool = key()
    forward_max_token_len_per_gpu: int = key(ge=1)
    ulysses_sequence_parallel_size: int = key(ge=1)


# ---------------------------------------------------------------- algorithm
@dataclass
class KLCtrlConfig:
    type: str = key(choices=KL_CONTROLLERS)
    kl_coef: float = key(ge=0, finite=True)
    target_kl: float = key(gt=0)
    horizon: int = key(ge=1)


@dataclass
class RolloutCorrectionConfig:
    rollout_is: Optional[str] = key(choices=("token", "sequence"))  # null: no IS weights
    rollout_is_threshold: float = key(gt=0)
    rollout_is_batch_normalize: bool = key()
    rollout_rs: Optional[str] = key()  # comma-separated options; parsed by algos/rollout_correction.py
    rollout_rs_threshold: Any = key()  # float, "lower_upper" or one per option
    bypass_mode: Optional[bool] = key()  # null: derived (config/async_training.py)
    loss_type: str = key(choices=("ppo_clip", "reinforce"))


@dataclass
class FilterGroupsConfig:
    enable: bool = key()
    metric: str = key()  # a reward component name is valid too: checked on the first round's results
    max_num_gen_batches: int = key(ge=0)  # 0: no limit on rounds (verl's); max_empty_rounds still bounds a step
    max_empty_rounds: int = key(ge=1)  # rounds in a row that keep no group end the step (trainer/dynamic_sampling.py)
    on_limit: str = key(choices=("train", "error"))


@dataclass
class AlgorithmConfig:
    adv_estimator: str = key(choices=ADV_ESTIMATORS)
    gamma: float = key(ge=0, le=1)
    lam: float = key(ge=0, le=1)
    norm_adv_by_std_in_grpo: bool = key()
    norm_adv_by_std_in_gae: bool = key()
    use_kl_in_reward: bool = key()
    kl_penalty: str = key(choices=KL_ESTIMATORS)
    kl_ctrl: KLCtrlConfig = group(KLCtrlConfig)
    rollout_correction: RolloutCorrectionConfig = group(RolloutCorrectionConfig)
    filter_groups: FilterGroupsConfig = group(FilterGroupsConfig)


# ---------------------------------------------------------------- reward
@dataclass
class CustomRewardConfig:
    path: Optional[str] = key()
    name: str = key()


@dataclass
class OverlongBufferConfig:
    enable: bool = key()
    len: int = key(ge=1)
    penalty_factor: float = key(ge=0)


@dataclass
class CombineWeights:
    model: float = key()
    rule: float = key()


@dataclass
class CombineConfig:
    mode: str = key(choices=COMBINE_MODES)
    weights: CombineWeights = group(CombineWeights)
    by_data_source: Any = key()  # {data_source: mode or {model, rule}}; checked by reward/combine.py


@dataclass
class RewardConfig:
    timeout_s: Optional[float] = key(gt=0, finite=True)  # null: rewards run in the driver, unbounded
    timeout_score: float = key(finite=True)
    custom: CustomRewardConfig = group(CustomRewardConfig)
    overlong_buffer: OverlongBufferConfig = group(OverlongBufferConfig)
    combine: CombineConfig = group(CombineConfig)


# ---------------------------------------------------------------- trainer
@dataclass
class TrainerConfig:
    project_name: str = key()
    experiment_name: str = key()
    logger: Any = key()  # list of LOGGERS; a bare string is accepted and wrapped
    nnodes: int = key(ge=1)
    ray_address: Optional[str] = key()  # null: a private local cluster (controller/cluster.py)
    ray_dashboard: bool = key()  # a private cluster's dashboard, on loopback
    n_gpus_per_node: Optional[int] = key(ge=1)
    n_gpus: Optional[int] = key(ge=1)
    device: str = key(choices=("auto", "cuda", "cpu"))
    total_epochs: int = key(ge=1)
    total_training_steps: Optional[int] = key(ge=1)
    save_freq: int = key(ge=-1)
    test_freq: int = key(ge=-1)
    val_before_train: bool = key()
    val_only: bool = key()
    critic_warmup: int = key(ge=0)
    resume_mode: str = key()  # auto | disable | a checkpoint path
    default_local_dir: str = key()
    default_hdfs_dir: Optional[str] = key()
    balance_batch: bool = key()
    max_actor_ckpt_to_keep: Optional[int] = key(ge=-1)  # null or -1 keeps all
    save_hf_model: bool = key()
    save_merged_lora: bool = key()
    seed: int = key()
    dry_run: bool = key()
    gpu_memory_gb: Optional[float] = key(gt=0)  # null: detect (logicrl/preflight/device.py)
    gpu_model: Optional[str] = key()  # null: the visible GPU's name (logicrl/timeplan/report.py)
    auto_micro_batch: bool = key()
    memory_plan: str = key(choices=("worst_case", "expected"))  # logicrl/memory/lengths.py
    expected_response_length: Optional[int] = key(ge=1)  # <= data.max_response_length (validate.py)
    verbose: bool = key()
    track_tensor_peaks: bool = key()  # CPU: tensor_peak_gb on step 1 and every 10th (memory/telemetry.py)
    plot_curves: bool = key()  # curves.png and phases.png at the end (trainer/curves.py)
    # The process group's timeout (workers/fsdp.py init_distributed), and how long a rank may go without a
    # heartbeat before the run ends (controller/heartbeat.py).
    collective_timeout_s: float = key(gt=0, finite=True)
    max_nonfinite_steps: int = key(ge=1)  # non-finite steps in a row that end the run (trainer/divergence.py)


# ---------------------------------------------------------------- separate groups (hybrid_engine=false)
@dataclass
class RolloutGroupConfig:
    nnodes: int = key(ge=1)
    n_gpus_per_node: int = key(ge=1)


@dataclass
class AsyncTrainingConfig:
    max_staleness: Optional[int] = key(ge=0)  # null: 1 with separate groups
    sync_timeout_s: float = key(gt=0)
    check_weights: bool = key()


# ---------------------------------------------------------------- curriculum
@dataclass
class CurriculumConfig:
    stages: Any = key()  # list of {name, overrides}; checked by trainer/curriculum.py
    carry_optimizer: bool = key()


# ---------------------------------------------------------------- eval
@dataclass
class EvalConfig:
    n: Optional[int] = key(ge=1)  # null: rollout.val_kwargs.n
    k: Any = key()  # list of ints in 1..n (config/evaluation.py)
    temperature: Optional[float] = key(ge=0)  # null: rollout.val_kwargs as given
    checkpoints: Any = key()  # list of paths (config/evaluation.py)


# ---------------------------------------------------------------- root
@dataclass
class CustomRewardFunctionAlias:
    """verl >= 0.3 spells reward.custom as a top-level custom_reward_function group."""

    path: Optional[str] = key()
    name: Optional[str] = key()


@dataclass
class RootConfig:
    data: DataConfig = group(DataConfig)
    actor_rollout_ref: ActorRolloutRefConfig = group(ActorRolloutRefConfig)
    critic: CriticConfig = group(CriticConfig)
    reward_model: RewardModelConfig = group(RewardModelConfig)
    algorithm: AlgorithmConfig = group(AlgorithmConfig)
    reward: RewardConfig = group(RewardConfig)
    trainer: TrainerConfig = group(TrainerConfig)
    rollout: RolloutGroupConfig = group(RolloutGroupConfig)
    async_training: AsyncTrainingConfig = group(AsyncTrainingConfig)
    curriculum: CurriculumConfig = group(CurriculumConfig)
    eval: EvalConfig = group(EvalConfig)
    custom_reward_function: CustomRewardFunctionAlias = group(CustomRewardFunctionAlias)


def iter_fields(cls=RootConfig, prefix=""):
    """Yield (dotted key, dataclass field) for every field, groups included, depth first."""
    for f in fields(cls):
        name = f"{prefix}{f.name}"
        yield name, f
        sub = f.default_factory
        if sub is not NO_FACTORY and is_dataclass(sub):
            yield from iter_fields(sub, name + ".")


def all_keys() -> list[str]:
    """Every valid dotted key, groups included (for override checks and did-you-mean)."""
    return [name for name, _ in iter_fields()]
