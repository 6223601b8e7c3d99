"""Message values of registered topics -> their models (unknown fields of a newer producer dropped)."""

from __future__ import annotations

import logging
from typing import Any

import orjson
from pydantic import BaseModel, ValidationError

from ..topics import TOPICS

__all__ = [
    "decode",
]

log = logging.getLogger(__name__)


def decode(topic: str, value: bytes | None) -> BaseModel:
    """Parse a message value of a registered topic into its model.

    The bytes go straight to pydantic's JSON parser (``model_validate_json``: no intermediate
    dict, a quarter cheaper than ``orjson.loads`` + ``model_validate`` on a sample); every number
    must be finite (the models' ``allow_inf_nan=False``: ``NaN``, ``Infinity`` and ``1e999`` are
    refused). Fields unknown to this version (added by a newer producer) are dropped with a
    warning instead of rejecting the message, so a rolling upgrade loses nothing; every other
    schema violation is an error.

    Raises:
        ValueError: not JSON, or no value.
        pydantic.ValidationError: JSON that does not match the topic's schema.
    """
    if value is None:
        raise ValueError("empty value (tombstone)")
    spec = TOPICS[topic]
    if spec.model is None:
        raise ValueError(f"topic {topic} has no schema")
    try:
        return spec.model.model_validate_json(value)
    except ValidationError as exc:
        errors = exc.errors()
        if errors and errors[0]["type"] == "json_invalid":
            raise ValueError(f"not JSON: {errors[0]['msg']}") from exc
        if not errors or any(e["type"] != "extra_forbidden" for e in errors):
            raise
    # Only fields this version does not know: a newer producer of the same schema version (a
    # rolling upgrade). Drop them and keep the message; warn once per field.
    data = orjson.loads(value)
    for e in errors:
        _drop(data, e["loc"])
        path = f"{topic}:{'.'.join(str(p) for p in e['loc'] if not isinstance(p, int))}"
        if path not in _IGNORED_FIELDS:
            _IGNORED_FIELDS.add(path)
            log.warning("ignoring unknown field %s (newer producer? upgrade this service)", path)
    return spec.model.model_validate(data)


_IGNORED_FIELDS: set[str] = set()


def _drop(data: Any, loc: tuple[int | str, ...]) -> None:
    for part in loc[:-1]:
        data = data[part]
    if isinstance(data, dict):
        data.pop(loc[-1], None)
