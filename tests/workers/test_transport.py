"""The weight-sync transport (workers/transport.py): the in-process one routes each payload kind to its
engine call, counts and hashes what passes, keeps the version; the metadata sent once matches the streams."""

import pytest
import torch

from logicrl.workers.transport import Checksum, InProcess, Payload, TensorMeta, checksum_of
from logicrl.workers.weight_sync import adapter_meta, engine_weight_meta, iter_adapter_weights, iter_engine_weights


class RecordingEngine:
    """An engine that keeps what each sync call received, in order."""

    def __init__(self):
        self.calls: list[tuple[str, list[tuple[str, torch.Tensor]]]] = []

    def sync_weights(self, tensors):
        self.calls.append(("sync_weights", list(tensors)))

    def sync_adapters(self, tensors):
        self.calls.append(("sync_adapters", list(tensors)))


def named(*shapes, dtype=torch.float32):
    return [(f"layer{i}.weight", torch.arange(torch.Size(s).numel(), dtype=dtype).reshape(s)) for i, s in
            enumerate(shapes)]


def test_each_kind_reaches_its_engine_call_with_every_tensor_counted():
    engine = RecordingEngine()
    transport = InProcess(engine)
    tensors = named((2, 3), (4,))  # 6 + 4 fp32 values: 40 bytes
    receipt = transport.send(Payload("weights", 3, iter(tensors)))
    assert (receipt.kind, receipt.version, receipt.tensors, receipt.bytes) == ("weights", 3, 2, 40)
    assert receipt.checksum is None  # not asked for
    assert engine.calls[0][0] == "sync_weights"
    assert [n for n, _ in engine.calls[0][1]] == ["layer0.weight", "layer1.weight"]
    assert all(a is b for (_, a), (_, b) in zip(engine.calls[0][1], tensors))  # by reference, not copied
    transport.send(Payload("base", 3, iter(tensors)))
    transport.send(Payload("adapters", 4, iter(named((1, 2)))))
    assert [c for c, _ in engine.calls] == ["sync_weights", "sync_weights", "sync_adapters"]
    assert transport.version == 4
    assert transport.receive(engine).kind == "adapters"


def test_the_checksum_is_of_what_the_engine_received():
    engine = RecordingEngine()
    receipt = InProcess(engine, checksum=True).send(Payload("weights", 1, iter(named((3, 2), (5,)))))
    assert receipt.checksum == checksum_of(engine.calls[0][1])


def test_the_checksum_sees_a_changed_value_name_dtype_or_order():
    base = named((2, 2), (3,))
    digest = checksum_of(base)
    changed = [(n, t.clone()) for n, t in base]
    changed[1][1][0] += 1
    assert checksum_of(changed) != digest
    assert checksum_of([("other.weight", base[0][1]), base[1]]) != digest
    assert checksum_of([(n, t.double()) for n, t in base]) != digest
    assert checksum_of(base[::-1]) != digest
    assert checksum_of([(n, t.clone()) for n, t in base]) == digest
    one = Checksum()
    one.add("empty", torch.empty(0))  # an empty tensor has no bytes, but its name and shape count
    assert one.hexdigest() != Checksum().hexdigest()


def test_receive_before_any_send_or_for_another_engine_is_refused():
    engine = RecordingEngine()
    transport = InProcess(engine)
    with pytest.raises(RuntimeError, match="nothing was sent"):
        transport.receive(engine)
    transport.send(Payload("weights", 1, iter(named((1,)))))
    with pytest.raises(ValueError, match="the engine it was built with"):
        transport.receive(RecordingEngine())
    with pytest.raises(ValueError, match="no payload kind 'all'"):
        Payload("all", 1, [])


def test_metadata_is_what_the_bucketed_stream_sends(make_tiny_qwen2):
    model = make_tiny_qwen2()
    for dtype in (None, torch.bfloat16):
        streamed = [TensorMeta(n, tuple(t.shape), t.dtype) for n, t in iter_engine_weights(model, 0.05, dtype=dtype)]
        assert engine_weight_meta(model, dtype) == streamed


def test_lora_metadata_matches_the_merged_and_the_adapter_streams(make_tiny_qwen2):
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(make_tiny_qwen2(), peft.LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"]))
    merged = [TensorMeta(n, tuple(t.shape), t.dtype) for n, t in iter_engine_weights(model, dtype=torch.bfloat16)]
    assert engine_weight_meta(model, torch.bfloat16) == merged
    assert not any("lora" in m.name for m in merged)  # the adapters are folded into their base weights
    adapters = [TensorMeta(n, tuple(t.shape), t.dtype) for n, t in iter_adapter_weights(model, torch.bfloat16)]
    assert adapter_meta(model, torch.bfloat16) == adapters
    assert len(adapters) == 2 * 2  # A and B of q_proj in each of the 2 layers
