"""The weight broadcast between groups (workers/collective.py), over gloo between threads of this process: what
the trainer's root sends is what every rollout rank's engine gets, bucket by bucket, with the kind and version;
a corrupted bucket, a stream unlike its description and a peer that never comes each end in one line."""

import threading
import time

import pytest
import torch

from logicrl.controller.ports import free_port
from logicrl.workers.collective import BroadcastReceiver, BroadcastSender, WeightGroup, WeightSyncFailed
from logicrl.workers.transport import Payload, TensorMeta, checksum_of


class Engine:
    """Keeps a copy of every tensor of each sync call (the received ones are views of a bucket buffer)."""

    def __init__(self):
        self.calls = []

    def sync_weights(self, tensors):
        self.calls.append(("sync_weights", [(n, t.clone()) for n, t in tensors]))

    def sync_adapters(self, tensors):
        self.calls.append(("sync_adapters", [(n, t.clone()) for n, t in tensors]))


def weights():
    # 6 x 5 fp32 (120 bytes), 7 bf16 (14 bytes), 4 x 4 fp32 (64 bytes)
    return [("a.weight", torch.arange(30, dtype=torch.float32).reshape(6, 5)),
            ("b.bias", torch.linspace(-1, 1, 7).bfloat16()), ("c.weight", torch.eye(4))]


def meta_of(tensors):
    return [TensorMeta(n, tuple(t.shape), t.dtype) for n, t in tensors]


def in_threads(*calls):
    """Run the calls at once, each in its own thread; their results, or the first error raised."""
    results, errors = [None] * len(calls), []

    def run(i, call):
        try:
            results[i] = call()
        except BaseException as err:  # noqa: BLE001 -- handed back to the test
            errors.append(err)

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    if errors:
        raise errors[0]
    return results


def connect(receivers: int = 2, timeout_s: float = 5.0, bucket_mb: float = 150 / 2**20):
    """A root sender and `receivers` receivers in one weight group; 150-byte buckets: a, then b + c."""
    port = free_port("127.0.0.1")
    groups = in_threads(*[lambda r=r: WeightGroup.join("127.0.0.1", port, r, receivers + 1, torch.device("cpu"),
                                                       timeout_s) for r in range(receivers + 1)])
    sender = BroadcastSender(bucket_mb)
    sender.group = groups[0]
    out = []
    for group in groups[1:]:
        receiver = BroadcastReceiver()
        receiver.group = group
        out.append(receiver)
    for side in (sender, *out):
        side.describe("weights", meta_of(weights()))
    return sender, out


def test_every_rollout_rank_gets_the_trainers_tensors_kind_version_and_checksum():
    sender, receivers = connect()
    engines = [Engine() for _ in receivers]
    sent, *got = in_threads(lambda: sender.send(Payload("weights", 7, iter(weights()))),
                            *[lambda r=r, e=e: r.receive(e) for r, e in zip(receivers, engines)])
    assert (sent.kind, sent.version, sent.tensors, sent.bytes) == ("weights", 7, 3, 120 + 14 + 64)
    assert sent.checksum == checksum_of(weights())
    for receipt, engine, receiver in zip(got, engines, receivers):
        assert (receipt.kind, receipt.version, receipt.bytes, receipt.checksum) == ("weights", 7, 198, sent.checksum)
        assert receiver.version == 7
        (call, tensors), = engine.calls
        assert call == "sync_weights"
        for (name, tensor), (want_name, want) in zip(tensors, weights()):
            assert name == want_name and tensor.dtype == want.dtype and torch.equal(tensor, want)


def test_adapters_go_to_the_adapter_call_and_a_root_alone_sends():
    sender, (receiver,) = connect(receivers=1)
    adapters = [("x.lora_A.default.weight", torch.ones(2, 3)), ("x.lora_B.default.weight", torch.full((3, 2), 2.0))]
    for side in (sender, receiver):
        side.describe("adapters", meta_of(adapters))
    engine = Engine()
    in_threads(lambda: sender.send(Payload("adapters", 2, iter(adapters))), lambda: receiver.receive(engine))
    assert engine.calls[0][0] == "sync_adapters"
    assert torch.equal(engine.calls[0][1][1][1], adapters[1][1])
    # A trainer rank other than the root only drains the stream (its FSDP all-gathers), sending nothing.
    drain = BroadcastSender(1.0)
    drain.describe("weights", meta_of(weights()))
    receipt = drain.send(Payload("weights", 3, iter(weights())))
    assert (receipt.tensors, receipt.bytes, receipt.checksum, drain.version) == (3, 198, None, 3)


def test_a_corrupted_bucket_is_an_error_on_the_rollout_rank(monkeypatch):
    sender, (receiver,) = connect(receivers=1)
    real = sender.group.broadcast

    def flip(tensor, phase, what):  # one bit of the first bucket's bytes flipped on the way
        if what.startswith("bucket 1 ("):
            tensor = tensor.clone()
            tensor[0] ^= 1
        return real(tensor, phase, what)

    monkeypatch.setattr(sender.group, "broadcast", flip)
    with pytest.raises(WeightSyncFailed, match=r"weights of version 4 that rollout rank 0 received differ from what "
                                               r"the trainer sent \(checksum"):
        in_threads(lambda: sender.send(Payload("weights", 4, iter(weights()))), lambda: receiver.receive(Engine()))


def test_a_stream_unlike_its_description_is_refused_before_it_is_sent():
    sender = BroadcastSender(1.0)
    sender.describe("weights", meta_of(weights()[::-1]))  # described in another order than the stream's
    sender.group = type("Loopback", (), {"device": torch.device("cpu"), "broadcast": lambda self, t, p, w: t})()
    with pytest.raises(ValueError, match=r"tensor 0 is a.weight \(6, 5\) torch.float32, not what was described"):
        sender.send(Payload("weights", 1, iter(weights())))


def test_a_peer_that_never_comes_ends_the_wait_in_bounded_time_with_one_line():
    _, (receiver,) = connect(receivers=1, timeout_s=1.0)
    start = time.monotonic()
    with pytest.raises(WeightSyncFailed) as err:
        receiver.receive(Engine())  # the trainer's root never sends
    assert time.monotonic() - start < 5
    line = str(err.value)
    assert "\n" not in line
    assert line.startswith("trainer->rollout weight group (2 ranks) failed in receiving weights on its rank 1")
    assert "async_training.sync_timeout_s" in line
