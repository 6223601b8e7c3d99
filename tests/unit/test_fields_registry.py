"""The field registry (``gpuwarden/shared/fields.csv``) agrees with the model and with every
reader and writer that takes its table from it, and one row added to a copy of it reaches the
model, the readers and the bridge's export (issue 27, item 1)."""

from __future__ import annotations

import contextlib
import inspect
import logging
import re
import shutil
import types
import typing
from collections.abc import Iterator
from importlib.resources import files
from pathlib import Path
from typing import Any

import pydantic
import pynvml
import pytest
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuwarden.collector.sources import NvmlSource
from gpuwarden.collector.sources import nvml as nvml_source
from gpuwarden.otlp_bridge.catalog import build_catalog, catalog_entries
from gpuwarden.otlp_bridge.dcgm import _DCGM_COMPUTED, DCGM_METRICS
from gpuwarden.otlp_bridge.encoder import MetricEncoder
from gpuwarden.otlp_bridge.metrics import GPU_METRICS, gpu_metrics
from gpuwarden.otlp_bridge.prom import BridgeCollector
from gpuwarden.otlp_bridge.store import LatestStore
from gpuwarden.recordings.dmon import DMON_COLUMNS
from gpuwarden.shared import fieldgen, models
from gpuwarden.shared.fields import (
    FIELDS,
    UNITS,
    FieldSpec,
    by_dcgm,
    by_field,
    dcgm_read_map,
    load_fields,
    smi_q_fields,
    smi_table_fields,
    smi_xml_fields,
)
from gpuwarden.shared.models import MAX_GPU_INDEX, AttributedSample, GpuSample, NodeSample
from gpuwarden.shared.nvidia import dcgm_exporter as collector_dcgm
from gpuwarden.shared.nvidia.dcgm_exporter import DCGM_FIELDS, gpu_records, parse_dcgm_exporter_scrape, parse_scrape
from gpuwarden.shared.nvidia.smi_table import TABLE_CELLS, parse_nvidia_smi_table
from gpuwarden.shared.nvidia.smi_text import (
    CSV_ALIASES,
    CSV_SAMPLE_FIELDS,
    Q_IN_CODE,
    SmiError,
    parse_nvidia_smi_csv_samples,
    parse_nvidia_smi_q,
)
from gpuwarden.shared.nvidia.smi_xml import XML_IN_CODE, parse_nvidia_smi_xml

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


def test_the_model_is_generated_from_the_registry() -> None:
    """``python -m gpuwarden.shared.fieldgen --check``: models.py's GpuSample block is what the
    registry generates (a stale block: run ``python -m gpuwarden.shared.fieldgen``)."""
    assert not fieldgen.generate(check=True), "GpuSample is stale: run python -m gpuwarden.shared.fieldgen"
    assert fieldgen.main(["--check"]) == 0
    assert fieldgen.gpu_sample_model() is GpuSample


@pytest.mark.parametrize("name", list(GpuSample.model_fields))
def test_row_description_and_bounds_are_the_models(name: str) -> None:
    info, row = GpuSample.model_fields[name], ROWS[name]
    assert (info.description or "") == row.description
    bounds = {type(m).__name__.lower(): getattr(m, type(m).__name__.lower()) for m in info.metadata
              if type(m).__name__ in ("Ge", "Le")}  # fmt: skip
    want = {k: MAX_GPU_INDEX if v == "MAX_GPU_INDEX" else float(v) for k, v in (("ge", row.ge), ("le", row.le)) if v}
    assert bounds == want


