"""Seconds per phase of one step on one rank, from the step plan, the models' shapes and the device's rates.

A pass over T tokens in sequences of L costs 2 N T matmul FLOPs (N: the Linear weights, lm_head included;
trainer/step_perf.py's count) plus 2 * layers * heads * head_dim * L^2 per sequence of causal attention,
and a fixed number of kernels per layer. Updates cost three forwards (one more with gradient checkpointing)
and an optimizer step over the trained weights. Generation is a prefill of the prompts, then one step per
response token over the whole batch: on CUDA each decoding step reads every weight and the KV cache once,
so it is memory-bound (bandwidth at DECODE_BW_EFFICIENCY) unless its FLOPs take longer; prefill, forwards
and updates are FLOP-bound at MFU of the bf16 peak. On CPU the rates are this machine's, calibrated
(timeplan/calibrate.py), and a small model's time is mostly its kernels' latency (OPS_PER_LAYER).
Lengths are the caller's (timeplan/report.py): full-length responses unless trainer.expected_response_length
or a resumed run says otherwise. Dynamic sampling is planned at one generation round a step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from omegaconf import DictConfig

from logicrl.config.models import model
from logicrl.config.phases import BY_NAME
from logicrl.config.plan import ARR, StepPlan
from logicrl.memory.footprint import kv_bytes_per_token, linear_shapes, lora_targets
from logicrl.models.spec import ModelSpec, load_model_spec
from logicrl.timeplan.calibrate import CpuRates, matmul_rate
from logicrl.timeplan.devices import Device

MFU = 0.40  # CUDA: forwards, prefill and updates at 40% of the bf16 peak (well-tuned FSDP runs reach 35-55%)
DECODE_BW_EFFICIENCY = 0.60  # CUDA decoding: share of the data sheet's bandwidth a decode step streams at
CUDA_OP_S = 10e-6  # CUDA: a kernel's launch and sync, when the GPU waits on Python
# Kernels per decoder layer's forward (2 norms, q/k/v/o and 3 MLP projections, rotary, attention, activation,
# residuals, casts) and around the layers (embedding, final norm, lm_head, log-softmax chunks), and the cost
# of one through a module call (hooks, autograd bookkeeping) in units of a bare small op's latency.
OPS_PER_LAYER, OPS_ROOT, MODULE_OP_COST = 30, 10, 8.0
BACKWARD_OPS = 2.0  # backward kernels per forward kernel
# Fixed costs that no FLOP count sees, fitted to the CPU runs of benchmarks/time_plan.py (the embedded default
# and the four-model PPO recipe) and stated here rather than hidden: the controller's dispatch of a worker
# phase (Ray calls, shards in and out); a forward-only phase's own cost (FSDP2's reshard after it, the memory
# telemetry's count of live tensors on CPU); each micro-batch of an update (backward hooks, gradient
# accumulation); waking the engine for a generation (its weights and KV cache back); a decoding step's
# scheduling and sampling; the weight sync's start (vLLM's reload and prefix-cache reset); a rule reward.
DISPATCH_S = 0.006
FORWARD_PHASE_S = {"cpu": 0.09, "cuda": 0.02}
UPDATE_PASS_S = {"cpu": 0.012, "cuda": 0.003}
ENGINE_WAKE_S = {"vllm": 0.04, "hf": 0.0}
ENGINE_STEP_S = {"vllm": 0.004, "hf": 0.002}
SYNC_S = 0.008
REWARD_S = 15e-6  # per response
OPTIMIZER_BYTES = 28  # per trained fp32 weight: read weight, grad, two moments; write weight, two moments


@dataclass(frozen=True)
class Rates:
    """What a rank can do per second, from the device table (CUDA) or the calibration (CPU)."""

    cpu: CpuRates | None = None
    gpu: Device | None = None

    def matmul(self, width: int) -> float:
        return self.gpu.bf16_tflops * 1e12 * MFU if self.gpu else matmul_rate(self.cpu, width)

    @property
    def attention(self) -> float:
        return self.gpu.bf16_tflops * 1e12 * MFU if self.gpu else self.cpu.attention_flops

    @property
    def op_s(self) -> float:
        return CUDA_OP_S if self.gpu else self.cpu.op_s * MODULE_OP_COST

    @property
    def bandwidth(self) -> float:
        return self.gpu.bandwidth_gbs * 1e9 if self.gpu else self.cpu.bandwidth

    def fixed(self, table: dict[str, float]) -> float:
        return table["cuda" if self.gpu else "cpu"]

    def describe(self) -> str:
        if self.gpu:
            return (f"{self.gpu.name} table: {self.gpu.bf16_tflops:.0f} TFLOP/s bf16 at MFU {MFU:.0%}, "
                    f"{self.gpu.bandwidth_gbs:.0f} GB/s at {DECODE_BW_EFFICIENCY:.0%} for decoding")
        widths = sorted(self.cpu.matmul_flops)
        return (f"CPU calibrated with {self.cpu.threads} thread(s): matmul {self.cpu.matmul_flops[widths[0]] / 1e9:.0f}"
                f"-{max(self.cpu.matmul_flops.values()) / 1e9:.0f} GFLOP/s, "
                f"{self.cpu.op_s * 1e6:.1f} us per op")


@dataclass(frozen=True)
class Shape:
    """What the time model reads of one model."""

    width: int  # hidden size: the contraction width of most matmuls
    matmul_params: int  # N: the decoder's Linears, and the lm_head (or a value head)
    lora_params: int
    layers: int
    attn_width: int
    params: int  # all weights
    kv_per_token: int  # bytes (compute dtype)

    @classmethod
    def of(cls, spec: ModelSpec, head: bool = True, lora_rank: int = 0, target_modules=None,
           dtype_bytes: int = 2) -> Shape:
        shapes = linear_shapes(spec)
        per_layer = sum(o * i for o, i in shapes.values())
        adapted = lora_targets(target_modules, spec.num_layers) if lora_rank else ()
        lora = sum(lora_rank * sum(shapes[name]) for name in adapted) * spec.num_layers
        out = spec.vocab_size if head else 1
        return cls(spec.hidden_size, per_layer * spec.num_layers + out * spec.hidden_size, lora, spec.num_layers,
                   spec.num_heads * spec.head_dim, spec.num_params(), kv_bytes_per_token(spec, dtype_bytes))

    def flops(self, tokens: int, seqs: int, length: int) -> tuple[float, float]:
        """(matmul, attention) FLOPs of one forward over `seqs` sequences of `length` (`tokens` in all)."""
        return 2.0 * (self.matmul_params + self.lora_params) * tokens, 2.0 * self.layers * self.attn_width * seqs * \
            length * length

    @property
    def ops(self) -> int:
        return OPS_PER_LAYER * self.layers + OPS_ROOT


def forward_s(shape: Shape, rates: Rates, seqs: int, length: int, passes: int) -> float:
    mm, attn = shape.flops(seqs * length, seqs, length)
    return mm / rates.matmul(shape.width) + attn / rates.attention + passes * shape.ops * rates.op_s


def generate_s(shape: Shape, rates: Rates, responses: int, prompt: int, response: int, max_seqs: int,
               engine: str) -> float:
    """Prefill, then `response` decoding steps, in waves of at most max_num_seqs sequences."""
    total = ENGINE_WAKE_S.get(engine, 0.0)
    for wave in range(math.ceil(responses / max_seqs)):
        b = min(max_seqs, responses - wave * max_seqs)
        total += forward_s(shape, rates, b, prompt, 1)
        context = prompt + response / 2
        flops = 2.0 * (shape.matmul_params + shape.lora_params) * b + \
            4.0 * shape.layers * shape.attn_width * b * context
        fixed = shape.ops * rates.op_s + ENGINE_STEP_S.get(engine, 0.0)
        if rates.gpu:  # each step streams the weights and the batch's KV cache
            streamed = 2.0 * shape.params + b * context * shape.kv_per_token
            step = max(flops / rates.matmul(shape.width), streamed / (rates.bandwidth * DECODE_BW_EFFICIENCY))
        else:
            step = flops / rates.matmul(shape.width)
        total += response * (step + fixed)
    return total


def _passes(plan: StepPlan, name: str, rows: int, length: int) -> int:
    micro = plan.phase(name).micro
    return math.ceil(rows * length / micro.value) if micro.by_tokens else math.ceil(rows / micro.value)


def predict(cfg: DictConfig, spec: ModelSpec, plan: StepPlan, rates: Rates, prompt: int,
            response: int) -> dict[str, float]:
    """Seconds per phase of one step (each rank's share; ranks run in parallel), for the phases that run."""
    arr = cfg[ARR]
    length = prompt + response
    dtype_bytes = 2 if rates.gpu else 4
    lora = dict(lora_rank=arr.model.lora_rank, target_modules=arr.model.target_modules)
    shapes = {"actor": Shape.of(spec, dtype_bytes=dtype_bytes, **lora),
              "ref": Shape.of(spec, dtype_bytes=dtype_bytes, **lora)}
    for role, head in (("critic", False), ("reward_model", False)):
        if model(role).in_use(cfg):
            shapes[role] = Shape.of(load_model_spec(str(model(role).get(cfg, "path_key"))), head=head,
                                    dtype_bytes=dtype_bytes)
    rows = plan.per_rank_responses
    out = {"generate": DISPATCH_S + generate_s(shapes["actor"], rates, plan.gen_per_rank_responses, prompt, response,
                                               int(arr.rollout.max_num_seqs), str(arr.rollout.name)),
           "reward": REWARD_S * plan.responses, "advantages": 1e-3 + 1e-6 * plan.responses}
    for name in ("reward_model", "old_log_prob", "ref", "values"):
        if plan.runs(name):
            shape = shapes[BY_NAME[name].model if name != "old_log_prob" else "actor"]
            out[name] = DISPATCH_S + rates.fixed(FORWARD_PHASE_S) + forward_s(shape, rates, rows, length,
                                                                               _passes(plan, name, rows, length))
    ckpt = bool(arr.model.enable_gradient_checkpointing)
    for name, update in (("update_critic", plan.critic), ("update_actor", plan.actor)):
        if not plan.runs(name) or update is None:
            continue
        shape = shapes[BY_NAME[name].model]
        passes = update.num_mini * _passes(plan, name, update.per_rank_mini, length)
        mm, attn = shape.flops(rows * length, rows, length)
        if shape.lora_params:  # the frozen base gets activation gradients only (trainer/step_perf.py)
            mm = mm / (shape.matmul_params + shape.lora_params) * (2 * shape.matmul_params + 3 * shape.lora_params)
        else:
            mm *= 3
        mm, attn = mm + (mm / 3 if ckpt else 0), attn * (3 + ckpt)
        kernels = passes * (shape.ops * (1 + BACKWARD_OPS + ckpt) * rates.op_s + rates.fixed(UPDATE_PASS_S))
        trained = shape.lora_params or shape.params
        optimizer = update.num_mini * (trained * OPTIMIZER_BYTES / rates.bandwidth + 12 * (shape.layers * 12 + 3)
                                       * rates.op_s)
        out[name] = DISPATCH_S + update.ppo_epochs * (mm / rates.matmul(shape.width) + attn / rates.attention
                                                      + kernels + optimizer)
    if plan.runs("update_weights"):
        out["update_weights"] = DISPATCH_S + SYNC_S + 3.0 * shapes["actor"].params * dtype_bytes / rates.bandwidth
    return out
