"""The codec's rules: finite numbers only (orjson rejects ``Infinity``, ``NaN`` and ``1e999``;
pydantic's own JSON parser, ``model_validate_json``, would take them as floats), not-JSON as a
``ValueError``, unknown fields of a newer producer dropped."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpuwarden.shared.bus import decode
from gpuwarden.shared.models import GpuSample, NodeSample

GOOD = NodeSample(
    node="n1", ts=1.7e9, collector_id="c", source="simulated", gpus=[GpuSample(index=0, power_w=1.0)]
).to_json()


@pytest.mark.parametrize("literal", [b"Infinity", b"-Infinity", b"NaN", b"1e999"])
def test_non_finite_numbers_are_rejected(literal: bytes) -> None:
    bad = GOOD.replace(b'"power_w":1.0', b'"power_w":' + literal)
    assert bad != GOOD
    with pytest.raises((ValueError, ValidationError)):
        decode("gpu.samples", bad)


def test_not_json_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="not JSON"):
        decode("gpu.samples", b'{"node": ')


def test_unknown_field_of_a_newer_producer_is_dropped() -> None:
    newer = GOOD[:-1] + b',"added_in_v2":1}'
    assert decode("gpu.samples", newer) == decode("gpu.samples", GOOD)
