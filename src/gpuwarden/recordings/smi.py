"""Series of ``nvidia-smi -q -x`` and ``nvidia-smi -q`` reports (``-l N`` or a loop appending to a
file). Pure: the reports are read by :func:`~gpuwarden.shared.nvidia.smi_xml.parse_nvidia_smi_xml`
and :func:`~gpuwarden.shared.nvidia.smi_text.parse_nvidia_smi_q`."""

from __future__ import annotations

import re
from collections.abc import Iterator

from gpuwarden.shared.nvidia.smi_text import SmiError, parse_nvidia_smi_q
from gpuwarden.shared.nvidia.smi_xml import SmiReport, parse_nvidia_smi_xml

from ._core import ReadContext, Reading, TimeParser

__all__ = ["read_smi_q", "read_smi_xml", "report_readings"]

_XML_SPLIT = re.compile(r"(?=<\?xml)")
_Q_SPLIT = re.compile(r"(?=^==============NVSMI LOG==============)", re.MULTILINE)


def report_readings(rep: SmiReport, ctx: ReadContext, where: str, tp: TimeParser) -> Iterator[Reading]:
    """One reading per GPU of a report, at the report's ``Timestamp`` (ctime, in ``ctx.tz``).

    Raises:
        ValueError: the report has no readable timestamp.
    """
    if rep.timestamp is None:
        raise ValueError(f"{where}: report without a timestamp")
    try:
        ts = tp.parse(rep.timestamp)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from exc
    for g in rep.gpus:
        vals = g.model_dump(exclude_none=True, exclude={"index"})
        if not vals.get("throttle_reasons"):
            vals.pop("throttle_reasons", None)
        if rep.driver_version:
            vals["driver_version"] = rep.driver_version
        if rep.cuda_version:
            vals["cuda_version"] = rep.cuda_version
        ctx.rows += 1
        yield ts, g.index, vals


def read_smi_xml(text: str, ctx: ReadContext) -> Iterator[Reading]:
    """Readings of concatenated ``nvidia-smi -q -x`` documents (DTD v11 .. v13), each at its
    ``<timestamp>``. A truncated last document is skipped with a note.

    Raises:
        ValueError: a malformed document other than the last.
    """
    docs = [d for d in _XML_SPLIT.split(text) if d.strip()]
    tp = TimeParser(ctx.tz)
    for i, doc in enumerate(docs, start=1):
        try:
            rep = parse_nvidia_smi_xml(doc.strip())
        except ValueError as exc:
            if i == len(docs) and i > 1:
                ctx.note(f"last XML document ({i}) truncated, skipped ({exc})")
                return
            raise ValueError(f"{ctx.file}: XML document {i}: {exc}") from exc
        yield from report_readings(rep, ctx, f"{ctx.file}: XML document {i}", tp)


def read_smi_q(text: str, ctx: ReadContext) -> Iterator[Reading]:
    """Readings of concatenated ``nvidia-smi -q`` reports (drivers 535 .. 560), each at its
    ``Timestamp`` line.

    Raises:
        ValueError: a report nvidia-smi replaced by an error, or without a timestamp.
    """
    docs = [d for d in _Q_SPLIT.split(text) if "NVSMI LOG" in d]
    tp = TimeParser(ctx.tz)
    for i, doc in enumerate(docs, start=1):
        rep = parse_nvidia_smi_q(doc)
        if isinstance(rep, SmiError):
            raise ValueError(f"{ctx.file}: report {i}: nvidia-smi error: {rep.message}")
        yield from report_readings(rep, ctx, f"{ctx.file}: report {i}", tp)
