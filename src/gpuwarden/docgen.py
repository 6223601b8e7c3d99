"""Generated parts of the documentation: the topics table and the settings tables.

``python -m gpuwarden.docgen`` (``make docs``) rewrites, between marker comments, the topics
table of ``docs/architecture.md`` (from :data:`gpuwarden.shared.topics.TOPICS`), its table of
the settings every service shares, and the settings table of each service's README (from the
pydantic ``Field`` descriptions of the service's settings class); ``--check`` writes nothing
and exits 1 when a file is out of date (the unit test ``tests/unit/test_docgen.py`` does the
same). A generated block sits between::

    <!-- generated: NAME (python -m gpuwarden.docgen), do not edit by hand -->
    ...
    <!-- end generated: NAME -->

It lives in the umbrella package because it imports every service's settings class (the
shared package imports no service).
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
import tempfile
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path, PurePath
from typing import Any

from pydantic import AliasChoices, BaseModel, SecretStr
from pydantic.fields import FieldInfo

from gpuwarden.shared.settings import BusSettings, ServiceSettings, TopicSettings
from gpuwarden.shared.topics import TOPICS

__all__ = [
    "SERVICES",
    "ServiceDoc",
    "blocks",
    "default_text",
    "env_names",
    "generate",
    "main",
    "replace_block",
    "settings_class",
    "settings_rows",
    "settings_table",
    "topics_table",
]

#: Where the generated blocks live, relative to the repository root.
ARCHITECTURE = Path("docs/architecture.md")


@dataclass(frozen=True)
class ServiceDoc:
    """One service: its README (relative to the repository root), the settings class as
    ``module:Class`` candidates (the first that imports wins) and the shared base whose
    fields the README leaves to docs/architecture.md."""

    name: str
    readme: str
    settings: tuple[str, ...]
    base: type[BusSettings] = ServiceSettings


SERVICES: tuple[ServiceDoc, ...] = (
    ServiceDoc("collector", "services/collector/README.md", ("gpuwarden.collector.settings:CollectorSettings",)),
    ServiceDoc(
        "slurm-watcher", "services/slurm-watcher/README.md", ("gpuwarden.slurm_watcher.settings:SlurmWatcherSettings",)
    ),
    ServiceDoc("correlator", "services/correlator/README.md", ("gpuwarden.correlator.settings:CorrelatorSettings",)),
    ServiceDoc("detector", "services/detector/README.md", ("gpuwarden.detector.settings:DetectorSettings",)),
    ServiceDoc("otlp-bridge", "services/otlp-bridge/README.md", ("gpuwarden.otlp_bridge.settings:OtlpBridgeSettings",)),
    ServiceDoc("remediator", "services/remediator/README.md", ("gpuwarden.remediator.settings:RemediatorSettings",)),
    ServiceDoc(
        "health-check",
        "services/health-check/README.md",
        ("gpuwarden.health_check.settings:HealthCheckSettings",),
        base=BusSettings,
    ),
    ServiceDoc("console", "services/console/README.md", ("gpuwarden.console.settings:ConsoleSettings",)),
)

_BEGIN = "<!-- generated: {name} (python -m gpuwarden.docgen), do not edit by hand -->"
_END = "<!-- end generated: {name} -->"
_BLOCK = re.compile(r"<!-- generated: (?P<name>[\w:.-]+) \(python -m gpuwarden\.docgen\), do not edit by hand -->")


def settings_class(service: ServiceDoc) -> type[BusSettings]:
    """The settings class of ``service``: the first of its ``module:Class`` candidates that imports.

    Raises:
        ImportError: none of the candidates imports.
    """
    errors = []
    for spec in service.settings:
        module, _, name = spec.partition(":")
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:
            errors.append(f"{spec}: {exc}")
            continue
        if not (isinstance(cls, type) and issubclass(cls, BusSettings)):
            raise ImportError(f"{spec} is not a settings class (a BusSettings subclass)")
        return cls
    raise ImportError(f"no settings class for {service.name}: {'; '.join(errors)}")


def env_names(cls: type[BaseModel], name: str, info: FieldInfo) -> list[str]:
    """Environment variables a field reads, in priority order: its ``validation_alias``
    choices, else ``env_prefix + NAME`` (upper case)."""
    alias = info.validation_alias
    if isinstance(alias, AliasChoices):
        return [str(c) for c in alias.choices]
    if isinstance(alias, str):
        return [alias]
    prefix = str(cls.model_config.get("env_prefix", ""))
    return [f"{prefix}{name}".upper()]


def default_text(name: str, info: FieldInfo) -> str:
    """A field's default as the table shows it: ``doc_default`` of its ``json_schema_extra``
    when given (defaults computed at start-up, e.g. the host name), "unset" for None, "empty"
    for "", ``true``/``false``, numbers without a needless ``.0``, a path under the system
    temp folder as ``$TMPDIR/...``.

    Raises:
        ValueError: a ``default_factory`` without a ``doc_default`` (the table would show
            this machine's value).
    """
    extra = info.json_schema_extra
    if isinstance(extra, dict) and isinstance(extra.get("doc_default"), str):
        return str(extra["doc_default"])
    if info.default_factory is not None:
        raise ValueError(f"{name}: a default_factory needs json_schema_extra={{'doc_default': ...}} to be documented")
    v: Any = info.default
    if v is None:
        return "unset"
    if isinstance(v, SecretStr):
        return "(secret)"
    if isinstance(v, bool):
        return f"`{str(v).lower()}`"
    if isinstance(v, Enum):
        v = v.value
    if isinstance(v, float) and v.is_integer():
        return f"`{int(v)}`"
    if isinstance(v, PurePath):
        tmp = Path(tempfile.gettempdir())
        if Path(v).is_relative_to(tmp) and tmp != Path("/"):
            return f"`$TMPDIR/{Path(v).relative_to(tmp).as_posix()}`"
        return f"`{v.as_posix()}`"
    if v == "":
        return "empty"
    return f"`{v}`"


def settings_rows(cls: type[BaseModel], base: type[BaseModel] | None = None) -> list[tuple[str, str, str]]:
    """``(variables, default, description)`` per field of ``cls`` that ``base`` lacks, in
    declaration order; ``variables`` is markdown (```NAME``` or ```NAME``` (or ```OTHER```)).

    Raises:
        ValueError: a field without a description, or a default that cannot be shown
            (see :func:`default_text`).
    """
    skip = set(base.model_fields) if base is not None else set()
    rows = []
    for name, info in cls.model_fields.items():
        if name in skip:
            continue
        if not (info.description or "").strip():
            raise ValueError(f"{cls.__name__}.{name} has no Field description")
        first, *rest = env_names(cls, name, info)
        var = f"`{first}`" + (f" (or {', '.join(f'`{r}`' for r in rest)})" if rest else "")
        desc = str(info.description).strip()
        if _is_secret(info.annotation):
            desc += " (secret)"
        rows.append((var, default_text(name, info), desc))
    return rows


def _is_secret(annotation: Any) -> bool:
    return annotation is SecretStr or SecretStr in typing.get_args(annotation)


def _cell(text: str, html: bool = True) -> str:
    """One table cell: one line, ``|`` escaped and, with ``html``, ``<``/``>`` (``<node>`` would be a tag)."""
    text = " ".join(text.split()).replace("|", "\\|")
    return text.replace("<", "&lt;").replace(">", "&gt;") if html else text


def settings_table(cls: type[BaseModel], base: type[BaseModel] | None = None) -> str:
    """The markdown table (variable, default, meaning) of :func:`settings_rows`.

    Raises:
        ValueError: as :func:`settings_rows`.
    """
    lines = ["| variable | default | meaning |", "|---|---|---|"]
    lines += [
        f"| {var} | {_cell(default, html=False)} | {_cell(desc)} |" for var, default, desc in settings_rows(cls, base)
    ]
    return "\n".join(lines)


def topics_table(schemas: str = "schemas") -> str:
    """The markdown table of the topic registry: topic, key, schema (a link to its JSON
    Schema in docs/schemas; ``schemas`` is that folder relative to the page), producers,
    consumers (service folders under ``services/``), the service that dead-letters its records
    outside the contract (``TopicSpec.edge``), partitions and what the topic carries."""
    lines = [
        "| topic | key | schema | producers | consumers | dead-lettered by | partitions | carries |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for spec in TOPICS.values():
        schema = f"[`{spec.model.__name__}`]({schemas}/{spec.model.__name__}.json)" if spec.model else "internal"
        prod = ", ".join(spec.producers) or "-"
        cons = ", ".join(spec.consumers) or "- (operators: `gpuwarden` has no reader)"
        if not spec.consumers:
            edge = "-"
        elif spec.edge is None:
            edge = "each reader"
        elif spec.edge == "none":
            edge = "nobody (read whole by every worker: logged, counted)"
        else:
            edge = spec.edge
        cells = [f"`{spec.name}`", spec.key, schema, prod, cons, edge, str(spec.partitions), _cell(spec.description)]
        lines.append(f"| {' | '.join(cells)} |")
    return "\n".join(lines)


def blocks() -> dict[str, dict[str, str]]:
    """``{file relative to the repository root: {block name: generated text}}``.

    Raises:
        ImportError: a service's settings class does not import.
        ValueError: a setting without a description or with an undocumentable default.
    """
    out: dict[str, dict[str, str]] = {
        ARCHITECTURE.as_posix(): {
            "topics": topics_table(),
            "settings:bus": settings_table(BusSettings),
            "settings:topics": settings_table(TopicSettings),
            "settings:service": settings_table(ServiceSettings, BusSettings),
        }
    }
    out["README.md"] = {"topics": topics_table("docs/schemas")}
    for svc in SERVICES:
        out.setdefault(svc.readme, {})["settings"] = settings_table(settings_class(svc), svc.base)
    return out


def replace_block(text: str, name: str, content: str) -> str:
    """``text`` with the block ``name`` (between its marker comments) replaced by ``content``.

    Raises:
        ValueError: the block's begin or end marker is missing or appears more than once,
            or the end comes before the begin.
    """
    begin, end = _BEGIN.format(name=name), _END.format(name=name)
    if text.count(begin) != 1 or text.count(end) != 1:
        raise ValueError(f"expected one {begin!r} and one {end!r}")
    i, j = text.index(begin) + len(begin), text.index(end)
    if j < i:
        raise ValueError(f"{end!r} comes before {begin!r}")
    return f"{text[:i]}\n{content}\n{text[j:]}"


def generate(root: Path, check: bool = False) -> list[str]:
    """Rewrite every generated block under ``root`` (the repository root); returns the files
    that changed (with ``check``, that would change: nothing is written).

    Raises:
        FileNotFoundError: a file that should hold a block is missing.
        ValueError: a marker is missing or doubled, a block in a file is unknown, or a
            setting cannot be documented (see :func:`settings_rows`).
        ImportError: a settings class does not import.
    """
    changed = []
    for rel, wanted in blocks().items():
        path = root / rel
        text = path.read_text(encoding="utf-8")
        unknown = set(_block_names(text)) - set(wanted)
        if unknown:
            raise ValueError(f"{rel}: unknown generated block(s) {sorted(unknown)}")
        new = text
        for name, content in wanted.items():
            try:
                new = replace_block(new, name, content)
            except ValueError as exc:
                raise ValueError(f"{rel}: {exc}") from None
        if new != text:
            changed.append(rel)
            if not check:
                path.write_text(new, encoding="utf-8")
    return changed


def _block_names(text: str) -> list[str]:
    return [m["name"] for m in _BLOCK.finditer(text)]


def _repo_root(start: Path) -> Path:
    for d in (start, *start.parents):
        if (d / "services").is_dir() and (d / "docs").is_dir():
            return d
    raise FileNotFoundError(f"no repository root (a folder with services/ and docs/) at or above {start}")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gpuwarden.docgen [--check] [--root DIR]``: 0 when written or current, 1
    when ``--check`` finds a stale file, 2 on an error (printed)."""
    ap = argparse.ArgumentParser(prog="python -m gpuwarden.docgen", description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a generated block is stale")
    ap.add_argument("--root", type=Path, default=None, help="repository root (default: found from the cwd)")
    args = ap.parse_args(argv)
    try:
        root = args.root or _repo_root(Path.cwd())
        changed = generate(root, check=args.check)
    except (OSError, ValueError, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.check and changed:
        print(f"out of date: {', '.join(changed)}; run: python -m gpuwarden.docgen (make docs)", file=sys.stderr)
        return 1
    print(f"{'checked' if args.check else 'wrote'}: {', '.join(changed) or 'nothing to change'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
