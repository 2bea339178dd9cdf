"""Building a rank: where it runs, the FSDP2 models it trains or scores with, and its rollout engine.

Three functions a worker class composes: `init_rank` (threads, device, process group, seed, compute dtype),
`build_models` (the roles of config/models.py this run uses, sharded over the rank's mesh, with their
optimizers: a `Models` record) and `build_rollout` (the engine, its own full copy of the policy). The
colocated worker calls all three; a trainer-only worker would skip the engine, a rollout-only one the
models. Models are loaded in the table's order (actor, reference, critic, reward model) on every rank:
the order of the collectives that build them, and of the random draws that initialise a new head.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from omegaconf import DictConfig

from logicrl.algos import RolloutCorrection
from logicrl.config.models import MODELS, in_use, model
from logicrl.config.plan import StepPlan
from logicrl.config.sequence_parallel import phase_sp_size
from logicrl.models.attention import packed_attention
from logicrl.models.loading import (
    LoraSpec,
    QuantSpec,
    load_causal_lm,
    load_tokenizer,
    load_value_model,
    master_dtype,
    resolve_dtype,
)
from logicrl.models.reward_model import load_reward_model
from logicrl.models.rm_inputs import same_tokenizer
from logicrl.models.spec import load_model_spec
from logicrl.models.ulysses import sequence_parallel_group, use_ulysses
from logicrl.workers.actor import Actor
from logicrl.workers.critic import Critic
from logicrl.workers.devices import pick_device
from logicrl.workers.fsdp import build_optimizer, init_distributed
from logicrl.workers.oom import MicroSize
from logicrl.workers.rollout.engines import build_engine
from logicrl.workers.rollout.multi_turn import with_tools
from logicrl.workers.sharded_load import load_sharded_model
from logicrl.workers.update import Trained


@dataclass(frozen=True)
class Rank:
    """Where one rank runs: its place in the world, its device and mesh, and the compute dtype."""

    rank: int
    world_size: int
    device: torch.device
    mesh: object  # the FSDP2 DeviceMesh over every rank
    dtype: torch.dtype  # the engine's and the reference's; the trained models' masters may be wider


def init_rank(cfg: DictConfig, rank: int, world_size: int, master_addr: str, master_port: int,
              threads: int | None = None) -> Rank:
    if threads:
        torch.set_num_threads(threads)
    device = pick_device(cfg.trainer.device, rank)
    mesh = init_distributed(rank, world_size, master_addr, master_port, device, cfg.trainer.collective_timeout_s)
    torch.manual_seed(cfg.trainer.seed)
    return Rank(rank, world_size, device, mesh, resolve_dtype(cfg.actor_rollout_ref.model.dtype, device))


@dataclass
class RewardScorer:
    """The learned reward model, frozen; and the two tokenizers when its own differs from the one that
    wrote the actor's tokens (the rows are then re-rendered, models/rm_inputs.py)."""

    module: torch.nn.Module
    remove_padding: bool
    max_length: int
    tokenizers: tuple | None  # (the actor's, its own), or None: it scores the actor's tokens as they are


@dataclass
class Models:
    """What `build_models` built: the roles of config/models.py this run uses, None where it does not."""

    tokenizer: object  # the actor's
    actor: Actor
    ref: torch.nn.Module | None  # None without a KL term, and with LoRA (the actor with its adapter off)
    critic: Critic | None
    reward: RewardScorer | None
    sp: dict[str, object]  # each role's Ulysses group (models/ulysses.py); None where its size is 1
    lora: bool
    quantized_base: bool  # a 4-bit base quantized on the device (QLoRA): the engine loaded the original

    def module(self, name: str) -> torch.nn.Module | None:
        """The FSDP2 module of role `name` (config/models.py); None for the engine, which holds its own
        full copy and runs no collectives with the other ranks."""
        if name == "engine":
            return None
        model(name)  # an unknown role is refused by the table, naming the roles
        if name == "ref" and self.ref is None:
            return self.actor.model  # with LoRA the reference is the actor with its adapter off
        return {"actor": self.actor.model, "ref": self.ref, "critic": self.critic and self.critic.model,
                "reward_model": self.reward and self.reward.module}[name]


