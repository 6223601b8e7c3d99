"""The remediation policy file (YAML, validated): which failures drain, alert or do nothing.

Example (``services/remediator/policy.example.yaml``)::

    version: 1
    hold_down_s: 600              # a node is resumed this long after its last failure resolved
    require_health_check: false   # also need a passed HealthCheckResult after the resolution
    confirm_window_s: 300         # how far back a second signal may be
    rules:                        # first match wins
      - id: fallen-off-bus
        pattern: gpu-fallen-off-bus
        severity: [critical, fatal]
        action: drain
      - id: ecc
        pattern: "*ecc*"          # fnmatch glob: uncorrectable-ecc, correctable-ecc-storm
        action: drain
        confirm: true             # needs a second signal (see below)
      - id: thermal
        pattern: thermal-throttle
        action: alert
    default: {id: default, pattern: "*", action: none}
    partitions:                   # per-partition rules, tried before the global ones
      debug:
        - {id: debug-never-drain, pattern: "*", action: alert}

Every rule's ``pattern`` must match at least one canonical pattern
(:data:`gpuwarden.shared.models.PATTERNS`): a glob that matches none (a typo, ``ecc-*`` when the
patterns are ``uncorrectable-ecc`` and ``correctable-ecc-storm``) is an error at load, not a rule
that silently never fires.

A *second signal* confirms a failure when the failure folds at least two occurrences, its
evidence names two different signals, or another open failure on the same node was seen
within ``confirm_window_s``. Without a file :data:`DEFAULT_POLICY` applies: drain-worthy
recommended actions (drain, reboot, rma, reset-gpu) at critical/fatal drain, other
critical/fatal failures alert, everything else does nothing.
"""

from __future__ import annotations

import fnmatch
from enum import StrEnum
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gpuwarden.shared.models import Action, Failure, PatternGlob, Severity

__all__ = ["DEFAULT_POLICY", "PolicyAction", "PolicyError", "PolicyFile", "PolicyRule", "load_policy"]


class PolicyError(ValueError):
    """The policy file is missing, not YAML or not valid; the message says where."""


class PolicyAction(StrEnum):
    """What a matching rule asks for."""

    DRAIN = "drain"
    ALERT = "alert"
    NONE = "none"


class PolicyRule(BaseModel):
    """One rule: failures matching ``pattern`` (fnmatch glob), ``severity`` (any of; empty =
    any) and ``recommended`` (any of the failure's recommended actions; empty = any) get
    ``action``; ``confirm`` requires a second signal before draining."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    pattern: PatternGlob = Field(min_length=1, max_length=128)
    severity: tuple[Severity, ...] = ()
    recommended: tuple[Action, ...] = ()
    action: PolicyAction
    confirm: bool = False

    def matches(self, f: Failure) -> bool:
        """True if ``f`` falls under this rule."""
        return (
            fnmatch.fnmatchcase(f.pattern, self.pattern)
            and (not self.severity or f.severity in self.severity)
            and (not self.recommended or f.recommended_action in self.recommended)
        )


class PolicyFile(BaseModel):
    """A whole policy: global rules, per-partition rules and the resume/confirm timings."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = Field(1, ge=1, le=1)
    hold_down_s: float = Field(600.0, ge=0, description="Resume this long after the last failure resolved, s")
    require_health_check: bool = Field(False, description="Resume only after a passed health check, too")
    confirm_window_s: float = Field(300.0, gt=0, description="How far back a confirming signal may be, s")
    rules: tuple[PolicyRule, ...] = ()
    default: PolicyRule = PolicyRule(id="default", pattern="*", action=PolicyAction.NONE)
    partitions: dict[str, tuple[PolicyRule, ...]] = Field(default_factory=dict)

    @field_validator("partitions")
    @classmethod
    def _partition_names(cls, v: dict[str, tuple[PolicyRule, ...]]) -> dict[str, tuple[PolicyRule, ...]]:
        for name in v:
            if not name or not all(c.isalnum() or c in "._-" for c in name):
                raise ValueError(f"invalid partition name {name!r}")
        return v

    def rule_for(self, f: Failure, partitions: list[str] | tuple[str, ...] = ()) -> PolicyRule:
        """The first matching rule: the failure's partition (or else the node's partitions,
        in order) first, then the global rules, then ``default``."""
        parts = [f.partition] if f.partition else list(partitions)
        for p in parts:
            for r in self.partitions.get(p or "", ()):
                if r.matches(f):
                    return r
        for r in self.rules:
            if r.matches(f):
                return r
        return self.default


_DRAINY = (Action.DRAIN, Action.REBOOT, Action.RMA, Action.RESET_GPU)
_HIGH = (Severity.CRITICAL, Severity.FATAL)

DEFAULT_POLICY = PolicyFile(
    rules=(
        PolicyRule(id="drain-recommended", pattern="*", severity=_HIGH, recommended=_DRAINY, action=PolicyAction.DRAIN),
        PolicyRule(id="alert-critical", pattern="*", severity=_HIGH, action=PolicyAction.ALERT),
    ),
)


def load_policy(path: Path | str | None) -> PolicyFile:
    """Read and validate a policy file (``None``: :data:`DEFAULT_POLICY`).

    Raises:
        PolicyError: unreadable, not YAML, or invalid (the message lists every problem).
    """
    if path is None:
        return DEFAULT_POLICY
    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text())
    except OSError as exc:
        raise PolicyError(f"cannot read policy file {p}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise PolicyError(f"policy file {p} is not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise PolicyError(f"policy file {p}: expected a mapping at the top, got {type(raw).__name__}")
    try:
        pol = PolicyFile.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise PolicyError(f"policy file {p} is invalid: {problems}") from exc
    ids = [r.id for r in pol.rules] + [r.id for rs in pol.partitions.values() for r in rs] + [pol.default.id]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise PolicyError(f"policy file {p} is invalid: duplicate rule ids {dup}")
    return pol
