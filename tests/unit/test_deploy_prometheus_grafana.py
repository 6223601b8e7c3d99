"""Prometheus rules (``promtool check rules`` / ``promtool test rules``) and the Grafana
dashboard: every PromQL expression in either names only metrics that the otlp-bridge or a
service really exports, derived from the code (the bridge's collector, the services'
prometheus-client registries and metric constructors), or a recording rule defined in the
rules file; every dashboard expression parses (``promtool check rules`` on a generated file)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import yaml

from prerequisites import give_up

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "gpuwarden-rules.yml"
RULES_TEST = ROOT / "deploy" / "prometheus" / "tests" / "gpuwarden-rules.test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "gpuwarden-dashboard.json"
PROMETHEUS_OWN = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}  # added by Prometheus per target


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        give_up("promtool not installed (Debian package prometheus, in deploy/debian-packages.txt)")
    return str(path)


def _family_names(metrics: object) -> set[str]:
    """Sample names of prometheus-client metric families (counter -> name_total, histogram ->
    _bucket/_sum/_count, ...)."""
    out: set[str] = set()
    for m in metrics:  # type: ignore[attr-defined]
        if m.type == "counter":
            out |= {f"{m.name}_total", f"{m.name}_created"}
        elif m.type in ("histogram", "summary"):
            out |= {f"{m.name}_bucket", f"{m.name}_sum", f"{m.name}_count", f"{m.name}_created"}
        else:
            out.add(m.name)
    return out


_CTOR = re.compile(r"\b(Counter|Gauge|Histogram|Summary)\(\s*\"(gpuwarden_[a-z0-9_]+)\"")


def exported_metric_names() -> set[str]:
    """Every metric name gpuwarden exports on some ``/metrics``, from the code."""
    from gpuwarden.otlp_bridge.prom import BridgeCollector
    from gpuwarden.otlp_bridge.store import LatestStore
    from gpuwarden.remediator import Remediator, RemediatorSettings
    from gpuwarden.shared.metrics import ServiceMetrics
    from gpuwarden.sim.slurm import FakeSlurm

    names: set[str] = set()
    for naming in ("otel", "dcgm"):
        names |= _family_names(BridgeCollector(LatestStore(), naming=naming).describe())  # type: ignore[arg-type]
    names |= _family_names(ServiceMetrics("any").registry.collect())
    names |= _family_names(Remediator(RemediatorSettings(), client=FakeSlurm(nodes=[])).metrics.registry.collect())
    kinds = {"Counter": "counter", "Gauge": "gauge", "Histogram": "histogram", "Summary": "summary"}
    sources = [*ROOT.glob("services/*/src/**/*.py"), *ROOT.glob("shared/src/**/*.py")]
    assert sources, f"no service sources under {ROOT}"
    for py in sources:
        for kind, name in _CTOR.findall(py.read_text()):
            names |= _family_names([type("M", (), {"name": name, "type": kinds[kind]})()])
    return names


_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right",
             "inf", "nan"}  # fmt: skip


def metric_names_in(expr: str) -> set[str]:
    """Metric (and recording-rule) names a PromQL expression selects: identifiers that are not
    functions, keywords, label names (inside ``{}`` / ``by (...)``), durations or strings."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    out = set()
    for m in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", e):
        name, call = m.group(1), m.group(2)
        if call or name.lower() in _KEYWORDS:
            continue
        out.add(name)
    return out


def test_the_promql_name_extractor_can_fail() -> None:
    assert metric_names_in('sum by (node) (rate(foo_total{a="b"}[5m])) / on(x) bar:rec') == {"foo_total", "bar:rec"}
    assert metric_names_in('time() - gpuwarden_gpu_last_sample_timestamp_seconds{node=~"$node"} > 5') == {
        "gpuwarden_gpu_last_sample_timestamp_seconds"
    }


def rules() -> dict:
    return yaml.safe_load(RULES.read_text())


