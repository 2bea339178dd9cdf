"""Compose-time validation: schema types, per-key constraints, migration, cross-field checks, the plan.

Everything here runs before Ray, torch or any model is touched, and fails with one ConfigError
line naming the key and the fix. Order matters: types first (so later checks can trust them),
then the rank count (migration converts global micro-batches with it), then normalisation (the
one step that changes values, config/normalize.py), then the checks, which only check, and last
the step plan (config/plan.py) that everything after validation reads.
"""

from __future__ import annotations

import difflib
import math
import operator
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, MissingMandatoryValue, OmegaConfBaseException

from logicrl.config.async_training import check_separate_groups, rollout_ranks
from logicrl.config.engines import ENGINES, engines_with
from logicrl.config.errors import ConfigError, log
from logicrl.config.eval_keys import check_eval
from logicrl.config.loss_module import take_loss_params, with_loss_params
from logicrl.config.migrate import migrate
from logicrl.config.models import model
from logicrl.config.multi_turn import check_multi_turn
from logicrl.config.normalize import normalize, rank_count
from logicrl.config.plan import ARR, StepPlan, build_plan
from logicrl.config.quantization import check_quantization
from logicrl.config.sanity import check_clip_cov, check_output_names
from logicrl.config.schema import LOGGERS, RootConfig, all_keys, iter_fields
from logicrl.config.sequence_parallel import check_sequence_parallel
from logicrl.config.verl_keys import take_verl_keys
from logicrl.data.files import DATA_SUFFIXES, data_sources, dataset_rows
from logicrl.models.lora_targets import ATTENTION, MLP
from logicrl.models.reward_head import reward_head
from logicrl.models.spec import ModelSpec, ModelSpecError, load_model_spec
from logicrl.models.tiny import EMBEDDED_CONFIGS, EMBEDDED_TINY, EMBEDDED_TINY_RM
from logicrl.reward.combine import CombineError, CombineRule
from logicrl.reward.custom import CustomRewardError, load_custom_reward

NEEDS_GROUPS = ("grpo", "rloo", "reinforce_plus_plus_baseline")
BOUNDS = {"ge": (operator.ge, ">="), "gt": (operator.gt, ">"), "le": (operator.le, "<=")}


def suggest(key: str) -> str:
    """' (did you mean `x`?)' for the closest valid key, or ''."""
    keys = all_keys()
    leaf = key.rsplit(".", 1)[-1]
    # A right leaf under the wrong parent is the usual slip (actor.* vs rollout.*): prefer it.
    same_leaf = [k for k in keys if k.rsplit(".", 1)[-1] == leaf]
    close = same_leaf or difflib.get_close_matches(key, keys, n=1, cutoff=0.6)
    return f" (did you mean `{close[0]}`?)" if close else ""


def unknown_key(key: str) -> ConfigError:
    return ConfigError(f"unknown config key `{key}`{suggest(key)}")


def typed_config(cfg: DictConfig) -> DictConfig:
    """Merge a composed config into the schema and resolve interpolations."""
    try:
        typed = OmegaConf.merge(OmegaConf.structured(RootConfig), cfg)
        OmegaConf.resolve(typed)
    except ConfigKeyError as e:
        raise unknown_key(e.full_key) from None
    except MissingMandatoryValue as e:
        raise ConfigError(f"{e.full_key}: no value given (set it in conf/ or as {e.full_key}=...)") from None
    except OmegaConfBaseException as e:
        raise ConfigError(f"{e.full_key or failing_key(cfg)}: {str(e).splitlines()[0]}") from None
    missing = sorted(OmegaConf.missing_keys(typed))
    if missing:
        raise ConfigError(f"{missing[0]}: no value given (set it in conf/ or as {missing[0]}=...)")
    return typed


