"""gpuwarden.shared.nvidia: NVML constants are pynvml's, one N/A token set, one XID table."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pynvml
import pytest

from gpuwarden.shared.models import Action, Severity
from gpuwarden.shared.nvidia import nvml, tokens, xids
from gpuwarden.shared.nvidia.xids import load_xid_table, xid_codes, xid_severities, xid_table
from prerequisites import needs

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT.parent / "shared" / "reference" / "xid_catalog.csv"
needs_reference = needs(REFERENCE)

# The values gpuwarden copied into collector/sources.py before it re-exported pynvml's.
COPIED = {
    "NVML_ERROR_GPU_IS_LOST": 15,
    "NVML_TEMPERATURE_GPU": 0,
    "NVML_CLOCK_SM": 1,
    "NVML_CLOCK_MEM": 2,
    "NVML_CLOCK_GRAPHICS": 0,
    "NVML_MEMORY_ERROR_TYPE_CORRECTED": 0,
    "NVML_MEMORY_ERROR_TYPE_UNCORRECTED": 1,
    "NVML_VOLATILE_ECC": 0,
    "NVML_AGGREGATE_ECC": 1,
    "NVML_TEMPERATURE_THRESHOLD_SHUTDOWN": 0,
    "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN": 1,
    "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS": 0,
    "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR": 1,
    "NVML_PCIE_UTIL_TX_BYTES": 0,
    "NVML_PCIE_UTIL_RX_BYTES": 1,
    "NVML_NVLINK_ERROR_DL_REPLAY": 0,
    "NVML_NVLINK_ERROR_DL_RECOVERY": 1,
    "NVML_NVLINK_ERROR_DL_CRC_FLIT": 2,
    "NVML_NVLINK_ERROR_DL_CRC_DATA": 3,
    "NVML_FEATURE_ENABLED": 1,
    "NVML_ERROR_UNINITIALIZED": 1,
    "NVML_ERROR_NOT_SUPPORTED": 3,
    "NVML_ERROR_DRIVER_NOT_LOADED": 9,
    "NVML_ERROR_FUNCTION_NOT_FOUND": 13,
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": 18,
    "NVML_ERROR_UNKNOWN": 999,
    "NVML_ERROR_TIMEOUT": 10,
    "NVML_SUCCESS": 0,
    "NVML_GPM_METRIC_SM_OCCUPANCY": 3,
    "NVML_GPM_METRIC_ANY_TENSOR_UTIL": 5,
    "NVML_GPM_METRICS_GET_VERSION": 1,
}


def test_nvml_constants_are_pynvmls_with_the_values_gpuwarden_relied_on() -> None:
    exported = {n for n in nvml.__all__ if n.startswith("NVML_") and n != "NVML_DEAD_ERRORS"}
    assert exported == set(COPIED)
    for name, value in COPIED.items():
        assert getattr(nvml, name) == getattr(pynvml, name) == value, name
    assert (nvml.EVENT_XID, nvml.EVENT_SINGLE_BIT_ECC, nvml.EVENT_DOUBLE_BIT_ECC) == (8, 1, 2)
    assert {1, 9, 18} == nvml.NVML_DEAD_ERRORS


def test_nvlink_probe_count_does_not_follow_the_binding() -> None:
    """pynvml 13 raised NVML_NVLINK_MAX_LINKS from 18 to 36; the collector keeps probing 18."""
    assert nvml.NVLINK_PROBE_LINKS == 18
    assert pynvml.NVML_NVLINK_MAX_LINKS >= 18


def test_throttle_bits_are_the_clock_event_reason_bits() -> None:
    assert nvml.THROTTLE_BITS == {
        0x1: "gpu_idle",
        0x2: "applications_clocks_setting",
        0x4: "sw_power_cap",
        0x8: "hw_slowdown",
        0x10: "sync_boost",
        0x20: "sw_thermal_slowdown",
        0x40: "hw_thermal_slowdown",
        0x80: "hw_power_brake_slowdown",
        0x100: "display_clocks_setting",
    }
    assert list(nvml.THROTTLE_BITS) == sorted(nvml.THROTTLE_BITS)


def test_nvml_str_decodes_old_bindings_bytes() -> None:
    assert nvml.nvml_str(b"NVIDIA H100 80GB HBM3") == "NVIDIA H100 80GB HBM3"
    assert nvml.nvml_str(b"\xffGPU") == "\ufffdGPU"
    assert nvml.nvml_str("GPU-1") == "GPU-1"


def test_one_na_token_set_is_the_union_of_the_old_ones() -> None:
    xml_set = {"", "n/a", "[n/a]", "not supported", "[not supported]", "unknown error", "unknown"}
    xml_set |= {"requested functionality has been deprecated", "none"}
    text_set = {"", "n/a", "[n/a]", "not supported", "[not supported]", "unknown error", "[unknown error]", "none"}
    text_set |= {"requested functionality has been deprecated", "[requested functionality has been deprecated]"}
    assert xml_set | text_set | {"err!"} <= tokens.NA_TOKENS
    assert all(t == t.strip().lower() for t in tokens.NA_TOKENS)


@pytest.mark.parametrize("text", ["N/A", " [N/A] ", "Not Supported", "[Not Supported]", "ERR!", "Unknown Error", ""])
def test_na_tokens_read_as_no_value(text: str) -> None:
    assert tokens.is_na(text)
    assert tokens.na_to_none(text) is None


@pytest.mark.parametrize("text", ["0", "N/A W", "Enabled", "Disabled", "NA", "0 MiB"])
def test_values_are_not_na(text: str) -> None:
    assert not tokens.is_na(text)
    assert tokens.na_to_none(f" {text} ") == text


def test_na_to_none_keeps_none() -> None:
    assert tokens.na_to_none(None) is None


def test_xid_table_is_the_one_classification() -> None:
    table = xid_table()
    assert len(table) == 172
    e79 = table[79]
    want = ("gpu-fallen-off-bus", Severity.FATAL, Action.REBOOT, True)
    assert (e79.pattern, e79.severity, e79.action, e79.sticky) == want
    # the health-check's former APPLICATION_XIDS / REPAIR_XIDS, now the table's health column
    assert xid_codes("application") == {13, 31, 43, 45, 68, 69}
    assert xid_codes("repair") == {63, 92}
    assert xid_codes("recovery-action") == {154}
    assert len(xid_codes("node")) == 172 - 9
    assert xid_severities()[79] is Severity.FATAL and xid_severities()[13] is Severity.WARNING


def test_load_xid_table_names_the_bad_line(tmp_path: Path) -> None:
    head = "xid,name,pattern,severity,action,sticky,category,meaning,health\n"
    good = "13,GR,xid-application-fault,warning,restart-job,0,application,Graphics Engine Exception,application\n"
    path = tmp_path / "x.csv"
    path.write_text(head + good + "14,FAKE,no-such-pattern,info,none,0,informational,Unused,node\n")
    with pytest.raises(ValueError, match=r"(?s)line 3: .*unknown pattern"):
        load_xid_table(path)
    path.write_text(head + good.replace(",application\n", ",bogus\n"))
    with pytest.raises(ValueError, match="line 2"):
        load_xid_table(path)
    with pytest.raises(ValueError, match="cannot read"):
        load_xid_table(tmp_path / "missing.csv")
    path.write_text(head.replace(",health", "") + good.replace(",application\n", "\n"))
    assert load_xid_table(path)[13].health == "node"  # a table without the column: every XID counts


def test_xid_severities_of_a_custom_csv(tmp_path: Path) -> None:
    path = tmp_path / "sev.csv"
    path.write_text("xid,severity\n79,critical\n")
    assert xid_severities(str(path)) == {79: Severity.CRITICAL}
    path2 = tmp_path / "bad.csv"
    path2.write_text("xid,severity\n79,terrible\n")
    with pytest.raises(ValueError, match="line 2"):
        xid_severities(str(path2))


@needs_reference
def test_the_shipped_table_is_what_the_derivation_gives() -> None:
    tool = ROOT / "services" / "detector" / "tools" / "derive_xids.py"
    out = subprocess.run([sys.executable, str(tool), str(REFERENCE)], capture_output=True, text=True, check=True)
    assert out.stdout == (Path(xids.__file__).parent / "xids.csv").read_text(encoding="utf-8")


def test_catalog_xid_rules_keep_the_tables_classification() -> None:
    """The detector's YAML rules for single XIDs add verdicts and evidence, not a second
    classification: pattern and severity are the table's (the action is the detector's
    remediation policy: drain where the table recommends a reboot or GPU reset)."""
    from gpuwarden.detector.catalog import load_catalog

    table = xid_table()
    # a rule with a message filter tells apart what one code means by the driver's text (XID 63:
    # page retirement before A100, row remapping after): it may classify differently
    rules = [r for r in load_catalog().rules if r.match.event == "xid" and r.match.message is None]
    assert {c for r in rules for c in r.match.codes} == {79, 48, 94, 95, 119}
    for r in rules:
        (code,) = r.match.codes
        assert (r.pattern, r.severity) == (table[code].pattern, table[code].severity), code
