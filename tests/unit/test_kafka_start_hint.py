"""The one line a service prints when Kafka refuses its start (issue 26: no `gpuwarden broker`
advice to a production install, the address that was tried, the security settings on a refused
login)."""

from __future__ import annotations

from aiokafka.errors import KafkaConnectionError, SaslAuthenticationFailed

from gpuwarden.shared.service import kafka_start_hint


def test_no_broker_at_a_configured_address_names_it_and_the_wait_setting() -> None:
    line = kafka_start_hint(KafkaConnectionError("Unable to bootstrap"), {"GPUWARDEN_BOOTSTRAP_SERVERS": "k1:9092"})
    assert line.startswith("no Kafka broker answers at k1:9092 (")
    assert "GPUWARDEN_KAFKA_START_WAIT_S" in line
    assert "gpuwarden broker" not in line  # the address was set: a production install, no demo broker advice
    assert "\n" not in line


def test_the_default_address_says_it_is_the_default() -> None:
    line = kafka_start_hint(KafkaConnectionError("Unable to bootstrap"), {})
    assert "127.0.0.1:9092 (the default: GPUWARDEN_BOOTSTRAP_SERVERS is not set)" in line
    assert line.endswith("for a local try: gpuwarden broker")  # the umbrella package (gpuwarden.sim) is here


def test_a_refused_login_names_the_security_settings_not_the_address() -> None:
    line = kafka_start_hint(SaslAuthenticationFailed("bad password"), {"GPUWARDEN_BOOTSTRAP_SERVERS": "k1:9093"})
    assert line.startswith("Kafka at k1:9093 refused this client: SaslAuthenticationFailed")
    assert "GPUWARDEN_SASL_" in line and "no Kafka broker answers" not in line


def test_a_refused_acl_points_at_the_plan() -> None:
    from aiokafka.errors import TopicAuthorizationFailedError

    line = kafka_start_hint(TopicAuthorizationFailedError("plan.job.windows"), {"GPUWARDEN_BOOTSTRAP_SERVERS": "k:1"})
    assert "refused this principal: TopicAuthorizationFailedError" in line and "gpuwarden topics plan" in line
