# Over 500 lines: one unit, the encoder and the in-place update state it keeps between exports (request
# plans, series keys, cached point bytes) change together; the transports and the exporter loop are apart.
"""The fast OTLP metric path's encoder (pure): a latest-value store snapshot as
``opentelemetry.proto`` ``ExportMetricsServiceRequest`` messages, kept between exports and
updated in place.

Why in place: a GPU's attributes only change when its job changes, yet they are most of the
bytes of a point (about 350 of 400). So the requests of the last export are kept, with, per
metric, the key of each series (the identity of the store's attribute dict, and the point's
extra attributes) and its data point message; an export whose series are those of the last
one only sets each point's ``time_unix_nano`` and value, and the transport serialises. When
the series of a metric change (a GPU appears or is lost, a job or a throttle reason changes,
the cardinality limit cuts), the point bytes of that metric's new series are encoded by the
exporter packages' ``_encode_attributes`` and protobuf (and cached), the requests are planned
again (:func:`plan_requests`), and only the requests whose plan changed are rebuilt from the
cached bytes; a kept request whose points changed in place is patched point by point. The
result is, message for message, what a fresh :class:`MetricEncoder` gives for the same store
(``tests/unit/test_otlp_bridge_inplace.py`` checks it over exports where series come, go and
change job).

Memory: the last export's messages and the point bytes stay between exports (about 2 KiB
per point: 2 GiB for 1,000 nodes x 8 H100 with 18 NVLinks, ~1 M points), the peak the
previous path reached during each export.

One file of ~520 lines: the point cache, the plan and the in-place update keep one invariant
together (the kept messages are the cached bytes of the last plan, with time and value).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from opentelemetry.exporter.otlp.proto.common._internal import _encode_attributes
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.resource.v1.resource_pb2 import Resource as PbResource
from opentelemetry.sdk.resources import Resource

from .dcgm import DCGM_METRICS, dcgm_attributes
from .metrics import (
    FAILURE_METRICS,
    GPU_METRICS,
    GPU_MULTI_METRICS,
    AttrValue,
    GpuView,
    MetricSpec,
    MultiMetricSpec,
    metric_attributes,
)
from .store import GpuEntry

__all__ = ["MetricEncoder", "count_points", "plan_requests"]

log = logging.getLogger(__name__)

Instrument = Literal["gauge", "updown", "counter"]
#: A metric's name, description, unit and instrument.
Header = tuple[str, str, str, str]
#: Points ``[start, end)`` (in series order) of one metric in one request.
Segment = tuple[Header, int, int]

_CUMULATIVE = metrics_pb2.AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
# bytes a point adds to a request beyond its cached attributes + start time: field tag and
# length (<= 4), time_unix_nano (9), as_double (9), with room to spare
_POINT_OVERHEAD = 32


def count_points(request: ExportMetricsServiceRequest) -> int:
    """Data points in an export request."""
    n = 0
    for rm in request.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                kind = m.WhichOneof("data")
                if kind:
                    n += len(getattr(m, kind).data_points)
    return n


def _header_bytes(header: Header) -> int:
    return len(header[0]) + len(header[1]) + len(header[2]) + 32


def plan_requests(
    base: int, budget: int, metrics: Iterable[tuple[Header, Sequence[bytes]]]
) -> list[tuple[Segment, ...]]:
    """The requests an export is cut into: per request, its metric segments.

    ``base``: bytes of a request without metrics (resource, scope, framing); ``budget``:
    ``max_request_bytes``; ``metrics``: in order, each header with the serialised points
    (attributes and start time, without time and value). Sizes are upper bounds (each
    point counts ``len + 32`` bytes, each metric its strings + 32), so no request is over
    ``budget`` unless one point alone is.

    A metric that fits in the room left in the current request goes there whole; one that
    fits in a request goes whole into a new one; a bigger one gets requests of its own, each
    of ``k`` points, where ``k`` is what fits when every point takes its largest point's
    size rounded up to a power of two. So the cuts move only when a metric's number of
    points (or its largest point's power of two) changes, not when a job's attributes get a
    few bytes longer: an export after such a change rebuilds the requests of that metric at
    most, not every request after it. Empty metrics are left out.
    """
    out: list[list[Segment]] = []
    room = 0  # bytes left in the last request, 0 when the next metric must start a new one
    for header, blobs in metrics:
        n = len(blobs)
        if not n:
            continue
        head = _header_bytes(header)
        total = head + sum(map(len, blobs)) + n * _POINT_OVERHEAD
        if total <= room:
            out[-1].append((header, 0, n))
            room -= total
        elif total <= budget - base:
            out.append([(header, 0, n)])
            room = budget - base - total
        else:
            slot = 1 << (max(map(len, blobs)) + _POINT_OVERHEAD - 1).bit_length()
            k = max((budget - base - head) // slot, 1)
            out.extend([(header, s, min(n, s + k))] for s in range(0, n, k))
            room = 0
    return [tuple(r) for r in out]


#: Builds a metric's point bytes (attributes + start time) from its series keys, reusing
#: those of the previous export's series that are still there.
_Build = Callable[[list[Any], "_Series | None"], list[bytes]]


@dataclass(slots=True)
class _Series:
    """One metric as last exported: its series keys (what the points' attributes are made
    of), the point bytes (one per point, before the cardinality limit) and the data point
    messages in the kept requests (one per point within the limit, in order)."""

    header: Header
    keys: list[Any]
    blobs: list[bytes]
    points: list[Any] = field(default_factory=list)


class MetricEncoder:
    """Encodes a store snapshot as OTLP ``ExportMetricsServiceRequest`` messages (pure).

    Same names, units, instruments and attributes as the SDK path (the catalog's
    ``GPU_METRICS``, ``GPU_MULTI_METRICS``, ``DCGM_METRICS`` and the failure metrics);
    cumulative temporality; ``start_time_unix_nano`` = when the encoder was created. Requests
    are cut by :func:`plan_requests` so that none is over ``max_request_bytes`` serialised
    (a collector's gRPC limit is often 4 MiB). At most ``cardinality_limit`` points per
    metric (the rest is left out and counted in ``series_over_limit``). ``gpu_metrics``: the
    single-point GPU metrics (:func:`~.metrics.gpu_metrics` of another field registry).

    ``in_place=False`` builds every export's requests anew from the cached point bytes (the
    path before in-place updates, about half the points per CPU-second; ``gpuwarden bench
    bridge`` measures both). The returned messages are the encoder's: the next :meth:`encode` updates them in place
    (see the module docstring), so send or copy them before calling it again. Not
    thread-safe (the direct exporter calls it under its lock).

    Series keys compare attribute dicts by identity (the store keeps a GPU's dict while its
    attributes are equal) and extra point attributes by value (``("crc_flit", 3)``), so a
    key given as ``True`` in one export and ``1`` in the next (equal in Python) would keep
    the first encoding; the catalog's keys are strings and NVLink numbers.

    Raises:
        ValueError: ``max_request_bytes`` under 10,000.
    """

    def __init__(
        self,
        resource: Resource,
        scope_name: str,
        scope_version: str,
        *,
        max_request_bytes: int = 4_000_000,
        cardinality_limit: int = 100_000,
        start_time_ns: int | None = None,
        naming: Literal["otel", "dcgm"] = "otel",
        in_place: bool = True,
        gpu_metrics: Sequence[MetricSpec] = GPU_METRICS,
    ) -> None:
        if max_request_bytes < 10_000:
            raise ValueError("max_request_bytes must be at least 10000")
        self.naming = naming
        self.in_place = in_place
        self.max_request_bytes = max_request_bytes
        self.cardinality_limit = cardinality_limit
        self.start_ns = start_time_ns if start_time_ns is not None else time.time_ns()
        self._resource = PbResource(attributes=_encode_attributes(resource.attributes))
        self._scope = InstrumentationScope(name=scope_name, version=scope_version)
        self._base = self._resource.ByteSize() + self._scope.ByteSize() + 32
        self.series_over_limit: dict[str, int] = {}
        by_name: dict[str, list[MetricSpec]] = {}
        for spec in gpu_metrics:  # rows may share one OTel name (hw.temperature)
            by_name.setdefault(spec.otel_name, []).append(spec)
        self._by_name = [(name, tuple(specs)) for name, specs in by_name.items()]
        gpu_names = [d.name for d in DCGM_METRICS] if naming == "dcgm" else [
            *by_name, *(m.otel_name for m in GPU_MULTI_METRICS)]  # fmt: skip
        self._names = [*gpu_names, FAILURE_METRICS["failures"].name, FAILURE_METRICS["failure_open"].name]
        self._series: dict[str, _Series] = {}
        self._plan: dict[tuple[Segment, ...], ExportMetricsServiceRequest] = {}
        self._requests: list[tuple[ExportMetricsServiceRequest, int]] = []
        self._dcgm_memo: dict[int, tuple[object, bytes]] = {}
        #: this export's encodings of a GPU's own attributes (``id`` of its dict -> dict, bytes)
        self._gpu_memo: dict[int, tuple[object, bytes]] = {}
        self._extra_memo: dict[tuple[object, ...], bytes] = {}

    def _point_bytes(self, attrs: Mapping[str, AttrValue]) -> bytes:
        point = metrics_pb2.NumberDataPoint(attributes=_encode_attributes(attrs), start_time_unix_nano=self.start_ns)
        data: bytes = point.SerializeToString()
        return data

    def _gpu_point_bytes(self, a: Mapping[str, AttrValue], extra: Mapping[str, AttrValue]) -> bytes:
        """``_point_bytes({**a, **extra})``, from the GPU's attributes encoded once per export
        and the extra ones encoded once: the two are merged and serialised by protobuf (an
        ``extra`` key that ``a`` has too takes the long way, keeping ``a``'s order)."""
        if not extra:
            return self._gpu_bytes(a)
        if not extra.keys().isdisjoint(a):
            return self._point_bytes({**a, **extra})
        key = tuple((k, type(v), v if not isinstance(v, list) else tuple(v)) for k, v in extra.items())
        tail = self._extra_memo.get(key)
        if tail is None:
            tail = self._extra_memo[key] = metrics_pb2.NumberDataPoint(
                attributes=_encode_attributes(extra)
            ).SerializeToString()
        point = metrics_pb2.NumberDataPoint()
        point.MergeFromString(self._gpu_bytes(a))
        point.MergeFromString(tail)
        data: bytes = point.SerializeToString()
        return data

    def _gpu_bytes(self, a: Mapping[str, AttrValue]) -> bytes:
        hit = self._gpu_memo.get(id(a))
        if hit is None or hit[0] is not a:
            hit = self._gpu_memo[id(a)] = (a, self._point_bytes(a))
        return hit[1]

    def _spec_bytes(self, spec: MetricSpec, a: Mapping[str, AttrValue]) -> bytes:
        if spec.sensor is not None:  # a sensor's hw.id, hw.type and hw.name replace the GPU's
            return self._point_bytes(metric_attributes(spec, a))
        return self._gpu_point_bytes(a, spec.extra_attributes)

    # -- what each metric holds now: (header, series keys, values, how to build its bytes) --

    def _collect(
        self,
        views: Sequence[tuple[GpuEntry, GpuView]],
        failure_counts: Mapping[tuple[str, str, str], int],
        open_failures: Sequence[tuple[Mapping[str, AttrValue], int]],
        descriptions: Mapping[str, str],
    ) -> list[tuple[Header, list[Any], list[float], _Build]]:
        out: list[tuple[Header, list[Any], list[float], _Build]] = []
        keys: list[Any]
        vals: list[float]
        if self.naming == "dcgm":
            for d in DCGM_METRICS:
                keys, vals = [], []
                dcgm_value = d.value
                for e, view in views:
                    dv = dcgm_value(view)
                    if dv is not None:
                        keys.append(e.attributes)
                        vals.append(float(dv))
                if vals:
                    out.append(((d.name, d.help, "", d.kind), keys, vals, self._dcgm_blobs))
        else:
            for name, specs in self._by_name:
                keys, vals = [], []
                for spec in specs:  # keys: the spec's key, then the attribute dict of each point
                    keys.append(spec.key)
                    value = spec.value
                    for e, _ in views:
                        v = value(e.gpu)
                        if v is not None:
                            keys.append(e.attributes)
                            vals.append(v)
                if vals:
                    first = specs[0]
                    header = (name, descriptions.get(name, first.description), first.otel_unit, first.otel_kind)
                    out.append((header, keys, vals, self._single_builder(specs)))
            for multi in GPU_MULTI_METRICS:
                keys, vals = [], []
                points = multi.points
                for e, view in views:  # keys: per GPU with points, its dict and its points' keys
                    pts = points(view)
                    if pts:
                        vks, vs = zip(*pts, strict=True)
                        keys.append(e.attributes)
                        keys.append(vks)
                        vals.extend(vs)
                if vals:
                    header = (multi.otel_name, multi.description, multi.otel_unit, multi.otel_kind)
                    out.append((header, keys, vals, self._multi_builder(multi)))
        fm, fo = FAILURE_METRICS["failures"], FAILURE_METRICS["failure_open"]
        if failure_counts:
            out.append(((fm.name, fm.metric_description, fm.unit, fm.instrument), list(failure_counts),
                        [float(n) for n in failure_counts.values()], self._failure_blobs))  # fmt: skip
        if open_failures:
            blobs = [self._point_bytes(attrs) for attrs, _ in open_failures]  # few: keyed by their bytes
            out.append(((fo.name, fo.metric_description, fo.unit, fo.instrument), blobs,
                        [float(n) for _, n in open_failures], lambda keys, _: keys))  # fmt: skip
        return out

    # Builders: where a metric keeps its number of keys (a job changed, a throttle reason came:
    # the common changes) its keys are compared position by position and only the changed
    # positions are encoded; otherwise (a GPU came or went) the previous bytes are found by key.

    def _single_builder(self, specs: Sequence[MetricSpec]) -> _Build:
        by_key = {s.key: s for s in specs}

        def positional(keys: list[Any], prev: _Series) -> list[bytes] | None:
            out: list[bytes] = []
            blobs, j, spec = prev.blobs, 0, specs[0]
            for k, pk in zip(keys, prev.keys, strict=True):
                if k is pk:
                    if type(k) is str:
                        spec = by_key[k]
                    else:
                        out.append(blobs[j])
                        j += 1
                elif type(k) is str or type(pk) is str:
                    return None  # a spec's points moved: not position for position
                else:
                    out.append(self._spec_bytes(spec, k))
                    j += 1
            return out

        def build(keys: list[Any], prev: _Series | None) -> list[bytes]:
            if prev is not None and len(prev.keys) == len(keys) and (same := positional(keys, prev)) is not None:
                return same
            old: dict[tuple[str, int], tuple[object, bytes]] = {}
            if prev is not None:
                blobs, skey = iter(prev.blobs), ""
                for k in prev.keys:
                    if type(k) is str:
                        skey = k
                    else:
                        old[(skey, id(k))] = (k, next(blobs))
            out: list[bytes] = []
            spec = specs[0]
            for k in keys:
                if type(k) is str:
                    spec = by_key[k]
                    continue
                hit = old.get((spec.key, id(k)))
                out.append(hit[1] if hit is not None and hit[0] is k else self._spec_bytes(spec, k))
            return out

        return build

    def _multi_builder(self, multi: MultiMetricSpec) -> _Build:
        names = multi.otel_keys

        def encode(a: Mapping[str, AttrValue], vks: tuple[Any, ...]) -> Iterable[bytes]:
            return (self._gpu_point_bytes(a, dict(zip(names, vk, strict=True))) for vk in vks)

        def build(keys: list[Any], prev: _Series | None) -> list[bytes]:
            out: list[bytes] = []
            if prev is not None and len(prev.keys) == len(keys):  # as many GPUs with points
                pk, at = prev.keys, 0
                for i in range(0, len(keys), 2):
                    a, vks, n = keys[i], keys[i + 1], len(pk[i + 1])
                    if a is pk[i] and vks == pk[i + 1]:
                        out.extend(prev.blobs[at : at + n])
                    else:
                        out.extend(encode(a, vks))
                    at += n
                return out
            old: dict[int, tuple[object, tuple[Any, ...], int]] = {}
            if prev is not None:
                at = 0
                for i in range(0, len(prev.keys), 2):
                    a, vks = prev.keys[i], prev.keys[i + 1]
                    old[id(a)] = (a, vks, at)
                    at += len(vks)
            for i in range(0, len(keys), 2):
                a, vks = keys[i], keys[i + 1]
                hit = old.get(id(a))
                if prev is not None and hit is not None and hit[0] is a and hit[1] == vks:
                    out.extend(prev.blobs[hit[2] : hit[2] + len(vks)])
                else:
                    out.extend(encode(a, vks))
            return out

        return build

    def _dcgm_blobs(self, keys: list[Any], prev: _Series | None) -> list[bytes]:
        memo = self._dcgm_memo  # this export's new encodings: every dcgm metric of a GPU has its attributes

        def encoded(a: Any) -> bytes:
            hit = memo.get(id(a))
            if hit is None or hit[0] is not a:
                hit = memo[id(a)] = (a, self._point_bytes(dcgm_attributes(a)))
            return hit[1]

        if prev is not None and len(prev.keys) == len(keys):
            return [b if a is pa else encoded(a) for a, pa, b in zip(keys, prev.keys, prev.blobs, strict=True)]
        old = {id(a): (a, b) for a, b in zip(prev.keys, prev.blobs, strict=True)} if prev is not None else {}
        out: list[bytes] = []
        for a in keys:
            hit = old.get(id(a))
            out.append(hit[1] if hit is not None and hit[0] is a else encoded(a))
        return out

    def _failure_blobs(self, keys: list[Any], prev: _Series | None) -> list[bytes]:
        old = dict(zip(prev.keys, prev.blobs, strict=True)) if prev is not None else {}
        return [old.get(k) or self._point_bytes({"gpuwarden.failure.pattern": k[0], "gpuwarden.failure.severity": k[1],
                                                 "host.name": k[2]}) for k in keys]  # fmt: skip

    # -- the export ---------------------------------------------------------------------

    def encode(
        self,
        views: Sequence[tuple[GpuEntry, GpuView]],
        failure_counts: Mapping[tuple[str, str, str], int] | None = None,
        open_failures: Sequence[tuple[Mapping[str, AttrValue], int]] = (),
        time_ns: int | None = None,
        descriptions: Mapping[str, str] | None = None,
    ) -> tuple[list[tuple[ExportMetricsServiceRequest, int]], int]:
        """Requests (each with its number of data points) and the total points.

        ``views``: the store's GPU entries with their views; ``failure_counts``: episodes per
        (pattern, severity, node); ``open_failures``: attributes and count of each open
        failure group; ``time_ns``: the points' time (default now); ``descriptions``: OTel
        name -> description for names several catalog rows share. The messages are updated
        in place by the next call.
        """
        now = time_ns if time_ns is not None else time.time_ns()
        limit = self.cardinality_limit
        prev_series, series = self._series, {}
        values: dict[str, list[float]] = {}
        self.series_over_limit = dict.fromkeys(self._names, 0)
        self._dcgm_memo = {}
        self._gpu_memo, self._extra_memo = {}, {}
        same = True
        for header, keys, vals, build in self._collect(views, failure_counts or {}, open_failures, descriptions or {}):
            name = header[0]
            prev = prev_series.get(name)
            if prev is not None and prev.keys == keys:
                blobs = prev.blobs
                same = same and prev.header == header
            else:
                blobs, same = build(keys, prev), False
            over = len(vals) - limit
            if over > 0:
                self.series_over_limit[name] = over
                log.warning("%s: %d series over the cardinality limit %d left out", name, over, limit)
                vals = vals[:limit]
            series[name] = _Series(header, keys, blobs, prev.points if prev is not None else [])
            values[name] = vals
        self._dcgm_memo, self._gpu_memo, self._extra_memo = {}, {}, {}
        if not self.in_place:
            self._plan, same = {}, False
        try:
            if not same or len(series) != len(prev_series):
                self._replan(series, prev_series)
            for name, s in series.items():
                for p, v in zip(s.points, values[name], strict=True):
                    p.time_unix_nano = now
                    p.as_double = v
        except BaseException:  # kept messages half updated: the next export builds them anew
            self._series, self._plan, self._requests = {}, {}, []
            raise
        self._series = series
        return list(self._requests), sum(n for _, n in self._requests)

    def _replan(self, series: dict[str, _Series], prev_series: dict[str, _Series]) -> None:
        """Cut the requests again; keep those whose cut is the same (patching their points
        whose bytes changed), build the others from the point bytes."""
        limit = self.cardinality_limit
        shown = {name: s.blobs if len(s.blobs) <= limit else s.blobs[:limit] for name, s in series.items()}
        plan = plan_requests(self._base, self.max_request_bytes, ((s.header, shown[n]) for n, s in series.items()))
        points: dict[str, list[Any]] = {name: [] for name in series}
        kept, requests = {}, []
        for segs in plan:
            req = self._plan.get(segs)
            if req is not None:
                for header, start, end in segs:
                    name = header[0]
                    pts = series[name].points[start:end]
                    old, new = prev_series[name].blobs, shown[name]
                    if old is not new and old[start:end] != new[start:end]:
                        for p, ob, nb in zip(pts, old[start:end], new[start:end], strict=True):
                            if ob is not nb and ob != nb:
                                p.Clear()
                                p.MergeFromString(nb)
                    points[name].extend(pts)
            else:
                req = self._build_request(segs, shown, points)
            kept[segs] = req
            requests.append((req, sum(end - start for _, start, end in segs)))
        for name, s in series.items():
            s.points = points[name]
        self._plan, self._requests = kept, requests

    def _build_request(
        self, segs: tuple[Segment, ...], shown: Mapping[str, list[bytes]], points: dict[str, list[Any]]
    ) -> ExportMetricsServiceRequest:
        req = ExportMetricsServiceRequest()
        rm = req.resource_metrics.add()
        rm.resource.CopyFrom(self._resource)
        sm = rm.scope_metrics.add()
        sm.scope.CopyFrom(self._scope)
        for (name, description, unit, kind), start, end in segs:
            m = sm.metrics.add(name=name, description=description, unit=unit)
            if kind == "gauge":
                data_points = m.gauge.data_points
            else:
                m.sum.aggregation_temporality = _CUMULATIVE
                m.sum.is_monotonic = kind == "counter"
                data_points = m.sum.data_points
            add, out = data_points.add, points[name]
            for b in shown[name][start:end]:
                p = add()
                p.MergeFromString(b)
                out.append(p)
        return req