def test_the_generator_lays_out_and_refuses_like_the_model() -> None:
    row = ROWS["utilization_gpu_pct"]
    assert fieldgen.render_field(row) == (
        "    utilization_gpu_pct: float | None = Field(\n"
        '        None, ge=0, le=100, description="GPU (SM) utilisation over the last sample period, %"\n    )'
    )
    assert fieldgen.render_field(ROWS["vbios_version"]) == "    vbios_version: str | None = None"
    with pytest.raises(ValueError, match="written by hand"):
        fieldgen.render_field(ROWS["nvlinks"])
    with pytest.raises(ValueError, match="not a number constant"):
        fieldgen.render_field(row.model_copy(update={"le": "NO_SUCH_CONSTANT"}))
    with pytest.raises(ValueError, match="too long"):
        fieldgen.render_field(row.model_copy(update={"description": "x" * 190}))
    text = Path(models.__file__).read_text()
    with pytest.raises(ValueError, match="list field gpu_widgets needs its declaration"):
        fieldgen.block([*FIELDS, FieldSpec(field="gpu_widgets", type="list")], text)


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
    assert collector_dcgm._GR_ACTIVE not in registry and "GR_ENGINE_ACTIVE" in ROWS["utilization_gpu_pct"].notes
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
    named = {k for f in FIELDS for k in f.otel_key} | {f.field for f in FIELDS if f.otel_name}
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


def test_the_xml_reader_reads_every_other_scalar_row_from_its_paths() -> None:
    with_paths = {f for f, _, _ in smi_xml_fields()}
    assert with_paths >= XML_IN_CODE  # what code reads, the registry documents
    # a GPU whose every registry path holds a value: each generically read field has it
    leaves: dict[str, str] = {}
    for f, paths, t in smi_xml_fields():
        if f not in XML_IN_CODE:
            leaves[paths[-1]] = {"float": "12.5 W", "int": "7", "bool": "Yes", "str": "X-1"}[t]
    xml = "<nvidia_smi_log><gpu>" + "".join(_xml_element(p, v) for p, v in leaves.items()) + "</gpu></nvidia_smi_log>"
    (g,) = parse_nvidia_smi_xml(xml).gpus
    want = {"float": 12.5, "int": 7, "bool": True, "str": "X-1"}
    for f, _, t in smi_xml_fields():
        if f not in XML_IN_CODE:
            assert getattr(g, f) == want[t], f


def test_the_q_text_reader_reads_every_other_scalar_row_from_its_paths() -> None:
    with_paths = {f for f, _, _ in smi_q_fields()}
    assert with_paths | Q_IN_CODE >= {f for f, _, _ in smi_xml_fields()}  # -q has what -q -x has
    # a GPU block whose every registry path holds a value (each path once: the first one read)
    text = {"float": "12.5 W", "int": "7", "bool": "Yes", "str": "X-1", "pstate": "P2", "pci": "00000000:3B:00.0"}
    tree: dict[str, Any] = {}
    for f, paths, kind in smi_q_fields():
        if f not in Q_IN_CODE:
            node = tree
            *heads, leaf = paths[0].split("/")
            for h in heads:
                node = node.setdefault(h, {})
            node[leaf] = text[kind]
    report = "==============NVSMI LOG==============\n\nDriver Version : 1\n\nGPU 00000000:3B:00.0\n" + _q_lines(tree, 1)
    got = parse_nvidia_smi_q(report)
    assert not isinstance(got, SmiError)
    (g,) = got.gpus
    want = {"float": 12.5, "int": 7, "bool": True, "str": "X-1", "pstate": 2, "pci": "0000:3b:00.0"}
    for f, _, kind in smi_q_fields():
        if f not in Q_IN_CODE:
            assert getattr(g, f) == want[kind], f


def _q_lines(tree: dict[str, Any], depth: int) -> str:
    out = ""
    for k, v in tree.items():
        if isinstance(v, dict):
            out += "    " * depth + f"{k}\n" + _q_lines(v, depth + 1)
        else:
            out += "    " * depth + f"{k:<34}: {v}\n"
    return out


def _xml_element(path: str, value: str) -> str:
    head, _, rest = path.partition("/")
    return f"<{head}>{_xml_element(rest, value) if rest else value}</{head}>"