def failing_key(cfg: DictConfig) -> str:
    """The first key whose value does not resolve (an interpolation to nothing, `key=${oops}`): OmegaConf's
    error names it only sometimes."""
    def walk(node, prefix: str):
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for k, v in items:
            path = f"{prefix}{k}"
            if isinstance(v, (dict, list)):
                yield from walk(v, f"{path}.")
            else:
                yield path

    for path in walk(OmegaConf.to_container(cfg, resolve=False), ""):
        try:
            OmegaConf.select(cfg, path, throw_on_resolution_failure=True)
        except OmegaConfBaseException:
            return path
    return "the config"


def check_fields(cfg: DictConfig) -> None:
    """The per-key constraints declared in the schema's field metadata."""
    for name, f in iter_fields():
        if not f.metadata:
            continue
        value = OmegaConf.select(cfg, name)
        if value is None:
            continue
        meta = f.metadata
        if "choices" in meta and value not in meta["choices"]:
            raise ConfigError(f"{name}={value} is not one of: {', '.join(meta['choices'])}")
        finite = "a finite number " if meta.get("finite") else ""
        if finite and not math.isfinite(value):
            bound = next((f" {word} {meta[op]}" for op, (_, word) in BOUNDS.items() if op in meta), "")
            raise ConfigError(f"{name}={value} must be {finite}{bound.lstrip()}".rstrip())
        for op, (holds, word) in BOUNDS.items():
            if op in meta and not holds(value, meta[op]):
                raise ConfigError(f"{name}={value} must be {finite}{word} {meta[op]}")


def check_files(key: str, value) -> None:
    paths = [value] if isinstance(value, str) else list(value) if isinstance(value, (list, ListConfig)) else None
    if not paths or not all(isinstance(p, str) for p in paths):
        raise ConfigError(f"{key} must be a path or a list of paths to .parquet/.jsonl files, got {value!r}")
    for p in map(Path, paths):
        if p.suffix not in DATA_SUFFIXES:
            raise ConfigError(f"{key}: {p} is not a .parquet or .jsonl file")
        if not p.is_file():
            raise ConfigError(f"{key}: {p} does not exist (build the K&K sets with `make data`, "
                              f"or point {key} at an existing .parquet/.jsonl file)")


def check_model(key: str, path: str) -> ModelSpec:
    if path not in EMBEDDED_CONFIGS:
        if not Path(path).is_dir():
            # The embedded model that fits the key: a policy cannot score (models/reward_head.py).
            embedded = EMBEDDED_TINY_RM if key.startswith("reward_model.") else EMBEDDED_TINY
            raise ConfigError(f"{key}={path} is not a local directory; logicrl never downloads models: point it "
                              f"at a local HF checkpoint (config.json + weights) or use {embedded}")
        if not (Path(path) / "config.json").is_file():
            raise ConfigError(f"{key}={path} has no config.json: point it at an HF-format checkpoint directory")
    try:
        return load_model_spec(path)
    except ModelSpecError as e:
        raise ConfigError(f"{key}: {e}") from None


