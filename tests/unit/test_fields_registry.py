"""The field registry (``gpuwarden/shared/fields.csv``) agrees with the model and with every
reader and writer that takes its table from it (issue 27, item 1)."""

from __future__ import annotations

import inspect
import re
import shutil
import types
import typing
from importlib.resources import files
from pathlib import Path

import pynvml
import pytest

from gpuwarden.collector.sources import nvml as nvml_source
from gpuwarden.otlp_bridge.catalog import catalog_entries
from gpuwarden.otlp_bridge.dcgm import _DCGM_COMPUTED, DCGM_METRICS
from gpuwarden.recordings.dmon import DMON_COLUMNS
from gpuwarden.shared.fields import FIELDS, UNITS, FieldSpec, by_dcgm, by_field, dcgm_read_map, load_fields
from gpuwarden.shared.models import GpuSample
from gpuwarden.shared.nvidia import dcgm_exporter as collector_dcgm
from gpuwarden.shared.nvidia.dcgm_exporter import DCGM_FIELDS, gpu_records, parse_dcgm_exporter_scrape, parse_scrape
from gpuwarden.shared.nvidia.smi_text import CSV_ALIASES, CSV_SAMPLE_FIELDS, parse_nvidia_smi_csv_samples

SHIPPED = Path(str(files("gpuwarden.shared").joinpath("fields.csv")))
ROWS = by_field()


def _base_type(ann: object) -> str:
    """``float | None`` -> "float", ``Optional[Annotated[str, ...]]`` -> "str", ``list[...]`` -> "list"."""
    origin = typing.get_origin(ann)
    if origin is typing.Annotated:
        return _base_type(typing.get_args(ann)[0])
    if origin in (typing.Union, types.UnionType):
        (inner,) = [a for a in typing.get_args(ann) if a is not type(None)]
        return _base_type(inner)
    if origin is list:
        return "list"
    assert isinstance(ann, type), ann
    return ann.__name__


#: The unit a GpuSample description states: ", <unit>" at its end or before " (" / " of".
_UNIT_RE = re.compile(r", (" + "|".join(re.escape(u) for u in UNITS) + r")(?=$| \(| of )")


def test_every_gpusample_field_has_one_row_in_model_order() -> None:
    assert [f.field for f in FIELDS] == list(GpuSample.model_fields)


@pytest.mark.parametrize("name", list(GpuSample.model_fields))
def test_row_type_and_unit_match_the_model(name: str) -> None:
    info = GpuSample.model_fields[name]
    row = ROWS[name]
    assert row.type == _base_type(info.annotation)
    stated = _UNIT_RE.findall(info.description or "")
    assert stated == ([row.unit] if row.unit else []), (info.description, row.unit)


def test_unit_regex_reads_the_forms_the_model_uses() -> None:
    got = {n: _UNIT_RE.findall(GpuSample.model_fields[n].description or "") for n in
           ("power_w", "fan_speed_pct", "ecc_sbe_aggregate", "sm_occupancy_pct", "pcie_link_gen")}  # fmt: skip
    assert got == {"power_w": ["W"], "fan_speed_pct": ["%"], "ecc_sbe_aggregate": ["count"],
                   "sm_occupancy_pct": ["%"], "pcie_link_gen": []}  # fmt: skip


# -- DCGM: the collector's reader and the bridge's writer -------------------------------------


