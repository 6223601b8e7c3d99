"""``gpuwarden report JOB_ID``: a job's verdict in the terminal, as JSON or as Markdown.

From a file (``--file``: a ``simulate``/``analyze`` report with ``job_reports``, one JobReport,
or JSON lines of them) or from the topics: the latest ``job.reports`` message of the job, or
(``--rebuild``, or when none was published) a report built here from ``slurm.jobs``,
``job.windows`` and ``failures``.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from pydantic import ValidationError
from rich.console import Console

from gpuwarden.shared.models import Failure, JobReport, JobState, JobWindow

from .jobreport import build_job_report
from .reportview import render_markdown, render_terminal

__all__ = ["load_report_file", "read_topics", "report"]

err = Console(stderr=True, emoji=False, highlight=False)


def load_report_file(path: Path, job_id: str) -> JobReport | None:
    """The report of ``job_id`` in a file: a run report (``job_reports`` list), one JobReport, or
    JSON lines of JobReports (the last one of the job wins).

    Raises:
        OSError: unreadable file.
        ValueError: not JSON, or a report that does not match the JobReport schema.
    """
    text = path.read_bytes()
    docs: list[Any]
    try:
        docs = [orjson.loads(text)]
    except orjson.JSONDecodeError:
        try:
            docs = [orjson.loads(line) for line in text.splitlines() if line.strip()]
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"{path}: not JSON or JSON lines: {exc}") from exc
    found: JobReport | None = None
    for d in docs:
        rows = d.get("job_reports", []) if isinstance(d, dict) and "job_reports" in d else [d]
        for row in rows:
            if isinstance(row, dict) and str(row.get("job_id")) == job_id:
                try:
                    found = JobReport.model_validate(row)
                except ValidationError as exc:
                    raise ValueError(f"{path}: the report of job {job_id} is invalid: {exc}") from exc
    return found


async def read_topics(
    bootstrap: str,
    prefix: str,
    job_id: str,
    rebuild: bool,
    price: float,
    timeout_s: float = 20.0,
    kafka: dict[str, Any] | None = None,
) -> JobReport | None:
    """The job's latest published report, else (or with ``rebuild``) one built from its Slurm
    state, windows and failures on the topics; None when the topics know nothing of the job.
    ``kafka``: the client's security settings (``BusSettings.kafka_kwargs()``; SASL/TLS as the
    services use them), with ``bootstrap`` as its servers.

    Raises:
        aiokafka.errors.KafkaError: the broker is unreachable.
    """
    from aiokafka import TopicPartition

    from gpuwarden.shared.bus import decode, kafka_consumer

    names = ["job.reports", "slurm.jobs", "job.windows", "failures"] if rebuild else ["job.reports"]
    c = kafka_consumer({**(kafka or {}), "bootstrap_servers": bootstrap}, group_id=None, enable_auto_commit=False)
    await c.start()
    latest: JobReport | None = None
    state: JobState | None = None
    windows: list[JobWindow] = []
    failures: list[Failure] = []
    key = job_id.encode()
    try:
        parts = []
        for n in names:
            ps = c.partitions_for_topic(f"{prefix}{n}") or set()
            if not ps:
                await c.topics()  # refresh metadata once
                ps = c.partitions_for_topic(f"{prefix}{n}") or set()
            parts += [TopicPartition(f"{prefix}{n}", p) for p in ps]
        if not parts:
            return None
        c.assign(parts)
        await c.seek_to_beginning(*parts)
        ends = await c.end_offsets(parts)
        todo = {tp for tp in parts if ends[tp] > 0}
        deadline = time.monotonic() + timeout_s
        while todo and time.monotonic() < deadline:
            batches = await c.getmany(*todo, timeout_ms=500, max_records=5000)
            for tp, recs in batches.items():
                short = tp.topic.removeprefix(prefix)
                for r in recs:
                    if short != "failures" and r.key != key:
                        continue
                    try:
                        v = decode(short, r.value)
                    except (ValueError, ValidationError):
                        continue
                    if isinstance(v, JobReport) and (latest is None or v.as_of >= latest.as_of):
                        latest = v
                    elif isinstance(v, JobState) and (state is None or v.ts >= state.ts):
                        state = v
                    elif isinstance(v, JobWindow):
                        windows.append(v)
                    elif isinstance(v, Failure) and v.job_id == job_id:
                        failures.append(v)
                if recs and recs[-1].offset + 1 >= ends[tp]:
                    todo.discard(tp)
    finally:
        await c.stop()
    if rebuild and (state is not None or windows):
        if state is None:
            from .jobreport import JobReporter

            rep = JobReporter(price)
            for w in windows:
                rep.observe(w)
            for f in failures:
                rep.observe(f)
            return rep.report(job_id)
        return build_job_report(state, windows, failures, price)
    return latest


def report(
    job_id: Annotated[str, typer.Argument(help="Slurm job id")],
    file: Annotated[
        Path | None, typer.Option("--file", "-f", help="Read a report file (simulate/analyze --report) instead")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the JobReport as JSON")] = False,
    markdown: Annotated[bool, typer.Option("--markdown", help="Print Markdown")] = False,
    rebuild: Annotated[
        bool, typer.Option(help="Build the report from slurm.jobs, job.windows and failures instead of job.reports")
    ] = False,
    bootstrap_servers: Annotated[
        str | None, typer.Option(help="Kafka host:port (default GPUWARDEN_BOOTSTRAP_SERVERS)")
    ] = None,
    prefix: Annotated[str | None, typer.Option(help="Topic prefix (default GPUWARDEN_TOPIC_PREFIX)")] = None,
    price: Annotated[
        float, typer.Option(min=0, help="USD per GPU-hour for a rebuilt report (published ones carry theirs)")
    ] = 3.26,
    timeout: Annotated[float, typer.Option(min=1, help="Seconds to read the topics")] = 20.0,
) -> None:
    """Print a job's verdict: where its GPU-hours went, why, what it cost, what to do.

    Exit status: 0 printed, 1 no report of that job, 2 unreadable file or unreachable Kafka.
    """
    if as_json and markdown:
        err.print("[red]error:[/] --json and --markdown exclude each other")
        raise typer.Exit(2)
    rep: JobReport | None
    if file is not None:
        try:
            rep = load_report_file(file, job_id)
        except (OSError, ValueError) as exc:
            err.print(f"[red]error:[/] {exc}", soft_wrap=True)
            raise typer.Exit(2) from exc
        where = str(file)
    else:
        from aiokafka.errors import KafkaError

        from gpuwarden.shared.settings import BusSettings

        s = BusSettings()
        bs, pf = bootstrap_servers or s.bootstrap_servers, prefix if prefix is not None else s.topic_prefix
        try:
            kw = s.kafka_kwargs()  # the same SASL/TLS settings as the services (GPUWARDEN_SECURITY_*...)
            rep = asyncio.run(read_topics(bs, pf, job_id, rebuild, price, timeout, kw))
            if rep is None and not rebuild:  # nothing published yet: build it from the topics
                rep = asyncio.run(read_topics(bs, pf, job_id, True, price, timeout, kw))
        except (KafkaError, OSError) as exc:
            err.print(f"[red]error:[/] cannot read the topics on {bs}: {exc}")
            raise typer.Exit(2) from exc
        where = f"the topics on {bs} (prefix {pf!r})"
    if rep is None:
        err.print(f"no report of job {job_id} in {where}")
        raise typer.Exit(1)
    if as_json:
        sys.stdout.buffer.write(orjson.dumps(rep.model_dump(mode="json"), option=orjson.OPT_INDENT_2) + b"\n")
    elif markdown:
        sys.stdout.write(render_markdown(rep))
    else:
        Console(emoji=False, highlight=False).print(render_terminal(rep))
