"""JSON Schemas of the message models, for consumers in other languages."""

from __future__ import annotations

import json
from pathlib import Path

from . import models as m

__all__ = ["MODELS", "schema_of", "write_schemas"]

MODELS: list[type[m.Model]] = [
    m.NodeSample,
    m.GpuSample,
    m.GpuEvent,
    m.JobState,
    m.NodeState,
    m.SlurmWatermark,
    m.AttributedSample,
    m.AttributedEvent,
    m.JobWindow,
    m.Failure,
    m.JobReport,
    m.Remediation,
    m.HealthCheckResult,
    m.DeadLetter,
]


def schema_of(model: type[m.Model]) -> str:
    """The model's JSON Schema (draft 2020-12) as stable, indented JSON text."""
    schema = model.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = f"https://gpuwarden.dev/schemas/v{m.SCHEMA_VERSION}/{model.__name__}.json"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def write_schemas(out: Path, check: bool = False) -> list[str]:
    """Write ``<Model>.json`` for every model into ``out``; returns files that changed.

    With ``check`` nothing is written (used by the test that keeps docs/schemas current).
    """
    out.mkdir(parents=True, exist_ok=True) if not check else None
    changed = []
    for model in MODELS:
        path = out / f"{model.__name__}.json"
        text = schema_of(model)
        if not path.exists() or path.read_text() != text:
            changed.append(path.name)
            if not check:
                path.write_text(text)
    return changed