def check_cross_fields(cfg: DictConfig, defer: Callable[[str], None] | None = None) -> ModelSpec:
    """Raises ConfigError; a dry run hands what only stops a launch to `defer` (config/quantization.py)."""
    arr, algo, data, trainer = cfg[ARR], cfg.algorithm, cfg.data, cfg.trainer

    check_files("data.train_files", data.train_files)
    check_files("data.val_files", data.val_files)

    spec = check_model(f"{ARR}.model.path", arr.model.path)
    total = data.max_prompt_length + data.max_response_length
    if spec.max_position_embeddings and total > spec.max_position_embeddings:
        raise ConfigError(
            f"data.max_prompt_length={data.max_prompt_length} + data.max_response_length={data.max_response_length}"
            f" = {total} tokens exceed the model's max_position_embeddings={spec.max_position_embeddings}"
            f" ({ARR}.model.path={arr.model.path}): lower them")
    critic_spec = check_model("critic.model.path", cfg.critic.model.path) if model("critic").in_use(cfg) else None
    check_quantization(cfg, spec, critic_spec, defer)

    if algo.adv_estimator in NEEDS_GROUPS and arr.rollout.n < 2:
        raise ConfigError(f"algorithm.adv_estimator={algo.adv_estimator} compares responses to the same prompt: "
                          f"set {ARR}.rollout.n >= 2 (got {arr.rollout.n})")
    if arr.model.lora_rank > 0 and not arr.model.target_modules:
        raise ConfigError(f"{ARR}.model.target_modules is empty but lora_rank={arr.model.lora_rank}: "
                          "name the modules (e.g. [q_proj,v_proj]) or use all-linear")

    # Separate groups: the engine's TP groups are cut from the rollout group's ranks, not the trainer's.
    generating = rollout_ranks(cfg)
    check_rollout_tp(arr.rollout, generating or trainer.n_gpus, spec,
                     "rollout.nnodes x rollout.n_gpus_per_node" if generating else "trainer.n_gpus")
    check_lora_sync(arr)
    check_engine_logprobs(cfg)
    check_multi_turn(cfg)
    check_reward_model(cfg)
    check_sequence_parallel(cfg, lambda path_key: spec if path_key == f"{ARR}.model.path" else
                            check_model(path_key, OmegaConf.select(cfg, path_key)))
    check_rollout_correction(algo.rollout_correction, arr.actor.policy_loss.loss_mode)

    overlong = cfg.reward.overlong_buffer
    if overlong.enable and overlong.len > data.max_response_length:
        raise ConfigError(f"reward.overlong_buffer.len={overlong.len} exceeds data.max_response_length="
                          f"{data.max_response_length}: the ramp must fit inside the response")
    check_filter_groups(cfg)
    check_eval(cfg)
    check_clip_cov(cfg)
    check_output_names(trainer)
    actor = arr.actor
    # CISPO clips a detached weight: a floor 1 - clip_ratio_low <= 0 is verl's way of saying "no lower clip"
    # (its CISPO script sets 10). The PPO-style losses need a positive floor.
    if actor.clip_ratio_low >= 1 and actor.policy_loss.loss_mode != "cispo":
        raise ConfigError(f"{ARR}.actor.clip_ratio_low={actor.clip_ratio_low} must be below 1 (the ratio floor is "
                          "1 - clip_ratio_low; only policy_loss.loss_mode=cispo reads >= 1 as no lower clip)")

    for freq in ("save_freq", "test_freq"):
        if trainer[freq] == 0:
            raise ConfigError(f"trainer.{freq}=0: use -1 to turn it off, or a positive step count")
    if trainer.resume_mode not in ("auto", "disable") and not Path(trainer.resume_mode).is_dir():
        raise ConfigError(f"trainer.resume_mode={trainer.resume_mode} is neither auto, disable nor an existing "
                          "checkpoint directory")

    if trainer.expected_response_length is not None and trainer.expected_response_length > data.max_response_length:
        raise ConfigError(f"trainer.expected_response_length={trainer.expected_response_length} exceeds "
                          f"data.max_response_length={data.max_response_length}: responses are cut there; lower it")
    if trainer.expected_response_length is not None and trainer.memory_plan != "expected":
        raise ConfigError(f"trainer.expected_response_length={trainer.expected_response_length} is only read with "
                          "trainer.memory_plan=expected: set that too, or drop the length")

    for name in trainer.logger:
        if name not in LOGGERS:
            raise ConfigError(f"trainer.logger: {name!r} is not one of: {', '.join(LOGGERS)}")

    if cfg.reward.custom.path is not None:
        # Imported now, not at the first reward, so a wrong path or name stops the run here.
        try:
            load_custom_reward(cfg.reward.custom.path, cfg.reward.custom.name)
        except CustomRewardError as e:
            raise ConfigError(str(e)) from None
    if arr.actor.strategy == "fsdp":
        log.info(f"{ARR}.actor.strategy=fsdp runs FSDP2 (fully_shard); FSDP1 is not implemented")
    return spec