def test_dmon_columns_are_the_registry_rows() -> None:
    assert {f.dmon: (f.field, f.dmon_scale) for f in FIELDS if f.dmon and f.field != "index"} == DMON_COLUMNS
    assert DMON_COLUMNS["rxpci"] == ("pcie_rx_kbps", 1000.0)


@pytest.mark.parametrize("row", [f for f in FIELDS if f.nvml], ids=lambda f: f.field)
def test_nvml_column_names_calls_pynvml_has_and_the_nvml_source_makes(row: FieldSpec) -> None:
    r = row.nvml_read
    assert r is not None and callable(getattr(pynvml, r.call, None)), row.nvml
    assert all(isinstance(getattr(pynvml, a), int) for a in r.args), r.args
    generic = {x.field: x for x in nvml_source.nvml_reads()}
    if row.field in nvml_source.NVML_IN_CODE:
        # read in code: the source makes the call itself
        src = inspect.getsource(nvml_source)
        assert f'"{r.call}"' in src, f"the NVML source does not call {r.call}"
        assert all(a in src for a in r.args), r.args
        assert row.field not in generic
    else:
        assert row.type != "list", "a list field is read in code: name it in NVML_IN_CODE"
        g = generic[row.field]
        assert (g.call, g.args, g.attr, g.item) == (r.call, r.constants(), r.attr, r.item)


def test_nvml_in_code_names_registry_rows_only() -> None:
    assert {f.field for f in FIELDS if f.nvml} >= nvml_source.NVML_IN_CODE


@pytest.mark.parametrize(
    ("cell", "why"),
    [
        ("nvmlDeviceGetNoSuchThing", "pynvml has no function"),
        ("nvmlDeviceGetClockInfo(NVML_NO_SUCH_CLOCK)", "no integer constant"),
        ("nvmlDeviceGetClockInfo(NVML_CLOCK_SM", "is not FUNCTION"),
        ("nvmlDeviceGetMemoryInfo.used.more", "is not FUNCTION"),
        ("os.system", "is not FUNCTION"),
    ],
)
def test_an_nvml_cell_that_is_no_pynvml_call_is_refused_with_its_line(tmp_path: Path, cell: str, why: str) -> None:
    path = tmp_path / "fields.csv"
    shutil.copy(SHIPPED, path)
    with path.open("a", encoding="utf-8") as fh:
        fh.write(WIDGET_ROW.replace("nvmlDeviceGetDecoderUtilization[0]", f'"{cell}"', 1))
    with pytest.raises(ValueError, match=f"line {len(FIELDS) + 2} \\(field widget_activity_pct\\).*{why}"):
        load_fields(path)


# -- one row added: it reaches the model, the readers and the bridge ---------------------------

#: The dummy field of the tests below: a percentage with a ``--query-gpu`` name, two
#: ``nvidia-smi -q -x`` paths (first present wins), a DCGM field read by the collector (a ratio:
#: x 100) and an OTel metric of its own. One line, as a contributor writes it.
WIDGET_ROW = (
    "widget_activity_pct,float,%,,0,100,nvmlDeviceGetDecoderUtilization[0],,,widget.activity,,"
    "widget/activity_util;widget/activity,"
    "Utilization/Widget;Widget Activity,,,,"
    'DCGM_FI_PROF_WIDGET_ACTIVE,100,read,,gpuwarden.gpu.widget.activity,,"Widget activity, %",test row\n'
)


def _widget(g: GpuSample) -> Any:
    """The dummy field of a sample of the temporary registry's model (mypy knows the shipped one)."""
    return g.model_dump()["widget_activity_pct"]


def _with_widget(tmp_path: Path) -> tuple[FieldSpec, ...]:
    path = tmp_path / "fields.csv"
    shutil.copy(SHIPPED, path)
    with path.open("a", encoding="utf-8") as fh:
        fh.write(WIDGET_ROW)
    reg = load_fields(path)
    assert len(reg) == len(FIELDS) + 1
    return reg


