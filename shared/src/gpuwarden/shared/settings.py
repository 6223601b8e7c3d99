"""Typed settings shared by every service, read from ``GPUWARDEN_*`` environment variables."""

from __future__ import annotations

import ipaddress
import os
import re
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, Strict, StrictInt, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = [
    "CLUSTER_NAME_PATTERN",
    "SETTINGS_JSON_HINT",
    "TOPIC_PREFIX_PATTERN",
    "BusSettings",
    "ServiceSettings",
    "TopicSettings",
    "check_bootstrap_servers",
    "describe_settings_error",
]

#: What a topic prefix may be: Kafka's legal topic characters, short enough that the longest
#: topic name (a lease's, with a 100-character cluster name) stays under Kafka's 249.
TOPIC_PREFIX_PATTERN = r"^[A-Za-z0-9._-]{0,100}$"
#: What a Slurm cluster name may be where it names a topic (the leases) or keys a record.
CLUSTER_NAME_PATTERN = r"^[A-Za-z0-9._-]{1,100}$"

_BOOTSTRAP_ENTRY = re.compile(r"^(\[[0-9A-Fa-f:.]+(?:%[A-Za-z0-9._-]+)?\]|[A-Za-z0-9._-]+)(?::(\d{1,5}))?$")


def check_bootstrap_servers(value: str) -> str:
    """``host[:port],...`` as aiokafka takes it: a host name or IPv4 address, an IPv6 address in
    brackets (a zone id too, ``[fe80::1%eth0]:9092``) or bare (default port), port 1-65535 or
    left out (9092); blanks around an entry and empty entries (a trailing comma) are dropped.
    Returns the cleaned list.

    Raises:
        ValueError: no entry, or one that is not ``host[:port]``, naming it.
    """
    entries = [e.strip() for e in value.split(",") if e.strip()]
    if not entries:
        raise ValueError(f"not host:port (port 1-65535): no address in {value!r}")
    for e in entries:
        try:
            ipaddress.IPv6Address(e)  # a bare IPv6 address: aiokafka uses the default port
            continue
        except ValueError:
            pass
        m = _BOOTSTRAP_ENTRY.match(e)
        if m is None or (m.group(2) is not None and not 1 <= int(m.group(2)) <= 65535):
            raise ValueError(f"not host:port (port 1-65535): {e!r} in {value!r}")
    return ",".join(entries)


#: What a setting that pydantic-settings could not decode needs (its SettingsError names the field).
SETTINGS_JSON_HINT = "a list or mapping setting takes JSON, e.g. GPUWARDEN_TOPIC_PARTITIONS='{\"gpu.samples\": 24}'"


def describe_settings_error(exc: ValidationError, prefix: str = "GPUWARDEN_") -> str:
    """One line per bad setting, named by its environment variable, e.g.
    ``GPUWARDEN_HTTP_PORT='x': Input should be a valid integer``; a check across settings (no
    single field) gives its own message, which names them."""
    lines = []
    for e in exc.errors():
        msg = e["msg"].removeprefix("Value error, ")
        loc = e["loc"]
        if not loc:  # a check across settings (a model validator): its message names them
            lines.append(msg)
            continue
        field = str(loc[0]).upper()
        got = e.get("input")
        shown = f"={got!r}" if isinstance(got, str | int | float) else ""
        name = field if field.startswith(prefix) else f"{prefix}{field}"
        keys = "".join(f"[{p!r}]" if isinstance(p, str) else f"[{p}]" for p in loc[1:])  # an entry of a mapping
        lines.append(f"{name}{keys}{shown}: {msg}")
    return "invalid settings: " + "; ".join(lines)


#: Environment variable prefixes of the Kafka client security settings: a variable with one of
#: these prefixes that is not a known setting is an error (a typo must never mean plaintext).
SECURITY_ENV_PREFIXES = ("GPUWARDEN_SECURITY_", "GPUWARDEN_SASL_", "GPUWARDEN_SSL_", "GPUWARDEN_PRODUCER_")