def check_rollout_correction(corr: DictConfig, loss_mode: str) -> None:
    """algorithm.rollout_correction: rejection options and bounds that parse, a loss_type that applies."""
    key = "algorithm.rollout_correction"
    if corr.rollout_rs is not None:
        # Imported only here: logicrl.algos is torch's tensor math, and importing torch (over a second of
        # CPU) would be most of what a refused or dry run spends before its one line.
        from logicrl.algos.rollout_correction import parse_rejection

        try:
            parse_rejection(corr.rollout_rs, corr.rollout_rs_threshold)
        except ValueError as e:
            raise ConfigError(f"{key}.{e}") from None
    if corr.rollout_rs is None and corr.rollout_rs_threshold is not None:
        log.warning(f"{key}.rollout_rs_threshold={corr.rollout_rs_threshold} is not read: rollout_rs is null")
    if corr.loss_type == "reinforce" and not corr.bypass_mode:
        raise ConfigError(f"{key}.loss_type=reinforce applies in bypass mode only (verl's rule): set "
                          f"{key}.bypass_mode=true, or loss_type=ppo_clip")
    if corr.loss_type == "reinforce" and loss_mode != "gpg":
        # The actor replaces the configured loss (workers/actor.py, loss_mode): say so once, here.
        log.info(f"{key}.loss_type=reinforce trains -w A log pi (loss_mode gpg with the IS weights) in place of "
                 f"{ARR}.actor.policy_loss.loss_mode={loss_mode}")


def check_filter_groups(cfg: DictConfig) -> None:
    """DAPO's dynamic sampling keys and data.gen_batch_size (config/plan.py counts the rounds)."""
    fg, data = cfg.algorithm.filter_groups, cfg.data
    if not fg.enable:
        if data.gen_batch_size is not None and data.gen_batch_size != data.train_batch_size:
            raise ConfigError(f"data.gen_batch_size={data.gen_batch_size} is read only with dynamic sampling: set "
                              "algorithm.filter_groups.enable=true, or drop it (each step generates "
                              f"data.train_batch_size={data.train_batch_size} prompts)")
        return
    if cfg[ARR].rollout.n < 2:
        raise ConfigError(f"algorithm.filter_groups.enable=true needs {ARR}.rollout.n >= 2 (got {cfg[ARR].rollout.n}): "
                          "a group of one response has no spread to test, and verl keeps every such group")
    if fg.metric == "seq_final_reward" and cfg.algorithm.use_kl_in_reward:
        raise ConfigError("algorithm.filter_groups.metric=seq_final_reward with algorithm.use_kl_in_reward=true: "
                          "logicrl applies the KL penalty after filtering; use metric=seq_reward")