def recorded() -> dict[str, str]:
    return {r["record"]: r["expr"] for g in rules()["groups"] for r in g["rules"] if "record" in r}


def dashboard_exprs() -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable of the dashboard."""
    d = json.loads(DASHBOARD.read_text())
    out: list[tuple[str, str]] = []

    def walk(panels: list[dict]) -> None:
        for p in panels:
            for t in p.get("targets", []):
                out.append((f"panel {p['title']!r}", t["expr"]))
            walk(p.get("panels", []))

    walk(d["panels"])
    for v in d["templating"]["list"]:
        if v["type"] != "query":
            continue
        q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
        m = re.fullmatch(r"label_values\((.+),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)", q)
        assert m, f"variable {v['name']}: only label_values(selector, label) is used here: {q}"
        out.append((f"variable {v['name']}", m.group(1)))
    return out


def test_promtool_check_rules() -> None:
    res = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


def test_promtool_test_rules() -> None:
    res = subprocess.run(
        [promtool(), "test", "rules", str(RULES_TEST.name)],
        capture_output=True, text=True, timeout=120, cwd=RULES_TEST.parent,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


def test_every_alert_has_severity_summary_and_runbook() -> None:
    for g in rules()["groups"]:
        for r in g["rules"]:
            if "alert" not in r:
                continue
            assert r["labels"]["severity"] in ("critical", "warning", "info"), r["alert"]
            assert r["annotations"]["summary"] and r["annotations"]["runbook_url"].startswith("https://"), r["alert"]
            page = r["annotations"]["runbook_url"].split("/docs/runbooks/")[1].split("#")[0]
            if "{{" not in page:
                assert (ROOT / "docs" / "runbooks" / page).is_file(), page


def test_rules_and_dashboard_name_only_exported_metrics() -> None:
    exported = exported_metric_names() | PROMETHEUS_OWN
    assert {"gpuwarden_gpu_power_watts", "gpuwarden_failure_open", "gpuwarden_consumer_lag_messages",
            "gpuwarden_remediator_breaker_open", "gpuwarden_slurm_watcher_status",
            "gpuwarden_collector_source_calls_total", "gpuwarden_gpus_lost_total"} <= exported  # fmt: skip
    rec = recorded()
    for name, expr in rec.items():
        assert metric_names_in(expr) <= exported, (name, metric_names_in(expr) - exported)
    for g in rules()["groups"]:
        for r in g["rules"]:
            unknown = metric_names_in(r["expr"]) - exported - set(rec)
            assert not unknown, (r.get("alert") or r.get("record"), unknown)
    used: set[str] = set()
    for where, expr in dashboard_exprs():
        names = metric_names_in(expr)
        assert names, f"{where}: no metric in {expr!r}"
        unknown = names - exported - set(rec)
        assert not unknown, f"{where}: {expr!r} names {unknown}, which nothing exports"
        used |= names
    sections = {p["title"] for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] == "row"}
    assert sections == {"Fleet", "Per job", "Per GPU", "Pipeline health"}
    assert "gpuwarden_failure_open" in used and "gpuwarden_remediator_breaker_open" in used


def test_a_dashboard_with_an_unexported_metric_would_fail() -> None:
    exported = exported_metric_names()
    assert metric_names_in('avg(gpuwarden_gpu_utilisation_percent{node="x"})') - exported  # a typo is caught


def test_every_dashboard_expression_parses(tmp_path: Path) -> None:
    exprs = [e for _, e in dashboard_exprs()]
    # Grafana variables replaced by what Grafana substitutes ($var inside a regex matcher)
    body = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"gpuwarden_dashboard:expr{i}", "expr": re.sub(r"\$\{?[a-z_]+\}?", ".*", e)}
        for i, e in enumerate(exprs)]}]}  # fmt: skip
    f = tmp_path / "dashboard-exprs.yml"
    f.write_text(yaml.safe_dump(body))
    res = subprocess.run([promtool(), "check", "rules", str(f)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in res.stdout