def test_a_row_added_to_a_copy_of_fields_csv_reaches_the_dcgm_reader(tmp_path: Path) -> None:
    reg = _with_widget(tmp_path)
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
    assert _widget(fieldgen.gpu_sample_model(reg)(index=0, **rec)) == 25.0
    # the shipped registry has no such row: the same scrape gives no such attribute
    (plain,) = gpu_records(series).values()
    assert "widget_activity_pct" not in plain and plain["temperature_c"] == 41.0
    assert "widget_activity_pct" not in parse_dcgm_exporter_scrape(scrape)["gpus"][0]


def test_a_row_added_to_a_copy_of_fields_csv_reaches_the_model(tmp_path: Path) -> None:
    reg = _with_widget(tmp_path)
    model = fieldgen.gpu_sample_model(reg)
    assert issubclass(model, GpuSample) and model is not GpuSample
    assert list(model.model_fields) == [f.field for f in reg]
    info = model.model_fields["widget_activity_pct"]
    assert info.description == "Widget activity, %" and info.default is None
    g = model(index=1, widget_activity_pct=42.5)  # type: ignore[call-arg]  # a field mypy cannot see
    assert _widget(g) == 42.5 and _widget(model(index=1)) is None
    for bad in (-1, 100.5, "busy"):
        with pytest.raises(pydantic.ValidationError, match="widget_activity_pct"):
            model(index=1, widget_activity_pct=bad)  # type: ignore[call-arg]
    # what the generator would write into models.py: the shipped block plus one line
    text = Path(models.__file__).read_text()
    new = fieldgen.rewrite(reg, text)
    added = set(new.splitlines()) - set(text.splitlines())
    assert added == {
        '    widget_activity_pct: float | None = Field(None, ge=0, le=100, description="Widget activity, %")'
    }
    # the shipped model has no such field, and refuses it (extra="forbid")
    with pytest.raises(pydantic.ValidationError, match="widget_activity_pct"):
        GpuSample(index=1, widget_activity_pct=42.5)  # type: ignore[call-arg]


def test_a_row_added_to_a_copy_of_fields_csv_reaches_the_csv_xml_and_q_readers(tmp_path: Path) -> None:
    reg = _with_widget(tmp_path)
    csv_text = (
        "index, name, widget.activity [%], temperature.gpu\n"
        "0, NVIDIA H100 80GB HBM3, 42 %, 40\n"
        "1, NVIDIA H100 80GB HBM3, [N/A], 41\n"
    )
    got = parse_nvidia_smi_csv_samples(csv_text, reg)
    assert isinstance(got, list)
    assert [(g.index, _widget(g), g.temperature_c) for g in got] == [
        (0, 42.0, 40.0), (1, None, 41.0)]  # fmt: skip
    plain = parse_nvidia_smi_csv_samples(csv_text)
    assert isinstance(plain, list) and "widget_activity_pct" not in plain[0].model_dump()
    xml = """<?xml version="1.0" ?>
<nvidia_smi_log>
  <driver_version>550.54.15</driver_version>
  <gpu id="00000000:3B:00.0">
    <product_name>NVIDIA H100 80GB HBM3</product_name>
    <minor_number>0</minor_number>
    <temperature><gpu_temp>40 C</gpu_temp></temperature>
    <widget><activity_util>37 %</activity_util></widget>
  </gpu>
  <gpu id="00000000:5D:00.0">
    <minor_number>1</minor_number>
    <widget><activity_util>N/A</activity_util><activity>12 %</activity></widget>
  </gpu>
  <gpu id="00000000:9A:00.0">
    <minor_number>2</minor_number>
    <widget><activity_util>[N/A]</activity_util></widget>
  </gpu>
</nvidia_smi_log>
"""
    rep = parse_nvidia_smi_xml(xml, reg)
    assert [(g.index, _widget(g)) for g in rep.gpus] == [(0, 37.0), (1, 12.0), (2, None)]
    assert rep.gpus[0].temperature_c == 40.0 and rep.gpus[0].pci_bus_id == "0000:3b:00.0"
    # the row's bounds hold: 137 % is dropped and named (not the GPU, not the file)
    bad = xml.replace("37 %", "137 %")
    drops: list[str] = []
    with _capture_drops(drops):
        got_bad = parse_nvidia_smi_xml(bad, reg).gpus
    assert [(g.index, _widget(g)) for g in got_bad] == [(0, None), (1, 12.0), (2, None)]
    assert got_bad[0].temperature_c == 40.0
    assert any("widget_activity_pct = 137.0" in d for d in drops), drops
    assert "widget_activity_pct" not in parse_nvidia_smi_xml(xml).gpus[0].model_dump()
    # the -q text reader: its smi_q paths, the first that reads a value
    q = (
        "==============NVSMI LOG==============\n\nDriver Version : 550.54.15\n\n"
        "GPU 00000000:3B:00.0\n    Minor Number                      : 0\n    Utilization\n"
        "        Gpu                               : 90 %\n        Widget                            : N/A\n"
        "    Widget Activity                       : 37 %\n"
        "GPU 00000000:3C:00.0\n    Minor Number                      : 1\n    Utilization\n"
        "        Widget                            : 12 %\n"
    )
    got_q = parse_nvidia_smi_q(q, reg)
    assert not isinstance(got_q, SmiError)
    assert [(g.index, _widget(g), g.utilization_gpu_pct) for g in got_q.gpus] == [(0, 37.0, 90.0), (1, 12.0, None)]
    plain_q = parse_nvidia_smi_q(q)
    assert not isinstance(plain_q, SmiError) and "widget_activity_pct" not in plain_q.gpus[0].model_dump()