def test_the_collector_reads_the_registry_map() -> None:
    assert dcgm_read_map() == DCGM_FIELDS
    assert DCGM_FIELDS["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == ("energy_j", 0.001)
    assert DCGM_FIELDS["DCGM_FI_PROF_SM_OCCUPANCY"] == ("sm_occupancy_pct", 100.0)


def test_every_dcgm_field_the_collector_reads_is_in_the_registry() -> None:
    registry = {d for f in FIELDS for d in f.dcgm_field}
    nvlink = {n for n in registry if collector_dcgm._NVLINK_RE.match(n)}
    assert len(nvlink) == 4
    read_in_code = set(collector_dcgm._THROTTLE) | nvlink
    assert read_in_code <= set(ROWS["throttle_reasons"].dcgm_field) | set(ROWS["nvlinks"].dcgm_field)
    assert set(DCGM_FIELDS) <= registry
    # the two the reader uses that feed no field of their own: a fallback and an event
    assert collector_dcgm._GR_ACTIVE not in registry and "GR_ENGINE_ACTIVE" in ROWS["utilization_gpu_pct"].description
    assert collector_dcgm._XID not in registry
    # every 1.x name the reader renames to a mapped field maps to a registry name
    assert {v for v in collector_dcgm.DCGM_1X_NAMES.values() if v in DCGM_FIELDS} <= registry


def test_every_dcgm_field_the_bridge_writes_is_in_the_registry() -> None:
    registry = {d for f in FIELDS for d in f.dcgm_field}
    written = {e.name for e in catalog_entries("dcgm")}
    assert {m.name for m in DCGM_METRICS} == written
    # the last XID is a GpuView value, no GpuSample field; everything else has a row
    assert written - registry == {"DCGM_FI_DEV_XID_ERRORS"}
    assert {f.dcgm_field[0] for f in FIELDS if f.type != "list" and f.dcgm_write} <= written
    assert set(_DCGM_COMPUTED) - {"DCGM_FI_DEV_XID_ERRORS"} <= registry


def test_both_directions_agree_on_the_scale_where_both_use_a_field() -> None:
    from gpuwarden.otlp_bridge.metrics import GpuView

    g = GpuSample(index=0, energy_j=12.5, sm_occupancy_pct=40.0, remapped_rows_pending=True, ecc_sbe_volatile=3)
    written = {m.name: m.value(GpuView(g)) for m in DCGM_METRICS}
    for dname in ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_PROF_SM_OCCUPANCY", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"):
        fname, factor = DCGM_FIELDS[dname]
        assert written[dname] is not None
        assert written[dname] * factor == pytest.approx(getattr(g, fname)), dname
    assert written["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == 12500.0
    assert written["DCGM_FI_DEV_ROW_REMAP_PENDING"] == 1.0


# -- the bridge's metrics.csv, nvidia-smi, dmon, NVML -----------------------------------------


def test_otel_keys_name_metrics_csv_rows_and_cover_the_gpu_metrics() -> None:
    keys = {e.key for e in catalog_entries("otel")}
    named = {k for f in FIELDS for k in f.otel_key}
    assert named <= keys, named - keys
    assert keys <= named, keys - named  # every per-GPU OTel metric says which fields feed it


def test_every_smi_query_name_the_csv_readers_use_is_a_row_smi_query() -> None:
    registry = {q for f in FIELDS for q in f.smi_query}
    used = {q for _, qs, _ in CSV_SAMPLE_FIELDS for q in qs}
    assert used <= registry
    assert {f for f, _, _ in CSV_SAMPLE_FIELDS} == {f.field for f in FIELDS if f.smi_query} - {"index"}
    # custom loggers' aliases point at query names the registry knows (timestamp: the row's time)
    assert set(CSV_ALIASES.values()) - {"timestamp"} <= registry


def test_csv_columns_reach_their_fields() -> None:
    got = parse_nvidia_smi_csv_samples(
        "index, pstate, pci.bus_id, power.limit [W], clocks.max.gr [MHz]\n0, P2, 00000000:3B:00.0, 300.00 W, 1410 MHz\n"
    )
    assert not isinstance(got, Exception)
    g = got[0]
    assert (g.performance_state, g.pci_bus_id, g.power_limit_w, g.power_management_limit_w) == (
        2, "0000:3b:00.0", 300.0, 300.0)  # fmt: skip
    assert g.max_graphics_clock_mhz == 1410.0


def test_dmon_columns_are_the_registry_rows() -> None:
    assert {f.dmon: (f.field, f.dmon_scale) for f in FIELDS if f.dmon and f.field != "index"} == DMON_COLUMNS
    assert DMON_COLUMNS["rxpci"] == ("pcie_rx_kbps", 1000.0)


_NVML_RE = re.compile(r"^(?P<fn>nvml\w+)(?:\((?P<args>[A-Z0-9_, ]*)\))?(?:\.\w+|\[\d\])?$")


@pytest.mark.parametrize("row", [f for f in FIELDS if f.nvml], ids=lambda f: f.field)
def test_nvml_column_names_calls_pynvml_has_and_the_nvml_source_makes(row: FieldSpec) -> None:
    m = _NVML_RE.match(row.nvml)
    assert m, row.nvml
    assert callable(getattr(pynvml, m["fn"], None)), m["fn"]
    args = [a.strip() for a in (m["args"] or "").split(",") if a.strip()]
    assert all(hasattr(pynvml, a) for a in args), args
    src = inspect.getsource(nvml_source)
    assert f'"{m["fn"]}"' in src, f"the NVML source does not call {m['fn']}"
    assert all(a in src for a in args), args


# -- one row added: it reaches the reader ----------------------------------------------------


def test_a_row_added_to_a_copy_of_fields_csv_reaches_the_dcgm_reader(tmp_path: Path) -> None:
    path = tmp_path / "fields.csv"
    shutil.copy(SHIPPED, path)
    with path.open("a", encoding="utf-8") as fh:
        fh.write("widget_activity_pct,float,%,,,,,,,DCGM_FI_PROF_WIDGET_ACTIVE,100,read,,Widget activity\n")
    reg = load_fields(path)
    assert len(reg) == len(FIELDS) + 1
    assert by_dcgm(reg)["DCGM_FI_PROF_WIDGET_ACTIVE"].field == "widget_activity_pct"
    scrape = (
        "# HELP DCGM_FI_PROF_WIDGET_ACTIVE Ratio of cycles the widget is active.\n"
        "# TYPE DCGM_FI_PROF_WIDGET_ACTIVE gauge\n"
        'DCGM_FI_PROF_WIDGET_ACTIVE{gpu="0",UUID="GPU-1",pci_bus_id="00000000:3B:00.0"} 0.25\n'
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-1",pci_bus_id="00000000:3B:00.0"} 41\n'
    )
    series = parse_scrape(scrape)
    (rec,) = gpu_records(series, "scrape", fields=reg).values()
    assert rec["widget_activity_pct"] == 25.0
    assert rec["temperature_c"] == 41.0
    # the shipped registry has no such row: the same scrape gives no such attribute
    (plain,) = gpu_records(series).values()
    assert "widget_activity_pct" not in plain and plain["temperature_c"] == 41.0
    assert "widget_activity_pct" not in parse_dcgm_exporter_scrape(scrape)["gpus"][0]


def test_a_bad_row_is_refused_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "fields.csv"
    shutil.copy(SHIPPED, path)
    with path.open("a", encoding="utf-8") as fh:
        fh.write("power_w,float,W,,,,,,,DCGM_FI_DEV_POWER_USAGE,1,read,,again\n")
    with pytest.raises(ValueError, match=rf"line {len(FIELDS) + 2}: field power_w is also on line"):
        load_fields(path)
    path.write_text(SHIPPED.read_text().replace("energy_j,float,J", "energy_j,float,kWh"))
    with pytest.raises(ValueError, match="unit 'kWh'"):
        load_fields(path)