def check_reward_model(cfg: DictConfig) -> None:
    """The reward_model group and reward.combine: a checkpoint that can score, lengths that fit, a usable rule."""
    rm, combine, data = cfg.reward_model, cfg.reward.combine, cfg.data
    raw = combine.by_data_source
    by_source = (OmegaConf.to_container(raw) if OmegaConf.is_config(raw) else raw) or {}
    try:
        rule = CombineRule.from_config(combine.mode, OmegaConf.to_container(combine.weights), by_source)
    except CombineError as e:
        raise ConfigError(str(e)) from None
    if not rm.enable:
        if rm.model.path is not None:
            # A warning, not an error: verl's scripts keep the path and toggle enable, and this run is
            # valid; but a user who set only the path expects the model to score and it will not.
            log.warning(f"reward_model.model.path={rm.model.path} is set but reward_model.enable=false: the reward "
                        "model is not loaded and rules alone score; set reward_model.enable=true to use it")
        if combine.mode != "model" or by_source:
            what = f"reward.combine.mode={combine.mode}" if combine.mode != "model" else "reward.combine.by_data_source"
            raise ConfigError(f"{what} mixes in a reward model's score, but reward_model.enable=false: set "
                              "reward_model.enable=true and reward_model.model.path, or drop it (rules alone score)")
        return
    if rm.model.path is None:
        raise ConfigError("reward_model.enable=true needs reward_model.model.path: point it at a local reward-model "
                          f"checkpoint (a *ForSequenceClassification with one label), or {EMBEDDED_TINY_RM} for the "
                          "embedded tiny one")
    if negative := rule.negative_weights():
        # Said, not refused: a negative model weight is how a cost model (lower is better) is used.
        log.warning(f"{', '.join(negative)} < 0: a higher score then lowers the reward, so the policy is trained "
                    "away from what it rewards; make the weight positive unless that is meant")
    key = "reward_model.model.path"
    spec = check_model(key, rm.model.path)
    try:
        reward_head(rm.model.path)
    except ModelSpecError as e:
        raise ConfigError(f"{key}={rm.model.path}: {e}") from None
    if rm.model.trust_remote_code:
        log.warning(f"reward_model.model.trust_remote_code=true: transformers will run the Python code shipped in "
                    f"{rm.model.path} (its auto_map) to build the reward model")
    tokenizer = rm.model.input_tokenizer
    if tokenizer is not None and tokenizer != EMBEDDED_TINY and not Path(tokenizer).is_dir():
        raise ConfigError(f"reward_model.model.input_tokenizer={tokenizer} is not a local directory: point it at the "
                          f"actor's checkpoint (its default, {ARR}.model.path), or null to score the actor's tokens "
                          "as they are")
    total = data.max_prompt_length + data.max_response_length
    if rm.max_length is not None and rm.max_length < total:
        raise ConfigError(f"reward_model.max_length={rm.max_length} is shorter than data.max_prompt_length="
                          f"{data.max_prompt_length} + data.max_response_length={data.max_response_length} = {total}: "
                          f"the reward model would not read whole responses; set it >= {total} or null")
    length = rm.max_length or total
    if spec.max_position_embeddings and length > spec.max_position_embeddings:
        what = (f"reward_model.max_length={length}" if rm.max_length else
                f"data.max_prompt_length + data.max_response_length = {total} (reward_model.max_length=null)")
        raise ConfigError(f"{what} exceeds the reward model's max_position_embeddings={spec.max_position_embeddings} "
                          f"({key}): lower the lengths, or use a reward model with a longer context")
    if by_source:
        present = data_sources(data.train_files) | data_sources(data.val_files)
        for source in by_source:
            if source not in present:
                close = difflib.get_close_matches(str(source), sorted(present), n=1)
                hint = f"did you mean {close[0]}?" if close else f"they hold: {', '.join(sorted(present))}"
                raise ConfigError(f"reward.combine.by_data_source.{source}: no row of data.train_files or "
                                  f"data.val_files has data_source={source} ({hint})")


def check_lora_sync(arr: DictConfig) -> None:
    """rollout.lora_sync=adapters: an engine that takes adapters alone, adapters it covers (its largest rank;
    on vLLM the decoder's Linear layers, the ones tested); otherwise the merged sync, which any target allows."""
    model, key = arr.model, f"{ARR}.rollout.lora_sync"
    if model.lora_rank == 0 or arr.rollout.lora_sync != "adapters":
        return
    name = arr.rollout.name
    row = ENGINES[name]
    if not row.adapter_sync:
        raise ConfigError(f"{key}=adapters but the {name} engine ({ARR}.rollout.name) cannot take adapters alone: "
                          f"set {key}=merged, or use {' or '.join(engines_with('adapter_sync'))}")
    if row.max_lora_rank is not None and model.lora_rank > row.max_lora_rank:
        raise ConfigError(f"{ARR}.model.lora_rank={model.lora_rank} is above {row.label}'s largest max_lora_rank "
                          f"{row.max_lora_rank}: set {key}=merged or lower the rank")
    targets = model.target_modules
    if not row.adapters_on_linears_only or isinstance(targets, str):
        return  # all-linear, or a regular expression over the full names: decoder Linears as the preflight finds
    # The embedding and the output layer, the modules peft adapts beside the Linears; a name that matches
    # nothing is the preflight's to refuse (preflight/lora.py: with a "did you mean").
    linears = ATTENTION + MLP
    other = [t for t in targets if t.rsplit(".", 1)[-1] in ("embed_tokens", "lm_head")]
    if other:
        raise ConfigError(f"{ARR}.model.target_modules has {', '.join(map(str, other))}: the adapter sync into "
                          f"{row.label} covers the decoder's Linear layers ({', '.join(linears)}) only; set "
                          f"{key}=merged for the others")


