"""Direct OTLP metric export: the latest-value store encoded straight to OTLP protobuf bytes.

Why: profiling the SDK path (observable instruments -> ``MeterProvider`` -> OTLP exporter)
for a 1,000-node fleet shows the time goes to building an ``Observation`` and hashing a
frozenset of its attributes per point (SDK aggregation), rebuilding ``NumberDataPoint``
objects, then encoding every attribute of every point into protobuf again on each export
(``_encode_attributes``), although a GPU's attributes only change when its job changes.
Here the attributes of each (GPU, metric) are encoded once and cached by the identity of
the store's attribute dict (the store reuses the dict while the attributes are equal); a
point is then the cached bytes + three fixed64 fields. See ``gpuwarden bench bridge``.

Pure part: :class:`MetricEncoder` (snapshot -> list of ``ExportMetricsServiceRequest``
bytes, each under ``max_request_bytes``). I/O part: transports (:class:`GrpcTransport`,
:class:`HttpTransport`, injected) and :class:`DirectMetricExporter` (periodic thread,
retry with exponential backoff on retryable errors, counts of what was sent and dropped).
"""

from __future__ import annotations

import gzip
import logging
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.sdk.resources import Resource

from .mapping import (
    DCGM_METRICS,
    GPU_METRICS,
    GPU_MULTI_METRICS,
    AttrValue,
    GpuView,
    MetricSpec,
    MultiMetricSpec,
    dcgm_attributes,
    metric_attributes,
)
from .store import GpuEntry, LatestStore

__all__ = [
    "DirectMetricExporter",
    "ExportError",
    "ExportStats",
    "GrpcTransport",
    "HttpTransport",
    "MetricEncoder",
    "RetryableExportError",
    "Transport",
    "encode_attributes",
]

log = logging.getLogger(__name__)

_POINT_TAIL = 27  # start (1+8) + time (1+8) + as_double (1+8) bytes after the attributes
_D = struct.Struct("<d").pack
_Q = struct.Struct("<Q").pack


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _varint((tag << 3) | 2) + _varint(len(payload)) + payload


def _any_value(v: AttrValue) -> common_pb2.AnyValue:
    if isinstance(v, bool):
        return common_pb2.AnyValue(bool_value=v)
    if isinstance(v, int):
        return common_pb2.AnyValue(int_value=v)
    if isinstance(v, float):
        return common_pb2.AnyValue(double_value=v)
    if isinstance(v, str):
        return common_pb2.AnyValue(string_value=v)
    if isinstance(v, list):
        return common_pb2.AnyValue(array_value=common_pb2.ArrayValue(values=[_any_value(x) for x in v]))
    raise TypeError(f"unsupported attribute value {v!r}")


def encode_attributes(attrs: Mapping[str, AttrValue], tag: int) -> bytes:
    """``attrs`` as repeated ``KeyValue`` fields number ``tag`` (protobuf bytes)."""
    return b"".join(_field(tag, common_pb2.KeyValue(key=k, value=_any_value(v)).SerializeToString())
                    for k, v in attrs.items())  # fmt: skip


@dataclass
class ExportStats:
    """What the direct exporter did (monotonic counts since start; points, requests)."""

    points_exported: int = 0
    points_dropped: int = 0
    requests_sent: int = 0
    requests_failed: int = 0
    retries: int = 0
    last_export_points: int = 0
    last_error: str = ""


Instrument = Literal["gauge", "updown", "counter"]


@dataclass
class _Metric:
    header: bytes  # name, description, unit
    kind: Instrument
    points: list[bytes] = field(default_factory=list)

    def wrap(self, points: Iterable[bytes]) -> bytes:
        body = b"".join(points)
        if self.kind == "gauge":
            return _field(2, self.header + _field(5, body))
        monotonic = b"\x18\x01" if self.kind == "counter" else b""
        return _field(2, self.header + _field(7, body + b"\x10\x02" + monotonic))


