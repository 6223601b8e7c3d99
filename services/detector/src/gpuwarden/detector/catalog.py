"""Loading and validating the failure catalog (rules as YAML data).

A rule names a canonical pattern, what it matches, its severity, recommended action,
episode (burst) window, cost scope, verdict template and what the data cannot tell.
Templates may use ``{node}``, ``{gpu}``, ``{job_text}``, ``{code}``, ``{message}``.

XIDs are classified once, in the XID table of :mod:`gpuwarden.shared.nvidia.xids` (``xids.csv``):
an XID without a rule of its own gets its rule from its table row; the YAML's XID rules add a
verdict, evidence and cost model for a few codes and keep the table's pattern and severity.
"""

from __future__ import annotations

import re
from importlib.resources import files
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from gpuwarden.shared.models import PATTERNS, Action, Category, Severity
from gpuwarden.shared.nvidia import xids
from gpuwarden.shared.nvidia.xids import XidEntry

from .conditions import ConditionRule, CostModel, Explain, RuleBase

__all__ = [
    "PATTERNS",
    "Catalog",
    "CatalogError",
    "CostModel",
    "Explain",
    "Match",
    "Rule",
    "XidEntry",
    "load_catalog",
    "load_xid_table",
]


class CatalogError(ValueError):
    """The catalog file is not valid: the message names the rule and field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Match(_Strict):
    """What a rule matches: an event kind and its codes.

    ``xid-repeat``: the codes recurring on one GPU under at least ``jobs`` different Slurm
    jobs within ``window_s`` (a GPU that keeps failing whoever runs on it).
    """

    event: Literal["xid", "sxid", "xid-repeat"]
    codes: list[int] = Field(default_factory=list, description="Empty: any code (sxid only)")
    fatal: bool | None = Field(None, description="sxid: match only Fatal (true) or Non-fatal (false) lines")
    message: str | None = Field(
        None,
        description="Match only events whose message (or raw line) contains this regular expression "
        "(case-insensitive): one code whose meaning the driver's text tells apart (XID 63/64: page "
        "retirement before A100, row remapping from A100 on)",
    )
    jobs: int | None = Field(None, ge=2, description="xid-repeat: distinct jobs needed")
    window_s: float | None = Field(None, gt=0, description="xid-repeat: look-back window, s")

    @field_validator("message")
    @classmethod
    def _regex(cls, v: str | None) -> str | None:
        if v is not None:
            re.compile(v)  # re.error is a ValueError: a bad pattern fails at load
        return v

    @model_validator(mode="after")
    def _repeat(self) -> Match:
        if not self.codes and self.event != "sxid":
            raise ValueError(f"event {self.event} needs codes")
        if (self.event == "xid-repeat") != (self.jobs is not None and self.window_s is not None):
            raise ValueError("jobs and window_s are required for (and only for) event xid-repeat")
        return self


class Rule(RuleBase):
    """An event rule: which XID/SXID events it matches and how repeats fold into an episode."""

    match: Match
    burst_window_s: float = Field(180, gt=0, description="Repeats within this window (s) update one failure")


STICKY_WINDOW_S = 3600.0
#: An application fault storm (XID 13/31/43 from one process, often for hours): one episode
#: while repeats come within this window, not one failure per quiet spell of a few minutes.
APPLICATION_WINDOW_S = 1800.0
#: The catalog's memory-error rules that explain memory repair events and conditions.
MEMORY_ERROR_RULES = ("xid-48-double-bit-ecc", "xid-94-contained-memory-error", "xid-95-uncontained-memory-error")
#: How far (event time, s) a memory repair event may lie from the error it repairs.
MEMORY_REPAIR_WINDOW_S = 30.0


def _table_rule(e: XidEntry | None, code: int) -> Rule:
    """The rule for an XID that has no rule of its own in the catalog YAML."""
    if e is None:
        return Rule(
            id=f"xid-{code}",
            pattern="xid-other",
            category=Category.DRIVER,
            severity=Severity.WARNING,
            match=Match(event="xid", codes=[code]),
            action=Action.ALERT,
            verdict=f"GPU {{gpu}} on {{node}} reported XID {code}, a code missing from the XID catalog: "
            f"{{message}}; affected: {{job_text}}.",
            cannot_determine=["what XID " + str(code) + " means: it is not in NVIDIA's catalog of this release"],
        )
    meaning = e.meaning.replace("{", "(").replace("}", ")")
    category = (
        Category.APPLICATION
        if e.pattern == "xid-application-fault"
        else (Category.DRIVER if e.pattern in ("driver-fault", "gsp-firmware-error") else Category.HARDWARE)
    )
    cannot = (
        ["whether the cause is the application or the GPU, until it recurs under another job"]
        if (category is Category.APPLICATION)
        else ["whether it recurs after a GPU reset (needs the GPU's history)"]
    )
    return Rule(
        id=f"xid-{code}",
        # a memory repair event (XID 63/64) next to the error it repairs is that error's failure
        explain=Explain(by=list(MEMORY_ERROR_RULES), window_s=MEMORY_REPAIR_WINDOW_S)
        if e.pattern in ("row-remap-pending", "retired-pages")
        else None,
        pattern=e.pattern,
        category=category,
        severity=e.severity,
        match=Match(event="xid", codes=[code]),
        action=e.action,
        burst_window_s=STICKY_WINDOW_S
        if e.sticky
        else APPLICATION_WINDOW_S
        if category is Category.APPLICATION
        else 180.0,
        verdict=f"GPU {{gpu}} on {{node}} reported XID {code} ({meaning}); affected: {{job_text}}.",
        cannot_determine=cannot,
        source="https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html",
    )


def load_xid_table(path: str | Path | None = None) -> dict[int, XidEntry]:
    """The XID table (:func:`gpuwarden.shared.nvidia.xids.load_xid_table`): the shipped
    ``xids.csv`` of ``gpuwarden.shared.nvidia``, or the CSV at ``path``.

    Raises:
        CatalogError: unreadable file or a row that fails validation.
    """
    try:
        return xids.load_xid_table(path)
    except ValueError as exc:
        raise CatalogError(str(exc)) from exc


class Catalog(_Strict):
    version: Literal[1]
    rules: list[Rule] = Field(min_length=1)
    conditions: list[ConditionRule] = Field(default_factory=list, description="Condition rules (healthy default)")
    xid_table: dict[int, XidEntry] = Field(
        default_factory=dict, description="The XID table: every known code (a rule of its own, if any, decides first)"
    )
    _rule_cache: dict[int, Rule] = PrivateAttr(default_factory=dict)
    _explain_cache: dict[str, Explain] | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _unique(self) -> Catalog:
        seen: dict[tuple[str, int], str] = {}
        ids = {c.id for c in self.conditions}
        if len(ids) != len(self.conditions):
            raise ValueError("duplicate condition rule id")
        for r in self.rules:
            if r.id in ids:
                raise ValueError(f"duplicate rule id {r.id}")
            ids.add(r.id)
            for c in r.match.codes if r.match.event == "xid" and r.match.message is None else []:
                key = (r.match.event, c)
                if key in seen:
                    raise ValueError(f"{r.match.event} {c} matched by both {seen[key]} and {r.id}")
                seen[key] = r.id
        table_ids = {f"xid-{code}" for code in self.xid_table}
        rule: RuleBase
        for rule in [*self.conditions, *self.rules]:
            ex = rule.explain
            unknown = [x for x in [*ex.by, *ex.explains] if x not in ids and x not in table_ids] if ex else []
            if unknown:
                raise ValueError(f"rule {rule.id}: explain names unknown rules {unknown}")
        graph = {rid: set(e.by) for rid, e in self._explanations().items()}
        for start in graph:  # a cycle would let two findings wait for each other forever
            todo, visited = list(graph[start]), set()
            while todo:
                x = todo.pop()
                if x == start:
                    raise ValueError(f"rule {start}: explain forms a cycle (it explains itself through others)")
                if x not in visited:
                    visited.add(x)
                    todo.extend(graph.get(x, ()))
        return self

    def explanations(self) -> dict[str, Explain]:
        """Rule id -> its effective ``explain`` block: its own ``by`` plus every rule that names it
        in ``explains`` (with the wider window and scope of the two), and the XID table's rules
        (memory repair events explained by the memory error they repair). Rules without one are
        absent (a candidate of theirs passes the pending stage at once)."""
        if self._explain_cache is None:
            self._explain_cache = self._explanations()
        return self._explain_cache

    def _explanations(self) -> dict[str, Explain]:
        out: dict[str, Explain] = {}
        table = [_table_rule(e, code) for code, e in self.xid_table.items()]
        own = {r.id for r in self.rules}
        every: list[RuleBase] = [*self.conditions, *self.rules, *(t for t in table if t.id not in own)]
        for r in every:
            if r.explain is not None and (r.explain.by or r.explain.aggregate or r.explain.startup_s is not None):
                out[r.id] = r.explain
        for r in every:
            ex = r.explain
            if ex is None:
                continue
            for target in ex.explains:
                cur = out.get(target)
                if cur is None:
                    out[target] = Explain(by=[r.id], window_s=ex.window_s, scope=ex.scope)
                else:
                    out[target] = cur.model_copy(
                        update={
                            "by": [*cur.by, *([r.id] if r.id not in cur.by else [])],
                            "window_s": max(cur.window_s, ex.window_s),
                            "scope": "node" if "node" in (cur.scope, ex.scope) else "gpu",
                        }
                    )
        return out

    def for_event(
        self, kind: str, code: int | None, fatal: bool | None = None, message: str | None = None
    ) -> Rule | None:
        """The rule for an event kind (``xid``/``sxid``) and code, or None.

        An XID without a rule of its own gets one from the XID table; a code missing from
        the table gets an ``xid-other`` rule (never silently ignored). SXID rules may match
        any code and filter on the Fatal/Non-fatal token (``fatal``). A rule with a ``message``
        pattern matches only events whose ``message`` contains it; rules with a pattern are
        tried before those without.
        """
        if code is None:
            return None
        for r in sorted(self.rules, key=lambda r: r.match.message is None):
            m = r.match
            if m.event != kind or (m.codes and code not in m.codes):
                continue
            if m.fatal is not None and m.fatal != bool(fatal):
                continue
            if m.message is not None and not (message and re.search(m.message, message, re.IGNORECASE)):
                continue
            return r
        if kind != "xid":
            return None
        cached = self._rule_cache.get(code)
        if cached is None:
            cached = self._rule_cache[code] = _table_rule(self.xid_table.get(code), code)
        return cached

    def repeat_rules(self, code: int | None) -> list[Rule]:
        """``xid-repeat`` rules watching ``code``."""
        return [r for r in self.rules if r.match.event == "xid-repeat" and code in r.match.codes]


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
    if isinstance(data, dict) and "xid_table" not in data:
        data = {**data, "xid_table": load_xid_table()}
    try:
        return Catalog.model_validate(data)
    except ValueError as exc:
        raise CatalogError(f"{path or 'catalog.yaml'}: {_short(exc)}") from exc


def _short(exc: ValueError) -> str:
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        return "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg'].removeprefix('Value error, ')}" for e in exc.errors()
        )
    return str(exc)
