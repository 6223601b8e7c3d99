"""The one place that builds aiokafka clients: producer, consumer, admin client and the bare
``AIOKafkaClient``. Every other module takes its clients from here, so every client gets its
connection and security settings (bootstrap servers, ``security_protocol``, TLS context, SASL)
the same way, and none can be built with the security of its connection overridden
(``tests/unit/test_kafka_client_factory.py`` fails on any other construction).

A *connection* is one of:

* a settings object with ``kafka_kwargs()`` (``BusSettings`` and the services' settings): its
  bootstrap servers and SASL/TLS settings;
* a dict of connection keyword arguments, as ``kafka_kwargs()`` returns them (it must hold
  ``bootstrap_servers``; only :data:`CONNECTION_KEYS` are allowed in it);
* a bootstrap string ``host:port[,host:port]``: plaintext, no authentication.

The ``options`` of each function are the client's other keyword arguments (``group_id``,
``acks``, ``request_timeout_ms``...); one that names a connection setting raises ValueError.
The clients are returned unstarted; build them inside a running event loop (aiokafka asks for one).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, TypeAlias

from aiokafka import AIOKafkaClient, AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

__all__ = [
    "CONNECTION_KEYS",
    "Connection",
    "HasKafkaKwargs",
    "connection_kwargs",
    "kafka_admin",
    "kafka_client",
    "kafka_consumer",
    "kafka_producer",
]


class HasKafkaKwargs(Protocol):
    """A settings object that knows its Kafka connection (``BusSettings``)."""

    def kafka_kwargs(self) -> dict[str, Any]:
        """Connection keyword arguments of every aiokafka client."""
        ...


Connection: TypeAlias = HasKafkaKwargs | Mapping[str, Any] | str

#: The keyword arguments that make a client's connection and its security: they come only from
#: the connection, never from a caller's options.
CONNECTION_KEYS = frozenset(
    {
        "bootstrap_servers",
        "security_protocol",
        "ssl_context",
        "sasl_mechanism",
        "sasl_plain_username",
        "sasl_plain_password",
        "sasl_kerberos_service_name",
        "sasl_kerberos_domain_name",
        "sasl_oauth_token_provider",
    }
)


def _is_connection_key(key: str) -> bool:
    return key in CONNECTION_KEYS or key.startswith(("sasl_", "ssl_"))


def connection_kwargs(connection: Connection) -> dict[str, Any]:
    """The connection keyword arguments of ``connection`` (see the module for its shapes).

    Returns:
        A new dict: ``bootstrap_servers``, ``security_protocol`` and, as the connection has them,
        ``ssl_context`` and the ``sasl_*`` arguments. A bootstrap string gives
        ``{"bootstrap_servers": s, "security_protocol": "PLAINTEXT"}``.

    Raises:
        ValueError: an empty bootstrap string, a dict without ``bootstrap_servers`` or with a
            key that is not a connection setting.
        TypeError: ``connection`` is none of the three shapes.
        ssl.SSLError, OSError: the settings' TLS files are unusable (from ``kafka_kwargs()``).
    """
    if isinstance(connection, str):
        if not connection.strip():
            raise ValueError("empty Kafka bootstrap servers")
        return {"bootstrap_servers": connection, "security_protocol": "PLAINTEXT"}
    if isinstance(connection, Mapping):
        kw = dict(connection)
    elif callable(getattr(connection, "kafka_kwargs", None)):
        kw = dict(connection.kafka_kwargs())
    else:
        raise TypeError(
            f"a Kafka connection is a settings object with kafka_kwargs(), a dict or a bootstrap string, "
            f"not {type(connection).__name__}"
        )
    other = sorted(k for k in kw if not _is_connection_key(k))
    if other:
        raise ValueError(f"not connection settings: {', '.join(other)} (pass them as the client's options)")
    if not kw.get("bootstrap_servers"):
        raise ValueError("the Kafka connection has no bootstrap_servers")
    return kw


def _kwargs(connection: Connection, options: Mapping[str, Any]) -> dict[str, Any]:
    bad = sorted(k for k in options if _is_connection_key(k))
    if bad:
        raise ValueError(
            f"{', '.join(bad)}: a connection setting cannot be passed as an option "
            "(it comes from the connection: settings.kafka_kwargs())"
        )
    return {**connection_kwargs(connection), **options}


def kafka_consumer(connection: Connection, *topics: str, **options: Any) -> AIOKafkaConsumer:
    """An unstarted ``AIOKafkaConsumer`` on ``connection``, subscribed to ``topics`` (full names;
    none: assign or subscribe later).

    Args:
        connection: settings with ``kafka_kwargs()``, a connection dict or a bootstrap string.
        topics: full topic names to subscribe to.
        options: the consumer's other arguments (``group_id``, ``enable_auto_commit``...).

    Raises:
        ValueError: an option names a connection setting (``bootstrap_servers``,
            ``security_protocol``, ``ssl_*``, ``sasl_*``), or the connection is malformed.
        TypeError: ``connection`` is none of the three shapes.
        RuntimeError: no running event loop (aiokafka).
    """
    return AIOKafkaConsumer(*topics, **_kwargs(connection, options))


def kafka_producer(connection: Connection, **options: Any) -> AIOKafkaProducer:
    """An unstarted ``AIOKafkaProducer`` on ``connection``.

    Args:
        connection: settings with ``kafka_kwargs()``, a connection dict or a bootstrap string.
        options: the producer's other arguments (``acks``, ``linger_ms``, ``enable_idempotence``...).

    Raises:
        ValueError: an option names a connection setting, or the connection is malformed.
        TypeError: ``connection`` is none of the three shapes.
        RuntimeError: no running event loop (aiokafka).
    """
    return AIOKafkaProducer(**_kwargs(connection, options))


def kafka_admin(connection: Connection, **options: Any) -> AIOKafkaAdminClient:
    """An unstarted ``AIOKafkaAdminClient`` on ``connection``.

    Args:
        connection: settings with ``kafka_kwargs()``, a connection dict or a bootstrap string.
        options: the admin client's other arguments (``request_timeout_ms``...).

    Raises:
        ValueError: an option names a connection setting, or the connection is malformed.
        TypeError: ``connection`` is none of the three shapes.
        RuntimeError: no running event loop (aiokafka).
    """
    return AIOKafkaAdminClient(**_kwargs(connection, options))


def kafka_client(connection: Connection, **options: Any) -> AIOKafkaClient:
    """An unbootstrapped ``AIOKafkaClient`` (metadata and raw requests) on ``connection``.

    Args:
        connection: settings with ``kafka_kwargs()``, a connection dict or a bootstrap string.
        options: the client's other arguments (``request_timeout_ms``...).

    Raises:
        ValueError: an option names a connection setting, or the connection is malformed.
        TypeError: ``connection`` is none of the three shapes.
        RuntimeError: no running event loop (aiokafka).
    """
    return AIOKafkaClient(**_kwargs(connection, options))
