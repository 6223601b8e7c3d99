"""`gpuwarden analyze` on the real recordings in ../shared/realdata (read there, never copied).

The yardstick of issue 12: on every healthy recording no hardware or driver finding, nothing
critical or fatal, no drain/reboot/reset/restart recommendation, no straggler, hang or
telemetry-silent finding; the checkpoint sweep gives checkpoint-stall, the idle recordings
idle-allocation / partial-idle-allocation, the kernel logs their XID patterns.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.recordings import gpu_spec, load_recording
from gpuwarden.recordings.analyze import AnalyzeResult, analyze_recording, fill_from_spec
from prerequisites import need_path

REALDATA = Path(__file__).resolve().parents[2].parent / "shared" / "realdata"
PLATO_COLUMNS = "timestamp,utilization.gpu,utilization.memory,memory.used,memory.free,temperature.gpu,power.draw"

#: (file, GPU model or None when the recording names it, columns, patterns that must be found)
RECORDINGS: list[tuple[str, str | None, str | None, set[str]]] = [
    ("h100x8-llama3-8b-ckpt/ckpt1.csv.gz", "H100-SXM5-80GB", None, {"checkpoint-stall"}),
    ("h100x8-llama3-8b-ckpt/ckpt10.csv.gz", "H100-SXM5-80GB", None, {"checkpoint-stall"}),
    ("h100x8-llama3-8b-ckpt/ckpt50.csv.gz", "H100-SXM5-80GB", None, {"checkpoint-stall"}),
    ("h100x8-llama3-8b-ckpt/ckpt100.csv.gz", "H100-SXM5-80GB", None, {"checkpoint-stall"}),
    ("h100x8-llama3-8b-ckpt/ckpt500.csv.gz", "H100-SXM5-80GB", None, set()),
    ("h100x8-llama3-8b-ckpt/ckpt1000.csv.gz", "H100-SXM5-80GB", None, set()),
    ("h100x8-llama3-8b-ckpt/power-trace_2025-07-26-23-32-09.csv.gz", "H100-SXM5-80GB", None, set()),
    ("h100x8-colocated-nanogpt-pr643/gpu_metrics_b443a1c3.csv.gz", "H100-SXM5-80GB", None, set()),
    ("h100x8-colocated-nanogpt-pr643/gpu_metrics_16a680b7.csv.gz", "H100-SXM5-80GB", None, set()),
    ("h100x8-colocated-nanogpt-pr643/gpu_metrics_f4f827dd_baseline.csv.gz", "H100-SXM5-80GB", None, set()),
    ("a100-swing-llm-inference/falcon-40b_3gpu_2024-04-10_09-01-30.nvidia-smi.csv.gz", "A100-SXM4-40GB", None, set()),
    ("a100-swing-llm-inference/llama2-70b_4gpu_2024-04-05_06-17-19.nvidia-smi.csv.gz", "A100-SXM4-40GB", None, set()),
    ("a100-swing-llm-inference/mixtral-8x7b_3gpu_2024-04-04_10-54-15.nvidia-smi.csv.gz", "A100-SXM4-40GB", None, set()),
    ("a100-swing-llm-inference/falcon-7b_1gpu_2024-04-03_11-36-01.nvidia-smi.csv.gz", "A100-SXM4-40GB", None, set()),
    ("h100pcie-gemm-powercap/fp16_half_maxpower.csv.gz", "H100 PCIe", None, {"power-cap-throttle"}),
    ("h100pcie-gemm-powercap/fp16_half_allzero.csv.gz", "H100 PCIe", None, set()),
    ("titanx2-gpt-ddp/power-trace_2gpu_2025-12-05-02-37-06_gloo.csv.gz", "TITAN X (Pascal)", None, set()),
    ("titanx2-gpt-ddp/power-trace_2gpu_2025-12-10-17-40-10.csv.gz", "TITAN X (Pascal)", None, set()),
    ("rtx4090-vlm-1gpu/gpu_log.csv.gz", None, None, set()),
    ("1gpu-idle-allocation-plato/gpu_log.csv.gz", None, PLATO_COLUMNS, {"idle-allocation"}),
    ("a6000x2-one-idle-openad/gpu_usage.csv.gz", None, None, {"partial-idle-allocation"}),
]
KERNEL_LOGS = {
    "xid-kernel-logs-gpud/dmesg.decode.iso.log.0": {"xid-application-fault"},
    "xid-kernel-logs-gpud/dmesg.0.log": {"uncorrectable-ecc"},
    "xid-kernel-logs-gpud/dmesg-with-xid-119.log": {"gsp-firmware-error"},
}
NEVER_ON_HEALTHY = {"straggler-gpu", "straggler-node", "collective-hang", "telemetry-silent"}
DISRUPTIVE = {"drain", "reboot", "reset-gpu", "restart-job", "rma"}


def _need_realdata() -> None:
    need_path(REALDATA)


def _analyze(name: str, model: str | None, columns: str | None) -> AnalyzeResult:
    rec = load_recording([REALDATA / name], columns=columns.split(",") if columns else None)
    names = [g.name for s in rec.samples[:1] for g in s.gpus if g.name]
    spec = gpu_spec(model) if model else (gpu_spec(names[0]) if names else None)
    samples, assumed = fill_from_spec(rec.samples, rec.fields, spec)
    return analyze_recording(samples, rec.events, fields=frozenset(rec.fields) | frozenset(assumed))


@pytest.mark.parametrize(("name", "model", "columns", "expected"), RECORDINGS, ids=[r[0] for r in RECORDINGS])
def test_healthy_recording_gives_no_false_alarm(
    name: str, model: str | None, columns: str | None, expected: set[str]
) -> None:
    _need_realdata()
    fails = _analyze(name, model, columns).sorted_failures()
    summary = [(f.pattern, f.severity.value, f.recommended_action.value) for f in fails]
    assert not [f for f in fails if f.category.value in ("hardware", "driver")], summary
    assert not [f for f in fails if f.severity.value in ("critical", "fatal")], summary
    assert not [f for f in fails if f.recommended_action.value in DISRUPTIVE], summary
    assert not {f.pattern for f in fails} & NEVER_ON_HEALTHY, summary
    assert expected <= {f.pattern for f in fails}, summary


@pytest.mark.parametrize("name", sorted(KERNEL_LOGS))
def test_real_kernel_logs_give_their_xid_patterns(name: str) -> None:
    _need_realdata()
    rec = load_recording([REALDATA / name])
    fails = analyze_recording(rec.samples, rec.events, fields=frozenset(rec.fields)).sorted_failures()
    assert {f.pattern for f in fails} == KERNEL_LOGS[name]


def test_the_dbe_its_row_remap_and_containment_are_one_failure() -> None:
    _need_realdata()
    rec = load_recording([REALDATA / "xid-kernel-logs-gpud/dmesg.0.log"])
    [f] = analyze_recording(rec.samples, rec.events, fields=frozenset()).sorted_failures()
    assert f.pci_bus_id == "0000:19:00.0" and {e.value for e in f.evidence} >= {48, 63, 94}


def test_a_finding_says_what_the_data_cannot_tell() -> None:
    _need_realdata()
    fails = _analyze("h100x8-llama3-8b-ckpt/ckpt10.csv.gz", "H100-SXM5-80GB", None).sorted_failures()
    [ck] = [f for f in fails if f.pattern == "checkpoint-stall"]
    assert ck.first_seen > 0 and any("rank" in c for c in ck.cannot_determine)