def check_rollout_tp(rollout: DictConfig, n_gpus: int, spec: ModelSpec, ranks_key: str) -> None:
    """Rollout tensor parallelism (workers/rollout/vllm_tp.py): TP groups of consecutive ranks (the generating
    ones, `ranks_key`: every rank colocated, the rollout group's on separate groups), on an engine whose row has
    it."""
    tp, key = rollout.tensor_model_parallel_size, f"{ARR}.rollout.tensor_model_parallel_size"
    if tp == 1:
        return
    if not ENGINES[rollout.name].tensor_parallel:
        able = engines_with("tensor_parallel")
        raise ConfigError(f"{key}={tp} needs {ARR}.rollout.name={' or '.join(able)} (the {rollout.name} engine holds "
                          f"the whole model on each rank): set rollout.name={able[0]} or {key}=1")
    if n_gpus % tp:
        raise ConfigError(f"{key}={tp} must divide {ranks_key}={n_gpus} (each TP group is {tp} ranks): "
                          f"set {ranks_key} to a multiple of {tp}")
    if spec.num_heads % tp:
        raise ConfigError(f"{key}={tp} must divide the model's num_attention_heads={spec.num_heads} "
                          f"({ARR}.model.path): pick a divisor of it")


def check_engine_logprobs(cfg: DictConfig) -> None:
    """Rollout correction reads the engine's own log-probs: an engine that returns none cannot serve it."""
    name, corr = cfg[ARR].rollout.name, cfg.algorithm.rollout_correction
    if ENGINES[name].returns_logprobs:
        return
    used = [f"{k}={v}" for k, v in (("rollout_is", corr.rollout_is), ("rollout_rs", corr.rollout_rs),
                                    ("bypass_mode", corr.bypass_mode)) if v]
    if used:
        raise ConfigError(f"algorithm.rollout_correction.{used[0]} needs the engine's log-probs, and the {name} engine "
                          f"({ARR}.rollout.name) returns none: turn it off, or use "
                          f"{' or '.join(engines_with('returns_logprobs'))}")


def validate(cfg: DictConfig) -> tuple[DictConfig, ModelSpec, StepPlan]:
    """Type, migrate, normalise and check a composed config; returns it typed and resolved, with its
    model and its step plan (over the rows in the training files; the trainer re-plans over the
    rows it keeps after truncation=filter / skip_bad_rows)."""
    # verl's keys first (its policy_loss.tau_* are renamed out of the loss group), then a user's loss module:
    # its losses are loss_mode choices, its keys not the schema's.
    cfg, loss_params = take_loss_params(take_verl_keys(cfg))
    typed = typed_config(cfg)
    check_fields(typed)
    migrate(typed, rank_count(typed))
    check_fields(typed)  # migrated values obey the same bounds
    normalize(typed)
    launch_refusals: list[str] = []  # a dry run's, said after its plan (main_ppo.py)
    check_separate_groups(typed)  # hybrid_engine=false: the two groups' keys (config/async_training.py)
    spec = check_cross_fields(typed, launch_refusals.append)
    typed = with_loss_params(typed, loss_params)
    plan = replace(build_plan(typed, dataset_rows(typed.data.train_files)), launch_refusals=tuple(launch_refusals))
    if plan.max_steps and plan.total_steps < plan.max_steps:
        log.warning(f"trainer.total_training_steps={plan.max_steps}, but {plan.train_rows} prompts make "
                    f"{plan.steps_per_epoch} steps per epoch x trainer.total_epochs={plan.total_epochs}: the run "
                    f"stops after {plan.total_steps} (raise trainer.total_epochs to train longer)")
    return typed, spec, plan
