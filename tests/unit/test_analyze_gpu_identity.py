"""`gpuwarden analyze` names when and which GPU (issue 24, part 4): absolute ISO-8601 times in
the terminal and the report, kernel-log findings mapped to the GPU index and job of the telemetry
in the same call (PCI bus id in any spelling, or UUID), and one GPU identity across all files
of a call, so the same GPU failing in two logs under two runs is a repeat offender.

Every recording here is written by the test (a small nvidia-smi CSV and dmesg logs).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import orjson
import pytest
import typer
from typer.testing import CliRunner

from gpuwarden.demo.reports import iso_utc
from gpuwarden.recordings import attach_gpu_ids, load_recording, pci_key
from gpuwarden.recordings.analyze import RUN_GAP_S, AnalyzeResult, analyze_recording, recording_runs
from gpuwarden.recordings.analyze_cli import analyze
from gpuwarden.shared.models import EventKind, GpuEvent, GpuSample

T0 = dt.datetime(2024, 5, 1, 12, 0, 0, tzinfo=dt.UTC)
UUID1 = "GPU-bbbb0000-1111-2222-3333-444444444444"
XID13 = "NVRM: Xid (PCI:0000:9b:00): 13, pid={pid}, name=python, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0)"
XID79 = "NVRM: Xid (PCI:0000:9b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."


def _iso(s: float) -> str:
    return (T0 + dt.timedelta(seconds=s)).strftime("%Y-%m-%dT%H:%M:%S,%f+00:00")


def _csv(path: Path, *, seconds: int = 900, ident: str = "pci") -> Path:
    """Two busy GPUs at 1 Hz from 12:00:00 UTC; GPU 1 is PCI 9b (nvidia-smi's spelling) / UUID1."""
    col = {"pci": "pci.bus_id", "uuid": "uuid"}[ident]
    ids = {"pci": ["00000000:18:00.0", "00000000:9B:00.0"], "uuid": ["GPU-aaaa0000-1111-2222-3333-444444444444", UUID1]}
    lines = [f"timestamp, index, {col}, utilization.gpu [%], power.draw [W], memory.used [MiB]"]
    for s in range(seconds):
        stamp = (T0 + dt.timedelta(seconds=s)).strftime("%Y/%m/%d %H:%M:%S.000")
        for i in (0, 1):
            lines.append(f"{stamp}, {i}, {ids[ident][i]}, 95 %, 400.00 W, 30000 MiB")
    path.write_text("\n".join(lines) + "\n")
    return path


def _log(path: Path, *lines: tuple[float, str]) -> Path:
    path.write_text("".join(f"{_iso(s)} {text}\n" for s, text in lines))
    return path


def _run(*paths: Path) -> AnalyzeResult:
    rec = load_recording(list(paths))
    return analyze_recording(rec.samples, rec.events, fields=rec.fields, spans=list(rec.spans.values()))


def _cli(args: list[str]) -> str:
    app = typer.Typer()
    app.command()(analyze)
    r = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    return r.output


# -- absolute times ------------------------------------------------------------------------------


def test_iso_utc() -> None:
    ts = T0.timestamp()
    assert iso_utc(ts + 184) == "2024-05-01T12:03:04Z"
    assert iso_utc(ts + 301.1234) == "2024-05-01T12:05:01.123Z"
    assert iso_utc(ts + 0.9996) == "2024-05-01T12:00:01Z"
    assert iso_utc(365.97) is None and iso_utc(None) is None and iso_utc(float("nan")) is None


def test_report_and_terminal_give_first_seen_last_seen_and_window_in_utc(tmp_path: Path) -> None:
    log = _log(
        tmp_path / "dmesg.log",
        (184.0, XID13.format(pid=1234)),
        (3 * 3600 + 184.0, XID13.format(pid=1234)),
        (6 * 3600 + 184.0, XID13.format(pid=1234)),
    )
    report = tmp_path / "r.json"
    out = _cli([str(log), "--report", str(report)])
    rep = orjson.loads(report.read_bytes())
    assert rep["recording"]["start_utc"] == "2024-05-01T12:03:04Z"
    assert rep["recording"]["end_utc"] == "2024-05-01T18:03:04Z"
    assert rep["recording"]["duration_s"] == 6 * 3600  # a kernel log alone has a span too
    rows = rep["failures"]
    assert rows and all(r["pattern"] == "xid-application-fault" for r in rows)
    first = rows[0]
    assert first["first_seen_utc"] == "2024-05-01T12:03:04Z" and first["first_seen_s"] == 0
    assert first["last_seen_utc"] is not None and first["window_s"] == first["last_seen_s"] - first["first_seen_s"]
    assert rows[-1]["last_seen_utc"] == "2024-05-01T18:03:04Z"
    assert sum(r["occurrences"] for r in rows) == 3
    assert first["evidence"][0]["ts_utc"] == "2024-05-01T12:03:04Z"
    assert first["pci_bus_id"] == "0000:9b:00.0"
    assert "first seen 2024-05-01T12:03:04Z (t=0 s)" in out
    assert "2024-05-01T12:03:04Z .. 2024-05-01T18:03:04Z" in out


def test_seconds_since_boot_print_no_fake_date_and_boot_time_fixes_them(tmp_path: Path) -> None:
    log = tmp_path / "dmesg.log"
    log.write_text(f"[  301.123456] {XID79}\n")
    report = tmp_path / "r.json"
    _cli([str(log), "--report", str(report)])
    [row] = orjson.loads(report.read_bytes())["failures"]
    assert row["first_seen_utc"] is None and row["pattern"] == "gpu-fallen-off-bus"
    _cli([str(log), "--boot-time", "2024-05-01T12:00:00Z", "--report", str(report)])
    [row] = orjson.loads(report.read_bytes())["failures"]
    assert row["first_seen_utc"] == "2024-05-01T12:05:01.123Z"


def test_boot_time_missing_next_to_wall_clock_telemetry_is_noted(tmp_path: Path) -> None:
    log = tmp_path / "dmesg.log"
    log.write_text(f"[  301.123456] {XID79}\n")
    rec = load_recording([_csv(tmp_path / "gpu.csv", seconds=5), log])
    assert any("--boot-time" in n for n in rec.notes)


# -- kernel-log findings get the telemetry's GPU index and job ----------------------------------


@pytest.mark.parametrize("spelling", ["00000000:9B:00.0", "0000:9b:00", "PCI:0000:9b:00", "9b:00.0", "0000:9B:00.0"])
def test_bus_id_spellings_are_one_gpu(spelling: str) -> None:
    assert pci_key(spelling) == "0000:9b:00.0"
    gpus = [GpuSample(index=3, pci_bus_id=spelling, uuid=UUID1)]
    ev = GpuEvent(
        event_id="e", node="n", ts=1.0, kind=EventKind.XID, code=79, pci_bus_id="0000:9b:00.0", raw="x", source="t"
    )
    [got] = attach_gpu_ids([ev], gpus)
    assert (got.gpu_index, got.gpu_uuid, got.pci_bus_id) == (3, UUID1, "0000:9b:00.0")


def test_kernel_log_finding_gets_gpu_index_and_job_from_the_csv(tmp_path: Path) -> None:
    res = _run(_csv(tmp_path / "gpu.csv"), _log(tmp_path / "dmesg.log", (301.123456, XID79)))
    [f] = [f for f in res.sorted_failures() if f.pattern == "gpu-fallen-off-bus"]
    assert (f.gpu_index, f.job_id, f.pci_bus_id) == (1, "recording", "0000:9b:00.0")
    assert iso_utc(f.first_seen) == "2024-05-01T12:05:01.123Z"


def test_kernel_log_finding_gets_gpu_index_by_uuid(tmp_path: Path) -> None:
    log = _log(
        tmp_path / "dmesg.log",
        (300.0, f"NVRM: GPU at PCI:0000:9b:00: {UUID1}"),
        (301.0, XID79),
    )
    res = _run(_csv(tmp_path / "gpu.csv", ident="uuid"), log)
    [f] = [f for f in res.sorted_failures() if f.pattern == "gpu-fallen-off-bus"]
    assert (f.gpu_index, f.gpu_uuid, f.job_id) == (1, UUID1, "recording")


def test_a_gpu_the_telemetry_does_not_list_is_noted(tmp_path: Path) -> None:
    other = XID79.replace("0000:9b:00", "0000:c1:00")
    rec = load_recording([_csv(tmp_path / "gpu.csv", seconds=5), _log(tmp_path / "d.log", (3.0, other))])
    assert rec.events[0].gpu_index is None
    assert any("0000:c1:00.0" in n and "does not list" in n for n in rec.notes)


def test_terminal_names_index_bus_id_and_job(tmp_path: Path) -> None:
    out = _cli([str(_csv(tmp_path / "gpu.csv")), str(_log(tmp_path / "dmesg.log", (301.123456, XID79)))])
    assert "on recorded-node GPU 1 (0000:9b:00.0), job recording" in out
    assert "first seen 2024-05-01T12:05:01.123Z (t=301 s)" in out


# -- one GPU identity and one job per run across the files of a call ----------------------------


def test_recording_runs() -> None:
    assert recording_runs([], 0.0, 10.0) == [(0.0, 10.0)]
    assert recording_runs([(0.0, 100.0), (50.0, 60.0), (100.0 + RUN_GAP_S, 900.0)], 0.0, 900.0) == [(0.0, 900.0)]
    assert recording_runs([(0.0, 100.0), (5000.0, 5000.0)], 0.0, 5000.0) == [(0.0, 100.0), (5000.0, 5000.0)]


def test_same_gpu_in_two_logs_of_one_call_is_a_repeat_offender(tmp_path: Path) -> None:
    """XID 13 on PCI 9b at 12:03 (during the CSV) and at 14:03 (a second log): two runs, two jobs,
    one GPU (index 1 from the CSV for both logs): repeat-offender-gpu."""
    res = _run(
        _csv(tmp_path / "gpu.csv"),
        _log(tmp_path / "monday.log", (184.0, XID13.format(pid=1234))),
        _log(tmp_path / "tuesday.log", (7384.0, XID13.format(pid=4321))),
    )
    assert [j.job_id for j in res.jobs] == ["recording-1", "recording-2"]
    fails = res.sorted_failures()
    apps = [f for f in fails if f.pattern == "xid-application-fault"]
    assert {(f.gpu_index, f.pci_bus_id, f.job_id) for f in apps} == {
        (1, "0000:9b:00.0", "recording-1"),
        (1, "0000:9b:00.0", "recording-2"),
    }
    [rep] = [f for f in fails if f.pattern == "repeat-offender-gpu"]
    assert (rep.gpu_index, rep.job_id) == (1, "recording-2")
    assert "recording-1, recording-2" in rep.verdict


def test_overlapping_logs_are_one_run_and_one_job(tmp_path: Path) -> None:
    res = _run(
        _csv(tmp_path / "gpu.csv"),
        _log(tmp_path / "a.log", (184.0, XID13.format(pid=1234))),
        _log(tmp_path / "b.log", (600.0, XID13.format(pid=1234))),
    )
    assert [j.job_id for j in res.jobs] == ["recording"]
    assert not [f for f in res.sorted_failures() if f.pattern == "repeat-offender-gpu"]


def test_two_kernel_logs_alone_keep_one_node_and_one_bus_id(tmp_path: Path) -> None:
    res = _run(
        _log(tmp_path / "monday.log", (184.0, XID13.format(pid=1234))),
        _log(tmp_path / "tuesday.log", (7384.0, XID13.format(pid=4321))),
    )
    apps = [f for f in res.sorted_failures() if f.pattern == "xid-application-fault"]
    assert {(f.node, f.pci_bus_id) for f in apps} == {("recorded-node", "0000:9b:00.0")}
    assert [j.job_id for j in res.jobs] == ["recording-1", "recording-2"]


def test_two_kernel_logs_alone_find_the_repeat_offender(tmp_path: Path) -> None:
    res = _run(
        _log(tmp_path / "monday.log", (184.0, XID13.format(pid=1234))),
        _log(tmp_path / "tuesday.log", (7384.0, XID13.format(pid=4321))),
    )
    [rep] = [f for f in res.sorted_failures() if f.pattern == "repeat-offender-gpu"]
    assert (rep.node, rep.pci_bus_id, rep.job_id) == ("recorded-node", "0000:9b:00.0", "recording-2")
    assert "recording-1, recording-2" in rep.verdict


def test_report_lists_each_run_as_a_job(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    _cli(
        [
            str(_csv(tmp_path / "gpu.csv")),
            str(_log(tmp_path / "monday.log", (184.0, XID13.format(pid=1234)))),
            str(_log(tmp_path / "tuesday.log", (7384.0, XID13.format(pid=4321)))),
            "--report",
            str(report),
        ]
    )
    job = orjson.loads(report.read_bytes())["job"]
    assert [(j["job_id"], j["start_utc"], j["gpus"]) for j in job["jobs"]] == [
        ("recording-1", "2024-05-01T12:00:00Z", 2),
        ("recording-2", "2024-05-01T14:03:04Z", 1),
    ]
    assert job["gpu_hours"] == pytest.approx(2 * 899 / 3600, abs=1e-3)
