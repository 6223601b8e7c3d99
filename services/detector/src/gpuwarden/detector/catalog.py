"""Loading and validating the failure catalog (rules as YAML data).

A rule names a canonical pattern, what it matches, its severity, recommended action,
episode (burst) window, cost scope, verdict template and what the data cannot tell.
Templates may use ``{node}``, ``{gpu}``, ``{job_text}``, ``{code}``, ``{message}``.
"""

from __future__ import annotations

import string
from importlib.resources import files
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gpuwarden.shared.models import PATTERNS, Action, Category, Severity

__all__ = ["PATTERNS", "Catalog", "CatalogError", "CostModel", "Match", "Rule", "load_catalog"]

_FIELDS = {"node", "gpu", "job_text", "code", "message"}


class CatalogError(ValueError):
    """The catalog file is not valid: the message names the rule and field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Match(_Strict):
    """What a rule matches: an event kind and its codes."""

    event: Literal["xid", "sxid"]
    codes: list[int] = Field(min_length=1)


class CostModel(_Strict):
    """``job``: all GPUs of the affected job stall; ``gpu``: only the GPU itself."""

    scope: Literal["job", "gpu"] = "job"


class Rule(_Strict):
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    pattern: str
    category: Category
    severity: Severity
    match: Match
    burst_window_s: float = Field(180, gt=0, description="Repeats within this window (s) update one failure")
    action: Action
    cost: CostModel = CostModel()
    verdict: str
    cannot_determine: list[str] = Field(default_factory=list)
    source: str | None = None

    @field_validator("pattern")
    @classmethod
    def _pattern(cls, v: str) -> str:
        if v not in PATTERNS:
            raise ValueError(f"unknown pattern {v!r} (DESIGN section 5 lists the canonical ones)")
        return v

    @field_validator("verdict")
    @classmethod
    def _template(cls, v: str) -> str:
        names = {f for _, f, _, _ in string.Formatter().parse(v) if f}
        unknown = names - _FIELDS
        if unknown:
            raise ValueError(f"verdict uses unknown fields {sorted(unknown)}; allowed {sorted(_FIELDS)}")
        return v


class Catalog(_Strict):
    version: Literal[1]
    rules: list[Rule] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> Catalog:
        seen: dict[tuple[str, int], str] = {}
        ids = set()
        for r in self.rules:
            if r.id in ids:
                raise ValueError(f"duplicate rule id {r.id}")
            ids.add(r.id)
            for c in r.match.codes:
                key = (r.match.event, c)
                if key in seen:
                    raise ValueError(f"{r.match.event} {c} matched by both {seen[key]} and {r.id}")
                seen[key] = r.id
        return self

    def for_event(self, kind: str, code: int | None) -> Rule | None:
        """The rule matching an event kind (``xid``/``sxid``) and code, or None."""
        if code is None:
            return None
        for r in self.rules:
            if r.match.event == kind and code in r.match.codes:
                return r
        return None


def load_catalog(path: str | Path | None = None) -> Catalog:
    """Load and validate a catalog YAML file (default: the shipped ``catalog.yaml``).

    Raises:
        CatalogError: unreadable YAML or a rule that fails validation.
    """
    try:
        text = Path(path).read_text() if path else files(__package__).joinpath("catalog.yaml").read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise CatalogError(f"{path}: cannot read: {exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CatalogError(f"{path or 'catalog.yaml'}: not valid YAML: {exc}") from exc
    try:
        return Catalog.model_validate(data)
    except ValueError as exc:
        raise CatalogError(f"{path or 'catalog.yaml'}: {exc}") from exc
