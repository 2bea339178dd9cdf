"""Sharded checkpoints of an FSDP2 model over two gloo ranks: exact round trip, HF export, a kill mid-save.

One spawn trains the tiny Qwen2 two steps, saves and commits step 1 (rank 0 plays the controller's
part), exports HF, then starts saving step 2 and SIGKILLs rank 1 in the middle of writing. A second
spawn, built from another seed, resumes from what `find_resume_point` picks and must hold exactly
the saved parameters, optimizer state and scheduler state.
"""

import json
import os
import signal
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from logicrl.controller.ports import free_port
from logicrl.rng import capture_rng_state
from logicrl.trainer import checkpoint as ckpt
from tests.helpers.spawn import spawn
from tests.workers.conftest import leave_group

WORLD = 2


def _train_step(model, optimizer, scheduler, rank: int, step: int):
    g = torch.Generator().manual_seed(100 * step + rank)  # each rank its own data, as in training
    ids = torch.randint(0, 2048, (2, 10), generator=g)
    model.train()
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    scheduler.step()


def _local_state(model, optimizer) -> dict[str, torch.Tensor]:
    """This rank's shards of every parameter and optimizer-state tensor (same world size: same shards)."""
    out = {}
    for name, p in model.named_parameters():
        out[f"param/{name}"] = p.detach().to_local().clone()
        for key, value in optimizer.state.get(p, {}).items():
            value = value.to_local() if hasattr(value, "to_local") else value
            out[f"optim/{name}/{key}"] = value.detach().clone().reshape(value.shape)
    return out


def _build(seed: int, rank: int, port: int):
    from logicrl.workers.fsdp import build_optimizer, init_distributed, shard_model
    from tests.workers.conftest import build_tiny_qwen2

    torch.set_num_threads(1)
    device = torch.device("cpu")
    mesh = init_distributed(rank, WORLD, "127.0.0.1", port, device)
    model = shard_model(build_tiny_qwen2(seed=seed), mesh, device)
    # Warm-up then cosine: after two steps the scheduler's state is not its initial one.
    optimizer, scheduler = build_optimizer(model, 1e-3, 0.01, 10, 0.3, "cosine")
    return model, optimizer, scheduler, mesh


def _train_save_crash(rank: int, port: int, root: str, tmp1: str, tmp2: str, src: str, ref: str):
    from safetensors.torch import save_file

    from logicrl.workers.checkpoint import save_sharded
    from logicrl.workers.hf_export import export_hf

    model, optimizer, scheduler, _ = _build(0, rank, port)
    for step in range(2):
        _train_step(model, optimizer, scheduler, rank, step)
    save_sharded(os.path.join(tmp1, "actor"), model, optimizer, scheduler)
    export_hf(model, os.path.join(tmp1, "huggingface"), src)
    save_file(_local_state(model, optimizer), os.path.join(ref, f"rank{rank}.safetensors"))
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=torch.arange(3, 19)[None]).logits
    if rank == 0:
        save_file({"logits": logits.contiguous()}, os.path.join(ref, "logits.safetensors"))
        (Path(ref) / "scheduler.json").write_text(json.dumps(scheduler.state_dict()))
        ckpt.write_trainer_state(tmp1, ckpt.TrainerState(step=1, sampler_position=1, kl_coef=0.001,
                                                         rng=capture_rng_state()))
        ckpt.commit(tmp1)
    torch.distributed.barrier()

    # Step 2's save dies half-way: rank 1 is SIGKILLed right after writing its data file, before
    # DCP's metadata, before COMPLETE, before any rename. Nothing of it may be resumed from.
    _train_step(model, optimizer, scheduler, rank, 2)
    if rank == 1:
        from torch.distributed.checkpoint import FileSystemWriter

        write_data = FileSystemWriter.write_data

        def write_then_die(self, plan, planner):
            write_data(self, plan, planner).wait()
            os.kill(os.getpid(), signal.SIGKILL)

        FileSystemWriter.write_data = write_then_die
    save_sharded(os.path.join(tmp2, "actor"), model, optimizer, scheduler)
    raise AssertionError("unreachable: rank 1 was killed mid-save and rank 0 waits on it")


def _lora_model(seed: int):
    """The tiny Qwen2 with a LoRA adapter whose B is not zero, so merging it changes the weights."""
    from peft import LoraConfig, get_peft_model

    from tests.workers.conftest import build_tiny_qwen2

    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0,
                        task_type="CAUSAL_LM")
    model = get_peft_model(build_tiny_qwen2(seed=seed), config)
    torch.manual_seed(seed + 1)
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.05)
    return model


