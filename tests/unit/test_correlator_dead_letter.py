"""The correlator dead-letters an oversize record by reference, with the shared rule of
:func:`gpuwarden.shared.bus.dead_letter_of` (issue 13: a ~1 MB record made a 1.35 MB dead letter
the producer refused, and the faust agent of the time crashed on it)."""

from __future__ import annotations

import base64

import pytest

from gpuwarden.correlator.core import Correlator
from gpuwarden.shared import bus
from gpuwarden.shared.bus import DEAD_LETTER_MAX_BYTES, DEAD_LETTER_PREFIX_BYTES, MAX_MESSAGE_BYTES, deadletter, decode
from gpuwarden.shared.models import DeadLetter


def topic(short: str) -> str:
    return f"t.{short}"


def correlator() -> Correlator:
    return Correlator(topic_name=topic, clock=lambda: 1234.0)


@pytest.mark.parametrize("size", [800_000, 1_000_000, 1_200_000])
def test_oversize_record_is_dead_lettered_by_reference(size: int) -> None:
    raw = b"x" * size  # not JSON
    [o] = correlator().handle("gpu.samples", raw, b"gpu-node-008", partition=1, offset=77)
    assert o.topic == "deadletter" and len(o.value) < 16 * 1024 < MAX_MESSAGE_BYTES
    dl = decode("deadletter", o.value)
    assert isinstance(dl, DeadLetter)
    assert (dl.source_topic, dl.partition, dl.offset, dl.key) == ("t.gpu.samples", 1, 77, "gpu-node-008")
    assert dl.truncated and dl.value_size == size
    assert base64.b64decode(dl.value_b64) == raw[:DEAD_LETTER_PREFIX_BYTES]
    assert dl.error.startswith("schema:") and dl.ts == 1234.0


def test_small_record_is_carried_whole_with_its_size() -> None:
    raw = b"\xff" * 1000
    [o] = correlator().handle("gpu.events", raw, None)
    dl = decode("deadletter", o.value)
    assert isinstance(dl, DeadLetter)
    assert not dl.truncated and dl.value_size == 1000 and base64.b64decode(dl.value_b64) == raw and dl.key is None


def test_the_correlator_uses_the_shared_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deadletter, "DEAD_LETTER_MAX_BYTES", 10)  # one rule: the bound is read from bus.deadletter
    [o] = correlator().handle("gpu.samples", b"y" * 11)
    dl = decode("deadletter", o.value)
    assert isinstance(dl, DeadLetter) and dl.truncated and dl.value_size == 11
    assert DEAD_LETTER_MAX_BYTES == 256 * 1024


def test_dead_letter_of_cuts_key_and_error() -> None:
    dl = bus.dead_letter_of("svc", "t.x", 0, 5, b"k" * 5000, None, "e" * 5000, 1.0)
    assert dl.key == "k" * 1024 and len(dl.error) == 2000 and dl.value_b64 == "" and dl.value_size == 0
    assert not dl.truncated