def micro_sizes(cfg: DictConfig, plan: StepPlan) -> dict[str, MicroSize]:
    """Each phase's micro-batch as it stands: the plan's, halved by an OOM for the rest of the run.

    Ulysses sequence parallelism (models/ulysses.py): in a phase of a model with SP size S, groups of S
    consecutive ranks hold the same rows (the controller sends each group one shard, trainer/ppo.py), each
    rank running 1/S of every packed row. A token budget then packs S times the tokens of one rank's share
    (verl scales it the same way; MicroSize.group)."""
    return {p.name: MicroSize(p.name, p.micro.key, p.micro.value, by_tokens=p.micro.by_tokens,
                              group=phase_sp_size(cfg, p.name))
            for p in plan.phases if p.micro is not None}


def sp_groups(cfg: DictConfig) -> dict[str, object]:
    """Each role's sequence-parallel group (None at size 1); a role the run does not load counts as 1.
    Every rank creates every group size's groups, in one order."""
    used = in_use(cfg)
    sizes = {m.name: m.get(cfg, "sp_key") if used[m.name] else 1 for m in MODELS}
    groups = {s: sequence_parallel_group(s) for s in sorted(set(sizes.values()))}
    return {name: groups[s] for name, s in sizes.items()}


def build_models(cfg: DictConfig, plan: StepPlan, rank: Rank) -> Models:
    arr = cfg.actor_rollout_ref
    tokenizer = load_tokenizer(arr.model.path, quiet=True)
    used, sp = in_use(cfg), sp_groups(cfg)
    device, dtype, mesh = rank.device, rank.dtype, rank.mesh
    lora = arr.model.lora_rank > 0
    # The actor and critic keep fp32 master weights and AdamW states when dtype (the compute dtype: the
    # engine's and the reference's) is narrower; FSDP2 computes in dtype. With LoRA only the adapters
    # train: the frozen base is stored in dtype (fp32 would double its memory for nothing to update) and
    # the adapters are the fp32 masters (peft's autocast, models/loading.py); the same policy gathers them
    # in dtype, so they compute in bf16 inside a bf16 model, as the base does, while AdamW still updates
    # fp32 (at Logic-RL's lr a bf16 weight rounds almost every update away).
    master = master_dtype(dtype)
    mixed = dtype if master != dtype else None

    def sharded(name: str, build, **kwargs) -> torch.nn.Module:
        """Role `name` loaded on meta and sharded, its attention run over its SP group where it has one."""
        module = load_sharded_model(build, mesh, device, model(name).get(cfg, "offload_key"), **kwargs)
        if sp[name] is not None:
            use_ulysses(module)
        return module

    role = model("actor")
    path, ckpt, packed = role.get(cfg, "path_key"), role.get(cfg, "ckpt_key"), role.get(cfg, "packing_key")
    attn = packed_attention(packed, device, dtype)
    spec = LoraSpec(arr.model.lora_rank, arr.model.lora_alpha, arr.model.target_modules) if lora else None
    # A 4-bit base (QLoRA, models/quantize.py): quantized on the rank's device by every rank, kept whole.
    quant = QuantSpec(arr.model.quantization, arr.model.quantization_block_size,
                      arr.model.quantization_scaler_block_size, device) if arr.model.quantization else None
    # A GPTQ checkpoint (models/gptq.py): every rank reads its int4 buffers, which FSDP2 leaves whole.
    gptq_base = load_model_spec(path).quant_method == "gptq"
    actor_dtype = dtype if lora else master
    actor_model = sharded("actor", lambda meta: load_causal_lm(path, actor_dtype, ckpt, spec, on_meta=meta,
                                                              attn_implementation=attn, quant=quant),
                          compute_dtype=mixed, every_rank_loads=quant is not None or gptq_base)
    actor = Actor(trained("actor", actor_model, arr.actor, arr.actor.loss_agg_mode, plan.actor, sp["actor"], plan,
                          rank), arr.actor, arr.rollout.temperature, packed,
                  RolloutCorrection.from_config(cfg.algorithm.rollout_correction), sp["actor"])

    ref = None
    if used["ref"] and not lora:  # with LoRA the reference is the actor with its adapter off: no second copy
        ref = sharded("ref", lambda meta: load_causal_lm(path, dtype, on_meta=meta, attn_implementation=attn))
        ref.requires_grad_(False)

    critic = None
    if used["critic"]:
        c, role = cfg.critic, model("critic")
        critic_path, critic_ckpt = role.get(cfg, "path_key"), role.get(cfg, "ckpt_key")
        critic_packed = role.get(cfg, "packing_key")
        critic_attn = packed_attention(critic_packed, device, dtype)
        critic_model = sharded("critic", lambda meta: load_value_model(critic_path, master, critic_ckpt, on_meta=meta,
                                                                       attn_implementation=critic_attn),
                               compute_dtype=mixed)
        # The critic's loss is aggregated like the actor's (verl shares the key).
        critic = Critic(trained("critic", critic_model, c, arr.actor.loss_agg_mode, plan.critic, sp["critic"], plan,
                                rank), c.cliprange_value, critic_packed, sp["critic"])

    reward = build_reward_model(cfg, tokenizer, sharded, dtype, device) if used["reward_model"] else None
    return Models(tokenizer=tokenizer, actor=actor, ref=ref, critic=critic, reward=reward, sp=sp, lora=lora,
                  quantized_base=quant is not None)