class BusSettings(BaseSettings):
    """Where Kafka is, how topics are named and how every client authenticates.

    Environment: ``GPUWARDEN_BOOTSTRAP_SERVERS`` (default ``127.0.0.1:9092``),
    ``GPUWARDEN_TOPIC_PREFIX`` (default ``gpuwarden.``), and the security settings
    ``GPUWARDEN_SECURITY_PROTOCOL`` (``PLAINTEXT``, ``SSL``, ``SASL_PLAINTEXT``, ``SASL_SSL``),
    ``GPUWARDEN_SASL_MECHANISM`` (``PLAIN``, ``SCRAM-SHA-256``, ``SCRAM-SHA-512``),
    ``GPUWARDEN_SASL_USERNAME``, ``GPUWARDEN_SASL_PASSWORD``, ``GPUWARDEN_SSL_CAFILE``,
    ``GPUWARDEN_SSL_CERTFILE``/``GPUWARDEN_SSL_KEYFILE``/``GPUWARDEN_SSL_KEY_PASSWORD`` (client
    certificate, mTLS), ``GPUWARDEN_SSL_CHECK_HOSTNAME`` (default true), and the producer's
    durability ``GPUWARDEN_PRODUCER_ACKS`` (``all`` or ``1``, default ``all``) and
    ``GPUWARDEN_PRODUCER_IDEMPOTENCE`` (``auto``: on when the broker has the idempotent
    producer API, ``true``, ``false``).

    Raises (at construction, as ``pydantic.ValidationError``): an unknown
    ``GPUWARDEN_SECURITY_*``/``SASL_*``/``SSL_*``/``PRODUCER_*`` variable, SASL without a
    username and password, a client certificate without its key, a file that does not
    exist, TLS settings with a plaintext protocol.
    """

    model_config = SettingsConfigDict(env_prefix="GPUWARDEN_", extra="ignore")

    bootstrap_servers: str = Field("127.0.0.1:9092", description="Kafka bootstrap servers, host:port[,...]")
    topic_prefix: str = Field(
        "gpuwarden.",
        pattern=TOPIC_PREFIX_PATTERN,
        description="Prefix of every topic name, [A-Za-z0-9._-]{0,100} (a topic is the prefix + its name, so end "
        "it in '.', '-' or '_')",
    )
    client_id: str = Field("gpuwarden", description="Kafka client id prefix")
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT", description="Kafka security protocol of every client"
    )
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = Field(
        "SCRAM-SHA-512", description="SASL mechanism (SASL_* protocols)"
    )
    sasl_username: str | None = Field(None, description="SASL user name")
    sasl_password: SecretStr | None = Field(None, description="SASL password")
    ssl_cafile: Path | None = Field(None, description="CA bundle that signed the brokers' certificates (PEM)")
    ssl_certfile: Path | None = Field(None, description="Client certificate (PEM) for mTLS")
    ssl_keyfile: Path | None = Field(None, description="Private key (PEM) of the client certificate")
    ssl_key_password: SecretStr | None = Field(None, description="Password of the private key")
    ssl_check_hostname: bool = Field(True, description="Check the broker's certificate matches its host name")
    edge_max_ahead_s: float = Field(
        600.0, gt=0, description="Refuse a record whose event time is this far ahead of the wall clock (contract), s"
    )
    edge_max_behind_s: float = Field(
        365 * 86400.0,
        gt=0,
        description="Refuse a record whose event time is this far behind its topic's newest accepted one, s",
    )
    create_topics: bool = Field(
        True,
        description="Let a service create the topic it needs on first use (the two lease topics); false: only "
        "check what exists and name what is missing (topics come from `gpuwarden topics plan`'s commands)",
    )
    kafka_start_wait_s: float = Field(
        0.0,
        ge=0,
        description="How long a service retries at start while no Kafka broker answers (backoff 1-30 s; /healthz "
        "degraded meanwhile), s; 0 = fail at once (exit 2). The shipped unit env files set a day. The collector "
        "never waits: it collects and buffers while it connects",
    )
    producer_acks: Literal["all", "1"] = Field("all", description="Producer acks: all (durable) or 1")
    producer_compression: Literal["zstd", "lz4", "snappy", "gzip", "none"] = Field(
        "none",
        description="Record batch compression of every producer (Kafka >= 2.1 for zstd; the shipped env files "
        "and compose set zstd). Measured on simulated "
        "8-GPU samples with NVLinks every tick, 64 per batch: zstd 28.7x smaller for 3.3 ms of CPU per 1,000 GPU "
        "samples, lz4 12.3x for 12.6 ms, gzip 20.7x for 37.5 ms",
    )
    producer_idempotence: Literal["auto", "true", "false"] = Field(
        "auto", description="Idempotent producer: auto = when the broker supports it"
    )

    @field_validator("bootstrap_servers")
    @classmethod
    def _bootstrap(cls, v: str) -> str:
        return check_bootstrap_servers(v)

    @field_validator("security_protocol", "sasl_mechanism", mode="before")
    @classmethod
    def _upper_name(cls, v: object) -> object:
        return v.strip().upper() if isinstance(v, str) else v

    @field_validator("producer_idempotence", "producer_acks", "producer_compression", mode="before")
    @classmethod
    def _lower_name(cls, v: object) -> object:
        return v.strip().lower() if isinstance(v, str) else v

    @model_validator(mode="after")
    def _check_security(self) -> BusSettings:
        unknown = sorted(
            k
            for k in os.environ
            if k.upper().startswith(SECURITY_ENV_PREFIXES) and k.upper()[len("GPUWARDEN_") :].lower() not in _BUS_FIELDS
        )
        if unknown:
            raise ValueError(f"unknown Kafka security setting(s) {', '.join(unknown)} (known: {_known_env()})")
        sasl = self.security_protocol.startswith("SASL_")
        tls = self.security_protocol in ("SSL", "SASL_SSL")
        if sasl and (not self.sasl_username or self.sasl_password is None):
            raise ValueError(f"{self.security_protocol} needs GPUWARDEN_SASL_USERNAME and GPUWARDEN_SASL_PASSWORD")
        if not sasl and (self.sasl_username or self.sasl_password is not None):
            raise ValueError(f"SASL credentials are set but GPUWARDEN_SECURITY_PROTOCOL is {self.security_protocol}")
        files = {"ssl_cafile": self.ssl_cafile, "ssl_certfile": self.ssl_certfile, "ssl_keyfile": self.ssl_keyfile}
        if not tls and any(files.values()):
            raise ValueError(f"TLS files are set but GPUWARDEN_SECURITY_PROTOCOL is {self.security_protocol}")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError("a client certificate needs both GPUWARDEN_SSL_CERTFILE and GPUWARDEN_SSL_KEYFILE")
        for name, path in files.items():
            if path is not None and not path.is_file():
                raise ValueError(f"GPUWARDEN_{name.upper()}={str(path)!r}: no such file")
        return self

    def topic(self, name: str) -> str:
        """Full name of a registered topic (see ``gpuwarden.shared.topics``)."""
        from .topics import topic

        return topic(name, self.topic_prefix)

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context of the ``SSL``/``SASL_SSL`` protocols (None for plaintext): the CA
        file (else the system CAs), the client certificate if set, hostname checking as set,
        certificates always verified.

        Raises:
            ssl.SSLError, OSError: a file is not a usable PEM certificate/key.
        """
        if self.security_protocol not in ("SSL", "SASL_SSL"):
            return None
        from aiokafka.helpers import create_ssl_context

        ctx: ssl.SSLContext = create_ssl_context(
            cafile=str(self.ssl_cafile) if self.ssl_cafile else None,
            certfile=str(self.ssl_certfile) if self.ssl_certfile else None,
            keyfile=str(self.ssl_keyfile) if self.ssl_keyfile else None,
            password=self.ssl_key_password.get_secret_value() if self.ssl_key_password else None,
        )
        ctx.check_hostname = self.ssl_check_hostname
        ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    def kafka_kwargs(self) -> dict[str, Any]:
        """Connection keyword arguments for every aiokafka client (producer, consumer, admin,
        ``AIOKafkaClient``): ``bootstrap_servers``, ``security_protocol`` and, as configured,
        ``ssl_context``, ``sasl_mechanism``, ``sasl_plain_username``/``sasl_plain_password``."""
        kw: dict[str, Any] = {"bootstrap_servers": self.bootstrap_servers, "security_protocol": self.security_protocol}
        ctx = self.ssl_context()
        if ctx is not None:
            kw["ssl_context"] = ctx
        if self.security_protocol.startswith("SASL_"):
            assert self.sasl_password is not None
            kw.update(
                sasl_mechanism=self.sasl_mechanism,
                sasl_plain_username=self.sasl_username,
                sasl_plain_password=self.sasl_password.get_secret_value(),
            )
        return kw

    def faust_credentials(self) -> Any:
        """The same security for faust (``broker_credentials``): ``faust.SASLCredentials`` or
        ``faust.SSLCredentials``; None for ``PLAINTEXT``."""
        import faust

        ctx = self.ssl_context()
        if self.security_protocol.startswith("SASL_"):
            assert self.sasl_password is not None
            return faust.SASLCredentials(
                username=self.sasl_username,
                password=self.sasl_password.get_secret_value(),
                ssl_context=ctx,
                mechanism=self.sasl_mechanism,
            )
        if ctx is not None:
            return faust.SSLCredentials(ctx)
        return None


class TopicSettings(BaseSettings):
    """The topic layout `gpuwarden topics create` and `gpuwarden topics plan` use (no service
    reads them: a bad value stops those two commands only).

    Raises (at construction): ``pydantic.ValidationError`` for a value of the wrong type or a
    name or count :func:`gpuwarden.shared.topics.check_topic_overrides` refuses;
    ``pydantic_settings.SettingsError`` for a value that is not JSON.
    """

    model_config = SettingsConfigDict(env_prefix="GPUWARDEN_", extra="ignore")

    topic_partitions: dict[str, StrictInt] = Field(
        default_factory=dict,
        json_schema_extra={"doc_default": "{} (the registry's)"},
        description="Partitions per topic that `gpuwarden topics create` creates and `topics plan` prints, as JSON "
        'by short name, e.g. {"gpu.samples": 24}; the others keep the registry\'s (README '
        "topic table; the plan raises a topic past 1 MB/s per partition). The node-keyed stream topics "
        "(gpu.samples, gpu.events, correlator.windows, gpu.attributed, gpu.events.attributed, slurm.nodes, "
        "health) share one count, and slurm.jobs and job.windows another (a key's records of all of them are "
        "read by one worker, by partition number): naming one sets its group. "
        "`topics create --partitions N` overrides it. An existing topic is never altered",
    )
    topic_retention_hours: dict[str, Annotated[float, Strict()]] = Field(
        default_factory=dict,
        json_schema_extra={"doc_default": "{} (the registry's)"},
        description="Retention per topic (retention.ms) that `gpuwarden topics create` sets and `topics plan` "
        'prints, as JSON by short name in hours, e.g. {"gpu.samples": 12, "failures": 2160}; not for the '
        "compacted correlator.windows. The others keep the registry's (1 day for the sample topics, 7 for most)",
    )

    @model_validator(mode="after")
    def _check_topic_overrides(self) -> TopicSettings:
        from .topics import check_topic_overrides

        try:
            check_topic_overrides(self.topic_partitions, self.topic_retention_hours)
        except ValueError as exc:
            raise ValueError(f"GPUWARDEN_TOPIC_PARTITIONS / GPUWARDEN_TOPIC_RETENTION_HOURS: {exc}") from None
        return self


_BUS_FIELDS = {
    "security_protocol",
    "sasl_mechanism",
    "sasl_username",
    "sasl_password",
    "ssl_cafile",
    "ssl_certfile",
    "ssl_keyfile",
    "ssl_key_password",
    "ssl_check_hostname",
    "producer_acks",
    "producer_idempotence",
    "producer_compression",
}


def _known_env() -> str:
    return ", ".join(f"GPUWARDEN_{f.upper()}" for f in sorted(_BUS_FIELDS))


class ServiceSettings(BusSettings):
    """Settings every long-running service has: bus, HTTP health/metrics port, logging."""

    http_host: str = Field("127.0.0.1", description="Bind address of /healthz and /metrics")
    http_port: int = Field(0, ge=0, le=65535, description="Port of /healthz and /metrics (0 = a free port)")
    http_control_token: SecretStr | None = Field(
        None,
        description="Bearer token every state-changing HTTP request (POST: breaker reset, report trigger) "
        "needs; unset: every such request is refused (401)",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = Field(
        "INFO", description="Python logging level"
    )

    @field_validator("http_control_token")
    @classmethod
    def _long_enough(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None and len(v.get_secret_value()) < 16:
            raise ValueError("GPUWARDEN_HTTP_CONTROL_TOKEN must be at least 16 characters (openssl rand -hex 24)")
        return v

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, v: object) -> object:
        return v.upper() if isinstance(v, str) else v

    consumer_group: str | None = Field(None, description="Kafka consumer group (default: gpuwarden-<service>)")
    gc_young_threshold: int = Field(
        50_000,
        ge=0,
        description="Allocations between the garbage collector's young-generation passes (Python's default "
        "is 700; 0 keeps it): a stage holding windows and allocations for thousands of nodes spent ~30 % of "
        "its CPU in the collector at the default. Objects alive after start-up are frozen (gc.freeze)",
    )
    auto_offset_reset: Literal["earliest", "latest"] = Field(
        "earliest", description="Where a new consumer group starts: earliest|latest"
    )


def unknown_settings(settings: BaseSettings, environ: Mapping[str, str] | None = None) -> list[str]:
    """Environment variables that look like this service's settings but are none of them: a
    ``GPUWARDEN_<T>_*`` variable where ``<T>`` begins one of the class's own field names
    (``remediator``, ``collector``...) and the rest names no field, e.g. a mistyped
    ``GPUWARDEN_REMEDIATOR_ENFORSE``. Each entry names the variable and its closest valid name.
    Variables of other services' prefixes are left to those services. A variable that is no
    field but nearly spells a shared one (``GPUWARDEN_BOOTSTRAP_SERVER``, ``GPUWARDEN_LOG_LEVL``:
    similarity >= 0.85, so other tools' ``GPUWARDEN_*`` names do not match) is named too."""
    import difflib

    env = os.environ if environ is None else environ
    fields = set(type(settings).model_fields)
    shared = set(ServiceSettings.model_fields)
    own_prefixes = {f.split("_", 1)[0] for f in fields - shared if "_" in f}
    out = []
    for name in sorted(env):
        up = name.upper()
        if not up.startswith("GPUWARDEN_"):
            continue
        key = up[len("GPUWARDEN_") :].lower()
        if key in fields:
            continue
        if key.split("_", 1)[0] not in own_prefixes:
            near = difflib.get_close_matches(key, sorted(shared & fields), n=1, cutoff=0.85)
            if near:
                out.append(f"{name} (did you mean GPUWARDEN_{near[0].upper()}?)")
            continue
        prefix, _, rest = key.partition("_")
        same = {f.partition("_")[2]: f for f in fields if f.startswith(prefix + "_")}
        near = difflib.get_close_matches(rest, sorted(same), n=1, cutoff=0.6)  # the part after the prefix
        hint = f" (did you mean GPUWARDEN_{same[near[0]].upper()}?)" if near else ""
        out.append(f"{name}{hint}")
    return out
