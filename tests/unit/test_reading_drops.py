"""A reading the sample model cannot hold (a driver's sentinel, a value out of the field's range)
is dropped and named, never the GPU, the node's sample or the file (issue 25's "bad input gets a
clear error and loses nothing"; found reading the readers: one out-of-range value made a whole
nvidia-smi file "not nvidia-smi-xml output" and would fail a collector's every tick).

Each case takes a recorded real output from tests/fixtures, changes one value, and checks that
only that reading went."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gpuwarden.recordings.loader import load_recording
from gpuwarden.shared.nvidia.dcgm_exporter import gpu_records, parse_scrape
from gpuwarden.shared.nvidia.smi_table import parse_nvidia_smi_table
from gpuwarden.shared.nvidia.smi_text import parse_nvidia_smi_csv_samples, parse_nvidia_smi_q
from gpuwarden.shared.nvidia.smi_xml import parse_nvidia_smi_xml
from gpuwarden.shared.nvidia.values import gpu_sample, kept, out_of_range

FIX = Path(__file__).resolve().parents[1] / "fixtures"


def _same_but(a: object, b: object, field: str) -> None:
    da, db = a.model_dump(), b.model_dump()  # type: ignore[attr-defined]
    assert da.pop(field) is not None and db.pop(field) is None
    assert da == db


def test_xml_a_utilisation_over_100_drops_that_reading_only(caplog: pytest.LogCaptureFixture) -> None:
    text = (FIX / "nvidia-smi" / "rtx3080-xml-v13-595.xml").read_text()
    assert text.count("<gpu_util>65 %</gpu_util>") == 1
    good = parse_nvidia_smi_xml(text).gpus[0]
    with caplog.at_level(logging.WARNING):
        bad = parse_nvidia_smi_xml(text.replace("<gpu_util>65 %</gpu_util>", "<gpu_util>150 %</gpu_util>")).gpus[0]
    _same_but(good, bad, "utilization_gpu_pct")
    assert "nvidia-smi XML <gpu> 0: GPU 0: utilization_gpu_pct = 150.0" in caplog.text
    assert "dropped (not reported)" in caplog.text


def test_q_text_a_negative_power_drops_that_reading_only() -> None:
    text = (FIX / "nvidia-smi" / "titanv-q-560.txt").read_text()
    good = parse_nvidia_smi_q(text).gpus[0]
    assert good.power_limit_w is not None
    line = next(ln for ln in text.splitlines() if "Current Power Limit" in ln or "Enforced Power Limit" in ln)
    bad = parse_nvidia_smi_q(text.replace(line, line.split(":")[0] + ": -250.00 W")).gpus[0]
    assert bad.power_limit_w is None and bad.temperature_c == good.temperature_c and bad.uuid == good.uuid


def test_csv_query_a_bad_value_keeps_the_row_and_the_other_rows() -> None:
    text = (FIX / "nvidia-smi" / "query-gpu-csv-2gpu-units-in-values.txt").read_text()
    good = parse_nvidia_smi_csv_samples(text)
    assert isinstance(good, list) and good[0].utilization_gpu_pct == 36.0
    bad = parse_nvidia_smi_csv_samples(text.replace("2856 MiB, 36 %", "2856 MiB, 4294967295 %", 1))
    assert isinstance(bad, list) and len(bad) == len(good) == 2
    _same_but(good[0], bad[0], "utilization_gpu_pct")
    assert bad[1] == good[1]


def test_table_a_bad_value_keeps_the_table() -> None:
    text = (FIX / "nvidia-smi" / "table-550-h100-8gpu-no-procs.txt").read_text()
    good = parse_nvidia_smi_table(text)[0].gpus
    lines = text.splitlines()
    i = next(k for k, ln in enumerate(lines) if ln.startswith("|   3  "))  # GPU 3; its readings below
    assert "     0%" in lines[i + 1]
    lines[i + 1] = lines[i + 1].replace("     0%", "   250%")
    bad = parse_nvidia_smi_table("\n".join(lines) + "\n")[0].gpus
    assert len(bad) == 8
    _same_but(good[3], bad[3], "utilization_gpu_pct")
    assert bad[:3] == good[:3] and bad[4:] == good[4:]


def test_dcgm_exporter_a_sentinel_is_left_out_and_named() -> None:
    text = (FIX / "dcgm" / "dcgm-exporter-v100-2gpu-excerpt.txt").read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith('DCGM_FI_DEV_SM_CLOCK{gpu="0"'))
    drops: list[tuple[str, str]] = []
    recs = gpu_records(
        parse_scrape(text.replace(line, line.rsplit(" ", 1)[0] + " -5")), on_drop=lambda f, m: drops.append((f, m))
    )
    assert len(recs) == 2
    assert [f for f, _ in drops] == ["sm_clock_mhz"] and "= -5" in drops[0][1]
    first = next(iter(recs.values()))
    assert "sm_clock_mhz" not in first and "sm_clock_mhz" in list(recs.values())[1]


def test_a_csv_log_with_one_bad_value_is_read_with_a_note(tmp_path: Path) -> None:
    lines = (FIX / "recordings" / "custom-iso-logger-8gpu.csv").read_text().splitlines()
    assert lines[1].endswith(", 100, 387.26")
    lines[1] = lines[1].replace(", 100, 387.26", ", 250, 387.26")
    p = tmp_path / "log.csv"
    p.write_text("\n".join(lines) + "\n")
    good = load_recording([FIX / "recordings" / "custom-iso-logger-8gpu.csv"])
    rec = load_recording([p])
    assert len(rec.samples) == len(good.samples)
    assert [n for n in rec.notes if "utilization.gpu = 250.0 is out of range [0, 100]: dropped" in n], rec.notes


def test_gpu_sample_refuses_only_a_bad_index() -> None:
    with pytest.raises(ValueError, match="index"):
        gpu_sample({"index": 99, "power_w": 10.0}, "here")
    g = gpu_sample({"index": 1, "power_w": -3.0, "uuid": "has a space", "throttle_reasons": ["ok", "$(id)"]}, "here")
    assert (g.index, g.power_w, g.uuid, g.throttle_reasons) == (1, None, None, [])
    assert kept("fan_speed_pct", 110.0, "here") == 110.0  # NVML: may exceed 100 %
    assert kept("utilization_gpu_pct", 101.0, "here", lambda f, m: None) is None
    assert out_of_range("temperature_c", 1e6) is None  # no bounds: a reading
    assert out_of_range("power_w", float("nan")) == "power_w = nan is not a finite number"