def build_reward_model(cfg: DictConfig, actor_tokenizer, sharded, dtype: torch.dtype,
                       device: torch.device) -> RewardScorer:
    """The learned reward model: frozen, sharded on meta and offloaded like the reference, in the compute
    dtype; and the two tokenizers when its own differs from the one that wrote the actor's tokens."""
    rm, role = cfg.reward_model, model("reward_model")
    path, packed = role.get(cfg, "path_key"), role.get(cfg, "packing_key")
    attn = packed_attention(packed, device, dtype)
    module = sharded("reward_model", lambda meta: load_reward_model(path, dtype, rm.model.trust_remote_code,
                                                                    on_meta=meta, attn_implementation=attn))
    module.requires_grad_(False)
    tokenizers = None
    source = rm.model.input_tokenizer
    if source:  # null: score the actor's tokens as they are (verl's switch)
        actor = actor_tokenizer if source == cfg.actor_rollout_ref.model.path else load_tokenizer(source, quiet=True)
        own = load_tokenizer(path, quiet=True)
        if not same_tokenizer(actor, own):
            tokenizers = (actor, own)
    data = cfg.data
    return RewardScorer(module, packed, rm.max_length or data.max_prompt_length + data.max_response_length,
                        tokenizers)


def trained(name: str, module: torch.nn.Module, role_cfg: DictConfig, loss_agg_mode: str, update, sp,
            plan: StepPlan, rank: Rank) -> Trained:
    """A trained role's module with its optimizer and lr schedule, and how it updates on this rank."""
    if sp is not None:  # the rank holds its SP group's rows: S ranks' share of a mini-batch
        update = replace(update, per_rank_mini=update.per_rank_mini * sp.size)
    o = role_cfg.optim
    optimizer, scheduler = build_optimizer(module, o.lr, o.weight_decay, plan.total_steps, o.lr_warmup_steps_ratio,
                                           o.lr_scheduler_type, o.lr_warmup_steps)
    return Trained(name=name, model=module, optimizer=optimizer, scheduler=scheduler, plan=update,
                   loss_agg_mode=loss_agg_mode, grad_clip=role_cfg.grad_clip, world_size=rank.world_size,
                   device=rank.device, optimizer_offload=role_cfg.fsdp_config.optimizer_offload,
                   sharded_grads=update.sharded_grads)


def build_rollout(cfg: DictConfig, plan: StepPlan, tokenizer, rank: Rank):
    """The rollout engine. It holds its own full copy of the policy: generation lengths differ per rank, and
    a sharded model would need every rank in lock-step for each decode step."""
    engine = build_engine(cfg, tokenizer, rank.dtype, rank.device, plan.micro("generate").value)
    # With tools the engine generates turn by turn around the one built above (workers/rollout/multi_turn.py).
    return with_tools(cfg, engine, tokenizer) if cfg.actor_rollout_ref.rollout.multi_turn.enable else engine