def test_a_row_added_to_a_copy_of_fields_csv_reaches_the_exported_metrics(tmp_path: Path) -> None:
    reg = _with_widget(tmp_path)
    entry = next(e for e in build_catalog(reg) if e.key == "widget_activity_pct")
    assert (entry.naming, entry.name, entry.unit, entry.instrument, entry.prom_name, entry.description) == (
        "otel", "gpuwarden.gpu.widget.activity", "1", "gauge", "gpuwarden_gpu_widget_activity_ratio",
        "Widget activity, ratio 0-1")  # fmt: skip
    specs = gpu_metrics(reg)
    assert [s.key for s in specs] == [*(s.key for s in GPU_METRICS), "widget_activity_pct"]
    model = fieldgen.gpu_sample_model(reg)
    gpus = [model(index=0, uuid="GPU-0", widget_activity_pct=42.0, temperature_c=40.0),  # type: ignore[call-arg]
            model(index=1, uuid="GPU-1")]  # fmt: skip
    store = LatestStore()
    store.update_sample(AttributedSample(sample=NodeSample(node="n1", ts=1000.0, collector_id="c", source="s",
                                                           gpus=gpus)))  # fmt: skip
    # OTLP: the bridge's encoder sends it, in its OTel unit, for the GPU that reports it only
    enc = MetricEncoder(Resource({}), "s", "1", gpu_metrics=specs)
    requests, _ = enc.encode(store.views(), store.failure_counts(), [])
    sent: dict[str, Any] = {}
    for req, _ in requests:
        parsed = metrics_service_pb2.ExportMetricsServiceRequest.FromString(req.SerializeToString())
        sent |= {m.name: m for rm in parsed.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    m = sent["gpuwarden.gpu.widget.activity"]
    assert (m.unit, m.description, m.WhichOneof("data")) == ("1", "Widget activity, ratio 0-1", "gauge")
    points = {next(a.value.string_value for a in p.attributes if a.key == "hw.id"): p.as_double
              for p in m.gauge.data_points}  # fmt: skip
    assert points == {"GPU-0": pytest.approx(0.42)}
    assert "hw.temperature" in sent
    # Prometheus: the bridge's /metrics collector
    registry = CollectorRegistry()
    registry.register(BridgeCollector(store, gpu_metrics=specs))
    fams = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    (sample,) = fams["gpuwarden_gpu_widget_activity_ratio"].samples
    assert sample.value == pytest.approx(0.42) and sample.labels["gpu"] == "0"
    # the shipped registry exports no such metric
    enc = MetricEncoder(Resource({}), "s", "1")
    requests, _ = enc.encode(store.views(), store.failure_counts(), [])
    names = {
        m.name for req, _ in requests for rm in req.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
    }
    assert "hw.temperature" in names and "gpuwarden.gpu.widget.activity" not in names


def test_a_registry_metric_that_clashes_with_metrics_csv_is_refused() -> None:
    clash = FieldSpec(field="utilization", type="float", unit="%", otel_name="gpuwarden.gpu.other", description="x, %")
    with pytest.raises(ValueError, match=r"\['utilization'\] have the key of a metrics.csv row"):
        build_catalog([*FIELDS, clash])
    shared = FieldSpec(field="board_power_w", type="float", unit="W", otel_name="hw.power", description="Board, W")
    with pytest.raises(ValueError, match=r"rows named hw\.power disagree"):
        build_catalog([*FIELDS, shared])
    prom = FieldSpec(field="utilization_pct", type="float", unit="%", otel_name="gpuwarden.gpu.util", description="U")
    with pytest.raises(ValueError, match=r"Prometheus names of metrics\.csv rows \['gpuwarden_gpu_utilization_ratio'"):
        build_catalog([*FIELDS, prom])
    with pytest.raises(ValueError, match="otel_name needs a number or bool field"):
        FieldSpec(field="label", type="str", otel_name="gpuwarden.gpu.label")
    # two registry rows of one Prometheus name: two HELP/TYPE blocks, a scrape Prometheus refuses
    a = FieldSpec(field="gizmo_pct", type="float", unit="%", otel_name="gpuwarden.gpu.gizmo.a", description="A, %")
    b = FieldSpec(field="gizmo", type="float", unit="%", otel_name="gpuwarden.gpu.gizmo.b", description="B, %")
    with pytest.raises(ValueError, match=r"\['gizmo_pct', 'gizmo'\] make gpuwarden_gpu_gizmo_ratio"):
        build_catalog([*FIELDS, a, b])


def test_a_bad_row_is_refused_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "fields.csv"
    shutil.copy(SHIPPED, path)
    with path.open("a", encoding="utf-8") as fh:
        fh.write(_row(field="power_w", type="float", unit="W", ge=0, dcgm_field="DCGM_FI_DEV_POWER_USAGE",
                      dcgm_scale=1, dcgm_dir="read", description="again"))  # fmt: skip
    with pytest.raises(ValueError, match=rf"line {len(FIELDS) + 2}: field power_w is also on line"):
        load_fields(path)
    path.write_text(SHIPPED.read_text().replace("energy_j,float,J", "energy_j,float,kWh"))
    with pytest.raises(ValueError, match="unit 'kWh'"):
        load_fields(path)


def _row(**cells: object) -> str:
    cols = SHIPPED.read_text(encoding="utf-8").splitlines()[0].split(",")
    return ",".join(str(cells.get(c, "")) for c in cols) + "\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (lambda t: t + _row(field="class", type="float", unit="%"), "cannot be a GpuSample attribute"),
        (lambda t: t + _row(field="model_dump", type="float", unit="%"), "cannot be a GpuSample attribute"),
        (lambda t: t + _row(field="gizmo_pct", type="float", unit="%", ge=100, le=0), "ge 100 is above le 0"),
        (lambda t: t + _row(field="gizmo_count", type="int", unit="count", ge=0.5), "bounds are whole numbers"),
        (lambda t: t + _row(field="gizmo_pct", type="float", unit="%", description="a\u2028b"), "must be printable"),
        (lambda t: t + _row(field="gizmo_pct", type="float", unit="%", dmon="gz", dmon_scale="nan"), "finite"),
        (lambda t: t + _row(field="gizmo_pct", type="float", smi_query="g", smi_kind="pstate"), "reads an int"),
        (lambda t: t + _row(field="gizmo_pct", type="float", unit="%", description="x" * 95), "at most 90"),
        (lambda t: t + _row(field="gizmo", type="str", nvml="nvmlDeviceGetBoardPartNumber", nvml_scale=2), "scales a"),
        (lambda t: t + _row(field="gizmo_w", type="float", unit="W", nvml_scale=0.001), "without an nvml call"),
        (
            lambda t: t + _row(field="gizmo", type="str", nvml="nvmlDeviceGetBoardPartNumber", nvml_static="no"),
            "'yes' or blank",
        ),
        (lambda t: t + "gizmo_pct,float,%\n", "3 cells, the header has 24"),
        (lambda t: t.rstrip("\n") + ",extra\n", "25 cells, the header has 24"),
        (lambda t: t.replace(",ge,", ",", 1), "the header lacks the column\\(s\\) ge"),
        (lambda t: t.splitlines()[0] + "\n", "no field rows"),
    ],
    ids=[
        "keyword",
        "pydantic-name",
        "ge-above-le",
        "int-bound",
        "separator",
        "nan-scale",
        "pstate-float",
        "long-description",
        "nvml-scale-str",
        "nvml-scale-no-call",
        "nvml-static-no",
        "short-row",
        "long-row",
        "missing-column",
        "empty",
    ],
)
def test_rows_that_would_break_the_model_or_the_readers_are_refused(tmp_path: Path, text: Any, message: str) -> None:
    """A row the generator could write into models.py only to break every import (a keyword, a
    pydantic name, an int bound of 0.5, a line separator), a bound pair nothing passes, a scale
    that is not a number, a CSV cell count or header that silently shifts or drops a column."""
    path = tmp_path / "fields.csv"
    path.write_text(text(SHIPPED.read_text(encoding="utf-8")), encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        load_fields(path)


def test_a_spreadsheets_byte_order_mark_is_read(tmp_path: Path) -> None:
    path = tmp_path / "fields.csv"
    path.write_text("\ufeff" + SHIPPED.read_text(encoding="utf-8"), encoding="utf-8")
    assert load_fields(path) == FIELDS


def test_the_generator_writes_nothing_that_would_not_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A generated block that does not compile leaves models.py as it was and says why (a broken
    models.py fails every gpuwarden import, the generator's own included)."""
    from gpuwarden.shared import fieldgen

    models_py = tmp_path / "models.py"
    original = fieldgen._models_path().read_text(encoding="utf-8")
    models_py.write_text(original, encoding="utf-8")
    bad = FieldSpec(field="gizmo_pct", type="float", unit="%", ge="0", description="G, %")
    monkeypatch.setattr(fieldgen, "FIELDS", (*FIELDS, bad))
    monkeypatch.setattr(fieldgen, "render_field", lambda f: f"    {f.field}: float | None = Field(None, ge=)")
    with pytest.raises(ValueError, match="not written"):
        fieldgen.generate(path=models_py)
    assert models_py.read_text(encoding="utf-8") == original


@contextlib.contextmanager
def _capture_drops(into: list[str]) -> Iterator[None]:
    """The readers' drop warnings (gpuwarden.shared.nvidia.values), as text."""

    class _H(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            into.append(record.getMessage())

    lg = logging.getLogger("gpuwarden.shared.nvidia.values")
    h = _H()
    lg.addHandler(h)
    try:
        yield
    finally:
        lg.removeHandler(h)


class _WidgetNvml:
    """Two GPUs answering only enumeration, the temperature and the decoder utilization (the
    widget row's call): [percent, sampling period in us], as nvidia-ml-py returns it."""

    NVMLError = pynvml.NVMLError

    def __init__(self, decoder: dict[int, int]) -> None:
        self.decoder = decoder

    def nvmlInit(self) -> None: ...

    def nvmlShutdown(self) -> None: ...

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.90.07"

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> types.SimpleNamespace:
        return types.SimpleNamespace(index=i)

    def nvmlDeviceGetTemperature(self, h: types.SimpleNamespace, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return 40 + h.index

    def nvmlDeviceGetDecoderUtilization(self, h: types.SimpleNamespace) -> list[int]:
        if h.index not in self.decoder:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [self.decoder[h.index], 167000]


def test_a_row_added_to_a_copy_of_fields_csv_reaches_the_nvml_source(tmp_path: Path) -> None:
    reg = _with_widget(tmp_path)
    src = NvmlSource(_WidgetNvml({0: 37}), "n1", clock=lambda: 1000.0, fields=reg)
    sample = src.collect_sync()
    assert [(g.index, _widget(g), g.temperature_c) for g in sample.gpus] == [(0, 37.0, 40.0), (1, None, 41.0)]
    assert all(isinstance(g, fieldgen.gpu_sample_model(reg)) for g in sample.gpus)
    # the row's bounds hold here too: 137 % is dropped, named and counted, the GPU kept
    bad = NvmlSource(_WidgetNvml({0: 137, 1: 12}), "n1", clock=lambda: 1000.0, fields=reg)
    drops: list[str] = []
    with _capture_drops(drops):
        got = bad.collect_sync().gpus
    assert [(g.index, _widget(g)) for g in got] == [(0, None), (1, 12.0)]
    assert bad.dropped.counts == {"widget_activity_pct": 1}
    assert any("widget_activity_pct = 137" in d for d in drops), drops
    # the shipped registry makes no such call and has no such attribute
    plain = NvmlSource(_WidgetNvml({0: 37}), "n1", clock=lambda: 1000.0).collect_sync().gpus[0]
    assert "widget_activity_pct" not in plain.model_dump() and plain.temperature_c == 40.0


def test_the_row_contributing_shows_loads_and_reaches_the_model(tmp_path: Path) -> None:
    text = (Path(__file__).parents[2] / "CONTRIBUTING.md").read_text(encoding="utf-8")
    section = text[text.index("## Add a GPU field") :]
    row = section[section.index("```csv\n") + 7 : section.index("\n```", section.index("```csv\n"))]
    path = tmp_path / "fields.csv"
    shutil.copy(SHIPPED, path)
    with path.open("a", encoding="utf-8") as fh:
        fh.write(row + "\n")
    reg = load_fields(path)
    (new,) = [f for f in reg if f.field not in {g.field for g in FIELDS}]
    assert new.field in fieldgen.gpu_sample_model(reg).model_fields


def test_the_default_table_reads_the_cells_the_registry_names(tmp_path: Path) -> None:
    cells = [cell for _, cell, _ in smi_table_fields()]
    assert len(cells) == len(set(cells)), "two rows read one cell"
    assert sorted(cells) == sorted(TABLE_CELLS), "a cell no row reads, or a row naming no cell of the layout"
    text = (Path(__file__).parents[1] / "fixtures/nvidia-smi/table-550-h100-8gpu-no-procs.txt").read_text()
    (shipped,) = parse_nvidia_smi_table(text)
    g0 = shipped.gpus[0]
    assert g0.temperature_c is not None and g0.utilization_gpu_pct is not None
    # a copy of the registry: the temperature row without its cell, the widget row reading GPU-Util
    path = tmp_path / "fields.csv"
    rows = SHIPPED.read_text(encoding="utf-8").replace(",Temp,", ",,", 1)
    path.write_text(
        rows
        + WIDGET_ROW.replace("Utilization/Widget;Widget Activity,,", "Utilization/Widget;Widget Activity,GPU-Util,", 1),
        encoding="utf-8",
    )
    reg = load_fields(path)
    (copy,) = parse_nvidia_smi_table(text, reg)
    c0 = copy.gpus[0]
    assert c0.temperature_c is None and _widget(c0) == g0.utilization_gpu_pct
    assert c0.model_dump(exclude={"temperature_c", "widget_activity_pct"}) == g0.model_dump(exclude={"temperature_c"})
