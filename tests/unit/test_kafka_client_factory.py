"""gpuwarden.shared.bus.clients: the one place aiokafka clients are built, with the connection's
security passed through and never overridden by a caller's options."""

from __future__ import annotations

import ast
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaClient, AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from gpuwarden.shared.bus import clients, kafka_admin, kafka_client, kafka_consumer, kafka_producer

ROOT = Path(__file__).resolve().parents[2]
FACTORY = ROOT / "shared/src/gpuwarden/shared/bus/clients.py"
CLIENT_CLASSES = {"AIOKafkaProducer", "AIOKafkaConsumer", "AIOKafkaAdminClient", "AIOKafkaClient"}


def _sources() -> Iterator[Path]:
    yield from (ROOT / "shared/src").rglob("*.py")
    for src in sorted((ROOT / "services").glob("*/src")):
        yield from src.rglob("*.py")
    yield from (ROOT / "src").rglob("*.py")


def _constructions(path: Path) -> Iterator[tuple[int, str]]:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name in CLIENT_CLASSES:
                yield node.lineno, name


def test_aiokafka_clients_are_built_only_by_the_factory() -> None:
    scanned = [p for p in _sources() if ".venv" not in p.parts]
    assert FACTORY in scanned and len(scanned) > 50  # the scan sees the code, not an empty tree
    found = [
        f"{p.relative_to(ROOT)}:{line}: {name}(...)"
        for p in scanned
        if p != FACTORY
        for line, name in _constructions(p)
    ]
    assert not found, "build aiokafka clients with gpuwarden.shared.bus.clients, not directly:\n" + "\n".join(found)
    assert {name for _, name in _constructions(FACTORY)} == CLIENT_CLASSES


class StubSettings:
    """A settings object with SASL over TLS, as ``BusSettings.kafka_kwargs()`` gives it."""

    def __init__(self) -> None:
        self.ctx = ssl.create_default_context()

    def kafka_kwargs(self) -> dict[str, Any]:
        return {
            "bootstrap_servers": "k1:9093,k2:9093",
            "security_protocol": "SASL_SSL",
            "ssl_context": self.ctx,
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_plain_username": "detector",
            "sasl_plain_password": "s3cret",
        }


def _inner(c: Any) -> AIOKafkaClient:
    inner = c if isinstance(c, AIOKafkaClient) else getattr(c, "client", None) or c._client
    assert isinstance(inner, AIOKafkaClient)
    return inner


async def _close(c: Any) -> None:
    await (c.close() if isinstance(c, AIOKafkaClient | AIOKafkaAdminClient) else c.stop())


async def test_the_settings_security_reaches_every_client() -> None:
    s = StubSettings()
    built = [
        kafka_consumer(s, "p.failures", group_id="g", enable_auto_commit=False),
        kafka_producer(s, acks="all", linger_ms=5),
        kafka_admin(s, request_timeout_ms=15000),
        kafka_client(s, request_timeout_ms=15000),
    ]
    try:
        assert [type(c) for c in built] == [AIOKafkaConsumer, AIOKafkaProducer, AIOKafkaAdminClient, AIOKafkaClient]
        for c in built:
            k = _inner(c)
            assert k._bootstrap_servers == "k1:9093,k2:9093"
            assert k._security_protocol == "SASL_SSL"
            assert k._ssl_context is s.ctx
            assert (k._sasl_mechanism, k._sasl_plain_username, k._sasl_plain_password) == (
                "SCRAM-SHA-512",
                "detector",
                "s3cret",
            )
        consumer = built[0]
        assert isinstance(consumer, AIOKafkaConsumer)
        assert consumer.subscription() == {"p.failures"} and consumer._group_id == "g"
        assert _inner(built[2])._request_timeout_ms == 15000
    finally:
        for c in built:
            await _close(c)


async def test_a_dict_or_a_bootstrap_string_is_a_connection() -> None:
    d = kafka_consumer({**StubSettings().kafka_kwargs(), "bootstrap_servers": "other:9093"}, group_id=None)
    p = kafka_producer("plain:9092", acks=1)
    try:
        assert (_inner(d)._bootstrap_servers, _inner(d)._sasl_plain_username) == ("other:9093", "detector")
        assert (_inner(p)._bootstrap_servers, _inner(p)._security_protocol) == ("plain:9092", "PLAINTEXT")
    finally:
        await d.stop()
        await p.stop()


@pytest.mark.parametrize(
    "option",
    [
        {"bootstrap_servers": "evil:9092"},
        {"security_protocol": "PLAINTEXT"},
        {"ssl_context": None},
        {"sasl_mechanism": "PLAIN"},
        {"sasl_plain_password": "x"},
        {"ssl_check_hostname": False},
    ],
)
@pytest.mark.parametrize("factory", [kafka_consumer, kafka_producer, kafka_admin, kafka_client])
async def test_an_option_cannot_override_the_connection_security(factory: Any, option: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="connection setting"):
        factory(StubSettings(), **option)


def test_a_malformed_connection_is_refused() -> None:
    with pytest.raises(ValueError, match="no bootstrap_servers"):
        clients.connection_kwargs({"security_protocol": "SSL"})
    with pytest.raises(ValueError, match="not connection settings: group_id"):
        clients.connection_kwargs({"bootstrap_servers": "b:9092", "group_id": "g"})
    with pytest.raises(ValueError, match="empty"):
        clients.connection_kwargs(" ")
    with pytest.raises(TypeError, match="int"):
        clients.connection_kwargs(9092)  # type: ignore[arg-type]
    assert clients.connection_kwargs(StubSettings())["sasl_plain_username"] == "detector"
