"""The umbrella ``gpuwarden`` command (typer + rich).

Built-in commands: ``topics``, ``schemas``, ``parse``, ``bench``. Each installed
service adds its own command through the ``gpuwarden.commands`` entry-point group, so a GPU
node with only ``gpuwarden-collector`` installed gets ``gpuwarden collector`` and nothing
else; the ``gpuwarden`` umbrella package adds ``demo``, ``simulate``, ``analyze`` and
``broker`` (the embedded Tansu broker, :mod:`gpuwarden.sim.cli`). Parsers register in
``gpuwarden.parsers`` (name -> ``fn(text) -> JSON-able``, shown as ``gpuwarden parse NAME
FILE``) and benchmarks in ``gpuwarden.bench`` (name -> a typer command function, shown as
``gpuwarden bench NAME``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sys
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Column, Table
from rich.text import Text

from .clihelp import help_markup
from .settings import BusSettings

if TYPE_CHECKING:
    from .settings import TopicSettings

_S = TypeVar("_S")

__all__ = ["app", "load_plugins", "main"]

console = Console(stderr=True)
app = typer.Typer(
    rich_markup_mode=help_markup(),
    name="gpuwarden",
    help="GPU cluster health monitoring, failure diagnosis and remediation for Slurm.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
topics_app = typer.Typer(rich_markup_mode=help_markup(), help="Kafka topics of gpuwarden.", no_args_is_help=True)
app.add_typer(topics_app, name="topics")


def versions() -> dict[str, str]:
    """``{distribution: version}`` of every installed ``gpuwarden`` / ``gpuwarden-*`` package."""
    from importlib.metadata import distributions

    out = {}
    for d in distributions():
        name = (d.metadata["Name"] or "").lower()
        if name == "gpuwarden" or name.startswith("gpuwarden-"):
            out[name] = d.version
    return dict(sorted(out.items()))


def _version(value: bool) -> None:
    if value:
        vs = versions()
        typer.echo(" ".join(f"{k} {v}" for k, v in vs.items()) or "gpuwarden (not installed as a package)")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the installed packages' versions"),
    ] = False,
) -> None:
    """GPU cluster health monitoring, failure diagnosis and remediation for Slurm."""


def _bus_settings() -> BusSettings:
    """The bus settings, or exit 2 with one line naming what is wrong."""
    return _settings(BusSettings)


def _topic_settings() -> TopicSettings:
    """GPUWARDEN_TOPIC_PARTITIONS / GPUWARDEN_TOPIC_RETENTION_HOURS, or exit 2 with one line."""
    from .settings import TopicSettings

    return _settings(TopicSettings)


def _settings(cls: Callable[[], _S]) -> _S:
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    from .settings import SETTINGS_JSON_HINT, describe_settings_error

    try:
        return cls()
    except ValidationError as exc:
        console.print(f"[red]error:[/] {escape(describe_settings_error(exc))}", soft_wrap=True)
    except SettingsError as exc:
        console.print(
            f"[red]error:[/] invalid settings: {escape(str(exc))} ({escape(SETTINGS_JSON_HINT)})", soft_wrap=True
        )
    raise typer.Exit(2)


def _count(n: int, noun: str) -> str:
    """``1 node``, ``2 nodes``."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _check_prefix(prefix: str | None) -> None:
    """A ``--prefix`` of Kafka's topic characters (GPUWARDEN_TOPIC_PREFIX's rule), else a usage error."""
    from .settings import TOPIC_PREFIX_PATTERN

    if prefix is not None and not re.fullmatch(TOPIC_PREFIX_PATTERN, prefix):
        raise typer.BadParameter(f"{prefix!r} is not [A-Za-z0-9._-]{{0,100}} (Kafka's topic characters)",
                                 param_hint="--prefix")  # fmt: skip