class MetricEncoder:
    """Encodes a store snapshot as OTLP ``ExportMetricsServiceRequest`` bytes (pure).

    Same names, units, instruments and attributes as the SDK path (``GPU_METRICS``,
    ``GPU_MULTI_METRICS``, ``gpuwarden.failures``, ``gpuwarden.failure.open``); cumulative
    temporality; ``start_time_unix_nano`` = when the encoder was created. Requests are split
    so that none is over ``max_request_bytes`` (a collector's gRPC limit is often 4 MiB).
    Only attribute sets seen in the last call stay cached (bounded memory).
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
    ) -> None:
        self.naming = naming
        if max_request_bytes < 10_000:
            raise ValueError("max_request_bytes must be at least 10000")
        self.max_request_bytes = max_request_bytes
        self.cardinality_limit = cardinality_limit
        self.start_ns = start_time_ns if start_time_ns is not None else time.time_ns()
        res = encode_attributes({k: v for k, v in resource.attributes.items()}, 1)  # type: ignore[misc]
        scope = _field(1, scope_name.encode()) + _field(2, scope_version.encode())
        self._prefix_resource = _field(1, res)
        self._prefix_scope = _field(1, scope)
        self._cache: dict[tuple[int, str], tuple[object, bytes]] = {}
        self.series_over_limit: dict[str, int] = {}
        self._headers: dict[str, bytes] = {}

    def _header(self, name: str, description: str, unit: str) -> bytes:
        h = self._headers.get(name)
        if h is None:
            h = _field(1, name.encode()) + _field(2, description.encode()) + _field(3, unit.encode())
            self._headers[name] = h
        return h

    def encode(
        self,
        views: Sequence[tuple[GpuEntry, GpuView]],
        failure_counts: Mapping[tuple[str, str, str], int] | None = None,
        open_failures: Sequence[tuple[Mapping[str, AttrValue], int]] = (),
        time_ns: int | None = None,
        descriptions: Mapping[str, str] | None = None,
    ) -> tuple[list[tuple[bytes, int]], int]:
        """Requests (serialised, each with its number of data points) and the total points."""
        now = time_ns if time_ns is not None else time.time_ns()
        times = b"\x11" + _Q(self.start_ns) + b"\x19" + _Q(now) + b"\x21"
        old, new = self._cache, {}
        metrics: dict[str, _Metric] = {}
        descriptions = descriptions or {}

        def attrs_bytes(key: tuple[int, str], owner: object, build: Callable[[], Mapping[str, AttrValue]]) -> bytes:
            # cached: data_points field tag + point length + the encoded attributes, so a
            # point is this prefix + ``times`` + the 8-byte double (27 bytes after the attributes)
            hit = old.get(key)
            if hit is None or hit[0] is not owner:
                attrs = encode_attributes(build(), 7)
                hit = (owner, b"\x0a" + _varint(len(attrs) + _POINT_TAIL) + attrs)
            new[key] = hit
            return hit[1]

        if self.naming == "dcgm":
            self._encode_dcgm(views, metrics, attrs_bytes, times)
        spec: MetricSpec
        for spec in GPU_METRICS if self.naming == "otel" else ():
            m = metrics.get(spec.otel_name)
            if m is None:
                desc = descriptions.get(spec.otel_name, spec.description)
                m = metrics[spec.otel_name] = _Metric(
                    self._header(spec.otel_name, desc, spec.otel_unit), spec.otel_kind
                )
            pts = m.points
            value, skey = spec.value, spec.key
            for e, _ in views:
                v = value(e.gpu)
                if v is None:
                    continue
                a = e.attributes
                ab = attrs_bytes((id(a), skey), a, lambda a=a, spec=spec: metric_attributes(spec, a))  # type: ignore[misc]
                pts.append(ab + times + _D(v))
        multi: MultiMetricSpec
        for multi in GPU_MULTI_METRICS if self.naming == "otel" else ():
            m = metrics[multi.otel_name] = _Metric(
                self._header(multi.otel_name, multi.description, multi.otel_unit), multi.otel_kind
            )
            pts = m.points
            for e, view in views:
                a = e.attributes
                for vk, v in multi.points(view):
                    ab = attrs_bytes((id(a), f"{multi.key}/{vk}"), a,
                                     lambda a=a, vk=vk, k=multi.otel_keys: {**a, **dict(zip(k, vk, strict=True))})  # type: ignore[misc]  # fmt: skip
                    pts.append(ab + times + _D(v))
        fc = metrics["gpuwarden.failures"] = _Metric(
            self._header("gpuwarden.failures",
                         "Failure episodes seen (each failure_id once), by pattern, severity and node",
                         "{failure}"), "counter")  # fmt: skip
        for (p, s, node), n in (failure_counts or {}).items():
            ab = encode_attributes(
                {"gpuwarden.failure.pattern": p, "gpuwarden.failure.severity": s, "host.name": node}, 7
            )
            fc.points.append(_field(1, ab + times + _D(float(n))))
        fo = metrics["gpuwarden.failure.open"] = _Metric(
            self._header("gpuwarden.failure.open", "Open failures (not resolved, not expired)", "{failure}"), "gauge"
        )
        for attrs, n in open_failures:
            fo.points.append(_field(1, encode_attributes(attrs, 7) + times + _D(float(n))))
        self._cache = new
        total = 0
        room = self.cardinality_limit
        for name, m in metrics.items():
            over = len(m.points) - room
            self.series_over_limit[name] = max(over, 0)
            if over > 0:
                log.warning("%s: %d series over the cardinality limit %d left out", name, over, room)
                del m.points[room:]
            total += len(m.points)
        return self._pack(metrics.values()), total

    def _encode_dcgm(
        self,
        views: Sequence[tuple[GpuEntry, GpuView]],
        metrics: dict[str, _Metric],
        attrs_bytes: Callable[[tuple[int, str], object, Callable[[], Mapping[str, AttrValue]]], bytes],
        times: bytes,
    ) -> None:
        for spec in DCGM_METRICS:
            m = metrics[spec.name] = _Metric(self._header(spec.name, spec.help, ""), spec.kind)
            for e, view in views:
                v = spec.value(view)
                if v is None:
                    continue
                a = e.attributes
                ab = attrs_bytes((id(a), "dcgm"), a, lambda a=a: dcgm_attributes(a))  # type: ignore[misc]
                m.points.append(ab + times + _D(float(v)))

    def _pack(self, metrics: Iterable[_Metric]) -> list[tuple[bytes, int]]:
        budget = self.max_request_bytes - len(self._prefix_resource) - len(self._prefix_scope) - 64
        requests: list[tuple[bytes, int]] = []
        chunk: list[bytes] = []
        size = count = 0

        def flush() -> None:
            nonlocal chunk, size, count
            if chunk:
                scope_metrics = _field(2, self._prefix_scope + b"".join(chunk))
                requests.append((_field(1, self._prefix_resource + scope_metrics), count))
            chunk, size, count = [], 0, 0

        for m in metrics:
            if not m.points:
                continue
            part: list[bytes] = []
            part_size = len(m.header) + 32
            for p in m.points:
                if part and size + part_size + len(p) > budget:
                    chunk.append(m.wrap(part))
                    count += len(part)
                    flush()
                    part, part_size = [], len(m.header) + 32
                part.append(p)
                part_size += len(p)
            enc = m.wrap(part)
            if size + len(enc) > budget:
                flush()
            chunk.append(enc)
            size += len(enc)
            count += len(part)
        flush()
        return requests


# -- transports ------------------------------------------------------------------------


class ExportError(Exception):
    """An export that must not be retried (bad request, auth)."""


class RetryableExportError(ExportError):
    """An export that may succeed later (receiver down, overloaded, timeout)."""


class Transport(Protocol):
    """Sends one serialised ``ExportMetricsServiceRequest``; returns the data points the
    receiver rejected (partial success). Raises :class:`ExportError` /
    :class:`RetryableExportError`."""

    def send(self, request: bytes, timeout_s: float) -> int: ...

    def close(self) -> None: ...


Compression = Literal["none", "gzip", "deflate"]


def _rejected(body: bytes) -> int:
    if not body:
        return 0
    resp = metrics_service_pb2.ExportMetricsServiceResponse.FromString(body)
    return int(resp.partial_success.rejected_data_points)


class GrpcTransport:
    """OTLP/gRPC ``MetricsService/Export`` with pre-serialised requests.

    ``endpoint`` ``host:port`` or ``http(s)://host:port``; TLS unless ``insecure`` (files:
    CA bundle, client certificate and key, PEM); ``headers`` sent as metadata.
    """

    _METHOD = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"

    def __init__(
        self,
        endpoint: str,
        *,
        insecure: bool,
        headers: Mapping[str, str] | None = None,
        compression: Compression = "none",
        ca_file: str | None = None,
        client_cert_file: str | None = None,
        client_key_file: str | None = None,
    ) -> None:
        import grpc

        target = endpoint.split("://", 1)[-1].rstrip("/")
        options = [("grpc.max_send_message_length", 64 * 1024 * 1024)]
        comp = {"none": grpc.Compression.NoCompression, "gzip": grpc.Compression.Gzip,
                "deflate": grpc.Compression.Deflate}[compression]  # fmt: skip
        if insecure:
            self._channel = grpc.insecure_channel(target, options=options, compression=comp)
        else:

            def read(path: str | None) -> bytes | None:
                if path is None:
                    return None
                with open(path, "rb") as f:
                    return f.read()

            creds = grpc.ssl_channel_credentials(read(ca_file), read(client_key_file), read(client_cert_file))
            self._channel = grpc.secure_channel(target, creds, options=options, compression=comp)
        self._call = self._channel.unary_unary(self._METHOD)
        self._metadata = [(k.lower(), v) for k, v in (headers or {}).items()]
        self._grpc = grpc

    def send(self, request: bytes, timeout_s: float) -> int:
        grpc = self._grpc
        try:
            body = self._call(request, timeout=timeout_s, metadata=self._metadata or None)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            sc = grpc.StatusCode
            retryable = {sc.UNAVAILABLE, sc.DEADLINE_EXCEEDED, sc.RESOURCE_EXHAUSTED, sc.ABORTED, sc.CANCELLED,
                         sc.OUT_OF_RANGE, sc.DATA_LOSS}  # fmt: skip
            err = RetryableExportError if code in retryable else ExportError
            raise err(f"gRPC {code}: {exc}") from exc
        return _rejected(body)

    def close(self) -> None:
        self._channel.close()


class HttpTransport:
    """OTLP/HTTP (binary protobuf) POST to ``url`` (``.../v1/metrics``); gzip or deflate
    ``Content-Encoding``; TLS from a CA bundle and optional client certificate/key files."""

    def __init__(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        compression: Compression = "none",
        ca_file: str | None = None,
        client_cert_file: str | None = None,
        client_key_file: str | None = None,
    ) -> None:
        import ssl
        import urllib.request

        self.url = url
        self.compression = compression
        self.headers = {"Content-Type": "application/x-protobuf", **(headers or {})}
        if compression != "none":
            self.headers["Content-Encoding"] = compression
        handlers: list[urllib.request.BaseHandler] = []
        if url.startswith("https://"):
            ctx = ssl.create_default_context(cafile=ca_file)
            if client_cert_file:
                ctx.load_cert_chain(client_cert_file, client_key_file)
            handlers.append(urllib.request.HTTPSHandler(context=ctx))
        self._opener = urllib.request.build_opener(*handlers)

    def send(self, request: bytes, timeout_s: float) -> int:
        import urllib.error
        import urllib.request

        data = request
        if self.compression == "gzip":
            data = gzip.compress(request, compresslevel=1)
        elif self.compression == "deflate":
            data = zlib.compress(request, 1)
        req = urllib.request.Request(self.url, data=data, headers=self.headers, method="POST")
        try:
            with self._opener.open(req, timeout=timeout_s) as resp:
                return _rejected(resp.read())
        except urllib.error.HTTPError as exc:
            err = RetryableExportError if exc.code in (429, 502, 503, 504) else ExportError
            raise err(f"HTTP {exc.code} from {self.url}") from exc
        except OSError as exc:  # refused, reset, timeout
            raise RetryableExportError(f"{self.url}: {exc}") from exc

    def close(self) -> None:
        pass


# -- the exporter ----------------------------------------------------------------------


class DirectMetricExporter:
    """Every ``interval_s``, encodes the store with :class:`MetricEncoder` and sends the
    requests through ``transport``.

    A retryable failure is retried with exponential backoff (``backoff_s`` doubling up to
    ``max_backoff_s``, with jitter) until ``retry_deadline_s`` after the export began; then
    the points of the request are dropped and counted in ``stats.points_dropped`` (so are
    points of a non-retryable failure and points the receiver rejected). ``start()`` runs
    the loop in a daemon thread; ``shutdown()`` stops it after a last export.
    """

    def __init__(
        self,
        store: LatestStore,
        encoder: MetricEncoder,
        transport: Transport,
        *,
        interval_s: float = 10.0,
        timeout_s: float = 10.0,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        retry_deadline_s: float | None = None,
        descriptions: Mapping[str, str] | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        self.store = store
        self.encoder = encoder
        self.transport = transport
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.retry_deadline_s = retry_deadline_s if retry_deadline_s is not None else interval_s
        self.descriptions = descriptions
        self.stats = ExportStats()
        self._stop = threading.Event()
        self._sleep = sleep or self._stop.wait
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def export_once(self) -> bool:
        """Export the current store now; True when every request was accepted in full."""
        with self._lock:
            views = self.store.views()
            opens = [(g.attributes, g.count) for g in self.store.open_failures()]
            requests, n = self.encoder.encode(views, self.store.failure_counts(), opens,
                                              descriptions=self.descriptions)  # fmt: skip
            self.stats.last_export_points = n
            ok = True
            began = time.monotonic()
            for req, points in requests:
                ok = self._send(req, points, began) and ok
            return ok

    def _send(self, req: bytes, points: int, began: float) -> bool:
        delay = self.backoff_s
        while True:
            try:
                rejected = self.transport.send(req, self.timeout_s)
            except RetryableExportError as exc:
                self.stats.last_error = str(exc)
                left = self.retry_deadline_s - (time.monotonic() - began)
                if left <= 0 or self._stop.is_set():
                    return self._drop(points, exc)
                self.stats.retries += 1
                self._sleep(min(delay, left))
                delay = min(delay * 2, self.max_backoff_s)
                continue
            except ExportError as exc:
                self.stats.last_error = str(exc)
                return self._drop(points, exc)
            self.stats.requests_sent += 1
            self.stats.points_exported += points - rejected
            if rejected:
                self.stats.points_dropped += rejected
                log.warning("OTLP receiver rejected %d data points", rejected)
                return False
            return True

    def _drop(self, points: int, exc: Exception) -> bool:
        self.stats.requests_failed += 1
        self.stats.points_dropped += points
        log.warning("OTLP metric export failed, %d data points dropped: %s", points, exc)
        return False

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="otlp-direct-metrics", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.export_once()
            except Exception:  # keep exporting: one bad cycle must not end the thread
                log.exception("OTLP metric export cycle failed")

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop the loop and export a last time (no retries)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        try:
            self.export_once()
        finally:
            self.transport.close()