def _resume_and_compare(rank: int, port: int, checkpoint: str, ref: str, src: str):
    from safetensors.torch import load_file

    from logicrl.workers.checkpoint import load_sharded

    model, optimizer, scheduler, mesh = _build(1, rank, port)  # another seed: every value must come from disk
    expected = load_file(os.path.join(ref, f"rank{rank}.safetensors"))
    before = _local_state(model, optimizer)
    assert not any(torch.equal(before[k], expected[k]) for k in before if k.startswith("param/") and "norm" not in k)
    load_sharded(os.path.join(checkpoint, "actor"), model, optimizer, scheduler)
    got = _local_state(model, optimizer)
    assert got.keys() == expected.keys()
    assert any(k.endswith("/exp_avg_sq") for k in got)
    for key, value in expected.items():
        assert torch.equal(got[key], value), key
    saved_sched = json.loads((Path(ref) / "scheduler.json").read_text())
    assert json.loads(json.dumps(scheduler.state_dict())) == saved_sched
    assert scheduler.last_epoch == 2
    # The learning rate the optimizer will use next is the saved one, not the fresh schedule's.
    assert optimizer.param_groups[0]["lr"] == pytest.approx(saved_sched["_last_lr"][0])

    # LoRA export rides on this spawn (a process group costs seconds to start): adapter + merged model.
    from safetensors.torch import save_file

    from logicrl.workers.fsdp import shard_model
    from logicrl.workers.hf_export import export_hf

    lora = shard_model(_lora_model(seed=2), mesh, torch.device("cpu")).eval()
    with torch.no_grad():
        logits = lora(input_ids=torch.arange(3, 19)[None]).logits
    export_hf(lora, os.path.join(ref, "lora_hf"), src, merge_lora=True)
    if rank == 0:
        save_file({"logits": logits.contiguous()}, os.path.join(ref, "lora_logits.safetensors"))
    leave_group()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from tests.workers.conftest import build_tiny_qwen2

    base = tmp_path_factory.mktemp("ckpt")
    root, ref, src = base / "run", base / "ref", base / "source"
    ref.mkdir()
    build_tiny_qwen2(0).config.save_pretrained(src)  # the "model.path" the export copies config.json from
    (src / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 64}))
    tmp1, tmp2 = ckpt.begin(root, 1), ckpt.begin(root, 2)
    with pytest.raises(mp.ProcessExitedException) as died:
        spawn(_train_save_crash, args=(free_port(), str(root), str(tmp1), str(tmp2), str(src), str(ref)),
                 nprocs=WORLD)
    assert died.value.error_index == 1 and died.value.signal_name == "SIGKILL"
    return root, ref, tmp2, src


@pytest.mark.integration
def test_kill_mid_save_keeps_previous_checkpoint(trained):
    root, _, tmp2, _ = trained
    assert ckpt.read_latest_pointer(root) == 1
    assert tmp2.is_dir() and not ckpt.step_dir(root, 2).exists()  # the half-written save is still there ...
    assert ckpt.find_resume_point(root, "auto") == ckpt.step_dir(root, 1)
    assert not tmp2.exists()  # ... until the next start-up sweeps it
    assert ckpt.read_trainer_state(ckpt.step_dir(root, 1)).step == 1


@pytest.fixture(scope="module")
def resumed(trained):
    """Fresh ranks resume from the checkpoint `find_resume_point` picks; they assert equality themselves."""
    root, ref, _, src = trained
    checkpoint = ckpt.find_resume_point(root, "auto")
    spawn(_resume_and_compare, args=(free_port(), str(checkpoint), str(ref), str(src)), nprocs=WORLD)
    return checkpoint


@pytest.mark.integration
def test_resume_restores_model_optimizer_scheduler(trained, resumed):
    # The comparisons ran inside the ranks (each against its own shards); any mismatch failed the spawn.
    assert resumed == ckpt.step_dir(trained[0], 1)


@pytest.mark.integration
def test_hf_export_loads_and_matches_trained_logits(trained):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    root, ref, _, _ = trained
    out = ckpt.step_dir(root, 1) / "huggingface"
    assert (out / "tokenizer_config.json").is_file() and (out / "model.safetensors").is_file()
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, local_files_only=True).eval()
    with torch.no_grad():
        logits = model(input_ids=torch.arange(3, 19)[None]).logits
    torch.testing.assert_close(logits, load_file(ref / "logits.safetensors")["logits"], atol=1e-5, rtol=1e-5)


@pytest.mark.integration
def test_lora_export_merged_and_adapter(trained, resumed):
    """The resume spawn also exported a sharded LoRA model into ref/lora_hf (merged + adapter)."""
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from logicrl.workers.hf_export import LORA_ADAPTER_DIR

    _, ref, _, src = trained
    out, ids = ref / "lora_hf", torch.arange(3, 19)[None]
    expected = load_file(ref / "lora_logits.safetensors")["logits"]
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, local_files_only=True).eval()
    adapter_config = json.loads((out / LORA_ADAPTER_DIR / "adapter_config.json").read_text())
    assert adapter_config["base_model_name_or_path"] == str(src.resolve())
    # The source dir holds no weights in this test; the base is rebuilt from its seed instead.
    from tests.workers.conftest import build_tiny_qwen2

    adapted = PeftModel.from_pretrained(build_tiny_qwen2(seed=2), out / LORA_ADAPTER_DIR).eval()
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits, expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(adapted(input_ids=ids).logits, expected, atol=1e-5, rtol=1e-5)


def test_metadata_unpickler_refuses_code(tmp_path):
    import pickle

    from logicrl.workers.checkpoint import _MetadataUnpickler

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    with pytest.raises(pickle.UnpicklingError, match="not plain data"):
        _MetadataUnpickler(__import__("io").BytesIO(pickle.dumps(Evil()))).load()