@topics_app.command("create")
def topics_create(
    bootstrap_servers: Annotated[
        str | None, typer.Option(help="Kafka host:port (default GPUWARDEN_BOOTSTRAP_SERVERS)")
    ] = None,
    prefix: Annotated[
        str | None, typer.Option(help="Topic prefix (default GPUWARDEN_TOPIC_PREFIX or gpuwarden.)")
    ] = None,
    partitions: Annotated[
        int | None, typer.Option(min=1, help="Partitions of every topic (over GPUWARDEN_TOPIC_PARTITIONS)")
    ] = None,
    replication_factor: Annotated[
        int | None, typer.Option(min=1, help="Replicas per partition (default: 3 on >= 3 brokers, else one per broker)")
    ] = None,
) -> None:
    """Create every gpuwarden topic that does not exist yet (explicitly, with configs): partitions and
    retention from GPUWARDEN_TOPIC_PARTITIONS / GPUWARDEN_TOPIC_RETENTION_HOURS where they name a topic."""
    from aiokafka.errors import KafkaError

    from .topics import create_topics

    _check_prefix(prefix)
    s = _bus_settings()
    layout = _topic_settings()
    bs = bootstrap_servers or s.bootstrap_servers
    try:
        res = asyncio.run(
            create_topics(
                bs,
                prefix if prefix is not None else s.topic_prefix,
                partitions,
                replication_factor,
                client_kwargs=s.kafka_kwargs(),
                partitions_by_topic=layout.topic_partitions,
                retention_hours=layout.topic_retention_hours,
            )
        )
    except (KafkaError, OSError, RuntimeError, ValueError) as exc:
        console.print(f"[red]error:[/] cannot create topics on {bs}: {exc}")
        raise typer.Exit(2) from exc
    t = Table("topic", "result")
    for k, v in res.items():
        t.add_row(k, v)
    Console().print(t)


