"""The remediator's own Prometheus series, read from its state at scrape time."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuwarden.shared.lease import Lease

from .alerts import Alerter
from .policy import History, PolicyConfig

__all__ = ["DECISIONS", "RemediatorCollector", "RemediatorState"]

#: The ``decision`` label values of ``gpuwarden_remediator_decisions_total``, always all present.
DECISIONS = ("executed", "dry-run", "skipped", "refused", "failed")


class RemediatorState(Protocol):
    """What the collector reads (the :class:`~gpuwarden.remediator.service.Remediator`)."""

    @property
    def history(self) -> History: ...
    @property
    def cfg(self) -> PolicyConfig: ...
    @property
    def lease(self) -> Lease: ...
    @property
    def alerter(self) -> Alerter: ...
    @property
    def decisions(self) -> Mapping[str, int]: ...


class RemediatorCollector(Collector):
    """The remediator's own series on its ``/metrics``, read at scrape time:
    ``gpuwarden_remediator_breaker_open`` (1 open), ``gpuwarden_remediator_enforce`` (1 enforcing,
    0 dry-run), ``gpuwarden_remediator_lease_held``, ``gpuwarden_remediator_drained_nodes`` (drains
    gpuwarden holds, count), ``gpuwarden_remediator_decisions_total{decision}``,
    ``gpuwarden_remediator_alerts_active``, ``gpuwarden_remediator_alerts_delivered_total``,
    ``gpuwarden_remediator_alerts_failed_total`` (deliveries that failed after retries)."""

    def __init__(self, r: RemediatorState) -> None:
        self.r = r

    def describe(self) -> list[Metric]:
        return list(self.collect())

    def collect(self) -> list[Metric]:
        r = self.r

        def gauge(name: str, help_: str, v: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, help_, value=v)

        out: list[Metric] = [
            gauge("gpuwarden_remediator_breaker_open", "1 while the circuit breaker is open (no drains)",
                  1.0 if r.history.breaker_reason is not None else 0.0),
            gauge("gpuwarden_remediator_enforce", "1 = drains for real, 0 = dry-run", 1.0 if r.cfg.enforce else 0.0),
            gauge("gpuwarden_remediator_lease_held", "1 while this replica is the active remediator",
                  1.0 if r.lease.held() else 0.0),
            gauge("gpuwarden_remediator_drained_nodes", "Nodes drained by gpuwarden and not yet resumed",
                  float(len(r.history.drained))),
            gauge("gpuwarden_remediator_alerts_active", "Alerts firing (sent, not yet resolved)",
                  float(len(r.alerter.active))),
        ]  # fmt: skip
        dec = CounterMetricFamily("gpuwarden_remediator_decisions", "Decisions by outcome", labels=["decision"])
        for k in DECISIONS:
            dec.add_metric([k], float(r.decisions.get(k, 0)))
        out.append(dec)
        delivered, failed = float(r.alerter.delivered), float(r.alerter.failed)
        out.append(
            CounterMetricFamily(
                "gpuwarden_remediator_alerts_delivered", "Alert deliveries that succeeded", value=delivered
            )
        )
        out.append(
            CounterMetricFamily(
                "gpuwarden_remediator_alerts_failed", "Alert deliveries that failed after retries", value=failed
            )
        )
        return out