@topics_app.command("plan")
def topics_plan(
    nodes: Annotated[int, typer.Option(min=1, help="GPU nodes in the fleet")] = 1000,
    gpus_per_node: Annotated[int, typer.Option(min=1, max=64, help="GPUs per node")] = 8,
    interval: Annotated[
        float, typer.Option(min=0.1, help="Collector interval, s (GPUWARDEN_COLLECTOR_INTERVAL_S)")
    ] = 1.0,
    nvlink_every: Annotated[
        int,
        typer.Option(
            min=1,
            help="The collectors read NVLink counters every Nth tick (GPUWARDEN_COLLECTOR_NVLINK_EVERY; 1, every "
            "tick, is the NVML default; they are about 60 % of a sample's bytes)",
        ),
    ] = 1,
    brokers: Annotated[int, typer.Option(min=1, help="Brokers of the cluster (replicas: 3 on >= 3)")] = 3,
    prefix: Annotated[str | None, typer.Option(help="Topic prefix (default GPUWARDEN_TOPIC_PREFIX)")] = None,
    cluster: Annotated[str, typer.Option(help="Slurm cluster name of the leases (GPUWARDEN_*_CLUSTER)")] = "default",
    bootstrap_server: Annotated[str, typer.Option(help="Address written into the printed commands")] = "KAFKA:9092",
    principal_prefix: Annotated[str, typer.Option(help="Service principal = this + service name")] = "User:gpuwarden-",
    command_config: Annotated[
        str | None, typer.Option(help="--command-config file for the printed commands (the admin's client config)")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the plan as JSON instead")] = False,
) -> None:
    """Print the Kafka plan for a fleet: every topic (internal ones included) with partitions,
    replicas, min.insync.replicas, retention and the bytes per day it expects, then the
    kafka-topics.sh and kafka-acls.sh commands per service principal. Message sizes are measured
    on a simulated node of --gpus-per-node GPUs, NVLinks every --nvlink-every ticks, when the
    gpuwarden package (simulation layer) is installed, else the built-in measured figures are
    used. Partitions and retention follow GPUWARDEN_TOPIC_PARTITIONS /
    GPUWARDEN_TOPIC_RETENTION_HOURS where they name a topic. Talks to no broker."""
    import math
    import shlex
    from dataclasses import asdict

    import orjson

    from .settings import CLUSTER_NAME_PATTERN

    _check_prefix(prefix)
    if not math.isfinite(interval):
        raise typer.BadParameter(f"{interval} is not a finite number of seconds", param_hint="--interval")
    if not re.fullmatch(CLUSTER_NAME_PATTERN, cluster):
        raise typer.BadParameter(f"{cluster!r} is not [A-Za-z0-9._-]{{1,100}}", param_hint="--cluster")

    from .kafkaplan import builtin_sizes, human_bytes, kafka_acls_argv, kafka_topics_argv, plan_acls, plan_topics
    from .plugins import PluginMissing, load_plugin

    links = "NVLinks every tick" if nvlink_every == 1 else f"NVLinks every {nvlink_every} ticks"
    # without the simulation layer: the built-in 8-GPU figures, per GPU (the GPUs are nearly all of a sample)
    scale = gpus_per_node / 8
    sizes = {k: v * scale for k, v in builtin_sizes(nvlink_every).items() if k in ("gpu.samples", "gpu.attributed")}
    basis = f"built-in size of 8-GPU H100 samples x {gpus_per_node}/8 GPUs, {links}"
    ratio: float | None = None
    try:
        measure_sizes = load_plugin("gpuwarden.message_sizes", "simulated", "the simulated message sizes")
    except PluginMissing:
        measure_sizes = None  # a production install without the simulation layer: built-in sizes
    if measure_sizes is not None:
        sizes = measure_sizes(gpus_per_node, nvlink_every=nvlink_every)
        ratio = sizes.pop("gzip_ratio")
        basis = f"measured on a simulated {gpus_per_node}-GPU H100 node, {links}"
    layout = _topic_settings()
    pre = prefix if prefix is not None else _bus_settings().topic_prefix
    topics = plan_topics(nodes, gpus_per_node=gpus_per_node, interval_s=interval, prefix=pre, brokers=brokers,
                         cluster=cluster, sizes=sizes, size_basis=basis, partitions_by_topic=layout.topic_partitions,
                         retention_hours=layout.topic_retention_hours)  # fmt: skip
    acls = plan_acls(pre, cluster=cluster, principal_prefix=principal_prefix)
    extra = ["--command-config", command_config] if command_config else []
    topic_cmds = [[*c, *extra] for c in kafka_topics_argv(topics, bootstrap_server)]
    acl_cmds = [[*c, *extra] for c in kafka_acls_argv(acls, bootstrap_server)]
    if json_out:
        doc = {"inputs": {"nodes": nodes, "gpus_per_node": gpus_per_node, "interval_s": interval,
                          "nvlink_every": nvlink_every, "brokers": brokers, "prefix": pre, "cluster": cluster},
               "totals": {"bytes_per_day": sum(t.bytes_per_day for t in topics),
                          "stored_bytes": sum(t.stored_bytes for t in topics),
                          "partitions": sum(t.partitions for t in topics)},
               "topics": [asdict(t) for t in topics], "acls": [asdict(a) for a in acls], "gzip_ratio": ratio,
               "kafka_topics": topic_cmds, "kafka_acls": acl_cmds}  # fmt: skip
        sys.stdout.buffer.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")
        return
    out = Console(width=max(Console().width, 160))
    t = Table(Column("topic", overflow="fold"), "partitions", "replicas", "min.insync", "retention",
              "messages/day", "bytes/day", "stored", "created by",
              title=f"Kafka plan: {_count(nodes, 'node')} x {_count(gpus_per_node, 'GPU')} every {interval:g} s, "
              f"{links}, {_count(brokers, 'broker')}, prefix {pre or '(none)'}")  # fmt: skip
    for tp in topics:
        days = tp.retention_days
        ret = "compacted" if tp.configs.get("cleanup.policy") == "compact" else f"{days:g} d" if days else "default"
        t.add_row(Text(tp.name), str(tp.partitions), str(tp.replication_factor), str(tp.min_insync), ret,
                  f"{tp.messages_per_day:,.0f}", human_bytes(tp.bytes_per_day), human_bytes(tp.stored_bytes),
                  tp.created_by)  # fmt: skip
    out.print(t)
    day = sum(tp.bytes_per_day for tp in topics)
    held = sum(tp.stored_bytes for tp in topics)
    rf = topics[0].replication_factor
    out.print(f"total: {human_bytes(day)}/day and {human_bytes(held)} held per replica, uncompressed; "
              f"x{rf} replicas = {human_bytes(held * rf)} of broker disk", soft_wrap=True)  # fmt: skip
    if ratio:
        out.print(f"gzip of one node's 50-sample batch: x{ratio:.1f} smaller (simulated samples; larger "
                  "batches of many nodes compress better)", soft_wrap=True)  # fmt: skip
    out.print("basis (per message; bytes/day = messages/day x size):")
    for line in sorted({f"  {tp.short}: {tp.basis}" for tp in topics}):
        out.print(line, soft_wrap=True, markup=False, highlight=False)
    per_broker = sum(tp.partitions * tp.replication_factor for tp in topics) / brokers
    if per_broker > 4000:
        out.print(f"note: {per_broker:,.0f} partition replicas per broker, past the usual guidance of about "
                  "4,000: add brokers, split the fleet over several prefixes (one gpuwarden per prefix) or "
                  "raise the collector interval", soft_wrap=True, markup=False)  # fmt: skip
    if pre and pre[-1] not in ".-_":
        out.print(f"note: the prefix {pre!r} does not end in '.', '-' or '_': topics are named "
                  f"{pre}gpu.samples and so on", soft_wrap=True, markup=False)  # fmt: skip
    out.print("\n# topics (as an admin principal)")
    for c in topic_cmds:
        out.print(shlex.join(c), soft_wrap=True, markup=False, highlight=False)
    out.print("\n# ACLs: each service principal gets exactly these")
    for c in acl_cmds:
        out.print(shlex.join(c), soft_wrap=True, markup=False, highlight=False)


@topics_app.command("list")
def topics_list() -> None:
    """Print the topic registry: name, key, value model, partitions."""
    from .topics import TOPICS

    t = Table("topic", "key", "value", "partitions", "description")
    for spec in TOPICS.values():
        t.add_row(
            spec.name, spec.key, spec.model.__name__ if spec.model else "-", str(spec.partitions), spec.description
        )
    Console().print(t)


@app.command("schemas")
def schemas(
    out: Annotated[Path, typer.Option(help="Folder to write JSON Schemas into")] = Path("docs/schemas"),
    check: Annotated[bool, typer.Option(help="Fail if the files differ instead of writing")] = False,
) -> None:
    """Generate JSON Schemas of every message model (docs/schemas/<Model>.json)."""
    from .schemas import write_schemas

    try:
        changed = write_schemas(out, check=check)
    except OSError as exc:  # a folder this user may not write (an image's read-only tree), a file in the way
        console.print(f"[red]error:[/] cannot write the schemas in {escape(str(out))}: {escape(str(exc))}")
        raise typer.Exit(1) from None
    if check and changed:
        console.print(f"[red]out of date:[/] {', '.join(changed)}; run gpuwarden schemas")
        raise typer.Exit(1)
    console.print(f"{'checked' if check else 'wrote'} schemas in {out}")


parse_app = typer.Typer(
    rich_markup_mode=help_markup(),
    help="Parse a recorded tool output file and print JSON (the parsers gpuwarden itself uses). "
    "Each kind below names the tool and the versions it reads.",
    no_args_is_help=True,
)
app.add_typer(parse_app, name="parse")
bench_app = typer.Typer(rich_markup_mode=help_markup(), help="Benchmarks that print figures.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


def _parse_command(name: str, ep_value: object) -> None:
    """Register ``gpuwarden parse NAME FILE`` for a parser entry point (``text -> JSON-able``)."""

    def run(
        file: Annotated[Path, typer.Argument(help="File to parse, or - for standard input", allow_dash=True)],
    ) -> None:
        import sys

        import orjson
        from pydantic import BaseModel

        fn = ep_value.load()  # type: ignore[attr-defined]
        try:
            text = sys.stdin.read() if str(file) == "-" else file.read_text(errors="replace")
        except OSError as exc:
            console.print(f"[red]error:[/] cannot read {file}: {exc.strerror}")
            raise typer.Exit(2) from exc
        try:
            result = fn(text)
        except ValueError as exc:
            msg = str(exc)
            # parsers say "not <tool> output: why" themselves; don't say it twice
            head = f"{file}: " if msg.startswith("not ") else f"{file} is not {name} output: "
            console.print(f"[red]error:[/] {head}{msg}", soft_wrap=True)
            raise typer.Exit(1) from exc

        def default(o: object) -> object:
            if isinstance(o, BaseModel):
                return o.model_dump(mode="json")
            if hasattr(o, "__dict__"):
                return vars(o)
            raise TypeError

        opts = orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS
        sys.stdout.buffer.write(orjson.dumps(result, default=default, option=opts) + b"\n")
        if getattr(result, "error", None) is True or (isinstance(result, dict) and result.get("error") is True):
            raise typer.Exit(1)  # a typed error result (the tool reported a failure): JSON above, exit 1

    target = getattr(ep_value, "value", name)
    summary = _parser_summary(ep_value)
    run.__doc__ = f"{summary} [{target}]" if summary else f"Parse {name} output ({target})."
    parse_app.command(name, short_help=summary or None)(run)


def _parser_summary(ep_value: object) -> str:
    """First paragraph of a parser's docstring, one line: the tool and the versions it reads."""
    try:
        fn = ep_value.load()  # type: ignore[attr-defined]
    except Exception as exc:  # a broken plugin must not break `gpuwarden --help`
        logging.getLogger(__name__).warning("cannot load parser %s: %s", getattr(ep_value, "name", "?"), exc)
        return ""
    doc = " ".join((getattr(fn, "__doc__", None) or "").strip().split("\n\n", 1)[0].split())
    doc = re.sub(r":\w+:`~?([^`]+)`", r"\1", doc).replace("``", "")  # reST roles/literals -> text
    first = re.split(r"(?<=[.)])\s+(?=[A-Z])", doc, maxsplit=1)[0]
    first = first if len(first) <= 200 else first[:197].rsplit(" ", 1)[0].rstrip(",;:") + " ..."  # at a word
    return escape(first) if help_markup() else first  # rich reads [..] as markup; plain help prints it


def service_app(help: str, run_help: str, factory: Callable[[], Any]) -> typer.Typer:
    """A service's typer app: without a subcommand it runs ``factory()`` (the service, built
    with its settings) under :func:`~gpuwarden.shared.service.run_service`; subcommands are
    added to the returned app. ``factory`` should import lazily so ``--help`` stays fast."""
    full = (
        f"{help}\n\nWithout a command: {run_help} Settings: GPUWARDEN_* environment variables "
        "(its README in services/ lists them); a mistyped one of its own is named at start."
    )
    sub = typer.Typer(rich_markup_mode=help_markup(), help=full, invoke_without_command=True, no_args_is_help=False)

    def run(ctx: typer.Context) -> None:
        if ctx.invoked_subcommand is not None:
            return
        from .service import run_service

        raise typer.Exit(run_service(factory))

    run.__doc__ = run_help
    sub.callback()(run)
    return sub


def load_plugins() -> list[str]:
    """Add the commands of installed services (entry points ``gpuwarden.commands``)."""
    names: list[str] = []
    if getattr(app, "_plugins_loaded", False):
        return names
    app._plugins_loaded = True  # type: ignore[attr-defined]
    for ep in sorted(entry_points(group="gpuwarden.commands"), key=lambda e: e.name):
        try:
            sub = ep.load()
        except Exception as exc:
            logging.getLogger(__name__).warning("cannot load command %s: %s", ep.name, exc)
            continue
        if isinstance(sub, typer.Typer):
            app.add_typer(sub, name=ep.name)
        else:
            app.command(ep.name)(sub)
        names.append(ep.name)
    for ep in sorted(entry_points(group="gpuwarden.parsers"), key=lambda e: e.name):
        _parse_command(ep.name, ep)
    for ep in sorted(entry_points(group="gpuwarden.bench"), key=lambda e: e.name):
        try:
            bench_app.command(ep.name)(ep.load())
        except Exception as exc:
            logging.getLogger(__name__).warning("cannot load benchmark %s: %s", ep.name, exc)
    return names


def main() -> None:
    load_plugins()
    app()


def _dump(obj: object) -> str:
    return json.dumps(obj, indent=2, default=str)
