"""Recordings in every text encoding nvidia-smi output ends up in (issue 24): UTF-8 with or without
BOM, UTF-16LE/BE with BOM (PowerShell's `>` writes UTF-16LE with BOM and CRLF) or without, CRLF,
gzipped or not. Every reader (CSV, dmon, table, -q, XML, dcgm scrape, kernel log, journalctl
JSON) must read a re-encoded copy exactly as it reads the UTF-8 original.

The UTF-16 copies are written to tmp_path; the real recordings of ../shared/realdata are read
there, never copied into the repository.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.recordings import Recording, detect_encoding, load_recording, read_text
from gpuwarden.recordings.analyze import analyze_recording, fill_from_spec
from prerequisites import need_path

FIX = Path(__file__).resolve().parents[1] / "fixtures"
REALDATA = Path(__file__).resolve().parents[2].parent / "shared" / "realdata"

#: Fixtures of every reader: (path under tests/fixtures, load_recording keywords).
READER_FIXTURES: list[tuple[str, dict[str, Any]]] = [
    ("recordings/smi-csv-header-units-nounits.csv", {}),
    ("recordings/smi-csv-units-in-values-pci.csv", {}),
    ("recordings/smi-csv-8gpu-noindex.csv", {}),
    ("recordings/smi-csv-1ms-1gpu.csv", {}),
    ("recordings/custom-iso-logger-8gpu.csv", {}),
    (
        "recordings/smi-csv-noheader-5s.csv",
        {
            "columns": [
                "timestamp",
                "utilization.gpu",
                "utilization.memory",
                "memory.used",
                "memory.free",
                "temperature.gpu",
                "power.draw",
            ]
        },
    ),
    ("recordings/dmon-o-DT.txt", {}),
    ("recordings/dmon-plain.txt", {}),
    ("recordings/smi-table-470.txt", {}),
    ("recordings/smi-table-535-series.txt", {}),
    ("nvidia-smi/a100-40gb-mig2-xml-v11.xml", {}),
    ("nvidia-smi/h100-8gpu-q-sw-thermal-one-gpu.txt", {}),
    ("recordings/dcgm-scrapes-mig-domain.prom", {}),
    ("recordings/dmesg-iso.log", {}),
    ("recordings/dmesg-T.log", {}),
    ("recordings/dmesg-relative.log", {}),
    ("recordings/journalctl-short.log", {}),
    ("recordings/journalctl-short-precise.log", {}),
    ("xid-logs/xid48-63-94-dbe-row-remap-sequence.txt", {}),
    ("xid-logs/xid119-gsp-rpc-timeout-h100.txt", {}),
    ("journalctl/kernel-json.txt", {}),
    ("journalctl/kernel-short-iso-precise.txt", {}),
]


@dataclass(frozen=True)
class Variant:
    """How a copy is written: codec, BOM, line end, gzipped."""

    name: str
    codec: str
    bom: bool
    crlf: bool
    gz: bool = False


VARIANTS = [
    Variant("utf16le-bom-crlf (PowerShell >)", "utf-16-le", True, True),
    Variant("utf16be-bom", "utf-16-be", True, False),
    Variant("utf16le-no-bom-crlf", "utf-16-le", False, True),
    Variant("utf16be-no-bom", "utf-16-be", False, False),
    Variant("utf8-bom-crlf", "utf-8", True, True),
    Variant("utf16le-bom-crlf.gz", "utf-16-le", True, True, gz=True),
]


def _text(path: Path) -> str:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return data.decode("utf-8")


def _write(text: str, v: Variant, dest: Path) -> Path:
    body = text.replace("\r\n", "\n")
    if v.crlf:
        body = body.replace("\n", "\r\n")
    data = (("\ufeff" if v.bom else "") + body).encode(v.codec)
    out = dest.with_name(dest.name + ".gz") if v.gz else dest
    out.write_bytes(gzip.compress(data) if v.gz else data)
    return out


def _facts(path: Path, **kw: Any) -> Any:
    """What the readers made of ``path``: the whole Recording but the file's name, or the error."""
    try:
        r: Recording = load_recording([path], **kw)
    except ValueError as exc:
        return ("error", str(exc).replace(path.name, "<file>"))
    return (
        r.samples,
        r.events,
        r.fields,
        r.gpu_indices,
        r.start_ts,
        r.end_ts,
        r.interval_s,
        r.gaps,
        r.rows,
        sorted(r.formats.values()),
        [n.replace(path.name, "<file>") for n in r.notes],
        sorted(r.spans.values()),
    )


# -- detection ---------------------------------------------------------------------------------


def test_detect_encoding_by_bom_and_by_nul_pattern() -> None:
    line = "timestamp, index, power.draw [W]\r\n"
    assert detect_encoding(b"\xef\xbb\xbf" + line.encode()) == ("utf-8", 3)
    assert detect_encoding(b"\xff\xfe" + line.encode("utf-16-le")) == ("utf-16-le", 2)
    assert detect_encoding(b"\xfe\xff" + line.encode("utf-16-be")) == ("utf-16-be", 2)
    assert detect_encoding(line.encode("utf-16-le")) == ("utf-16-le", 0)
    assert detect_encoding(line.encode("utf-16-be")) == ("utf-16-be", 0)
    assert detect_encoding(line.encode()) == ("utf-8", 0)
    assert detect_encoding("GPU 0: température 45 °C\n".encode()) == ("utf-8", 0)
    assert detect_encoding(b"") == ("utf-8", 0)
    assert detect_encoding(b"\x00" * 64) == ("utf-8", 0)  # all NUL: binary, not UTF-16
    assert detect_encoding(bytes(range(256)) * 4) == ("utf-8", 0)
    # a truncated probe (odd length) still reads as UTF-16
    assert detect_encoding(line.encode("utf-16-le")[:-1]) == ("utf-16-le", 0)


def test_read_text_decodes_and_translates_line_ends(tmp_path: Path) -> None:
    p = _write("a,b\nc,d\n", VARIANTS[0], tmp_path / "x.csv")
    assert read_text(p) == "a,b\nc,d\n"
    gz = tmp_path / "misnamed.csv"  # gzip recognised by its magic, not its name
    gz.write_bytes(gzip.compress("\ufeffa,b\r\n".encode("utf-16-le")))
    assert read_text(gz) == "a,b\n"


def test_binary_data_is_still_refused_as_a_kernel_log(tmp_path: Path) -> None:
    p = tmp_path / "dmesg.log"
    p.write_bytes(b"[  1.000000] NVRM: Xid (PCI:0000:9b:00): 79, GPU has fallen off the bus.\n\x00\x01\x02\n")
    with pytest.raises(ValueError, match="NUL"):
        load_recording([p], fmt="kernel-log")


# -- every reader, every encoding ----------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS, ids=[v.name for v in VARIANTS])
@pytest.mark.parametrize(("rel", "kw"), READER_FIXTURES, ids=[r for r, _ in READER_FIXTURES])
def test_every_reader_reads_a_reencoded_copy_identically(
    rel: str, kw: dict[str, Any], variant: Variant, tmp_path: Path
) -> None:
    src = FIX / rel
    copy = _write(_text(src), variant, tmp_path / src.name)
    want = _facts(src, **kw)
    assert want[0] != "error", want
    assert _facts(copy, **kw) == want


def test_powershell_copy_of_a_csv_and_a_kernel_log_together_maps_the_gpu(tmp_path: Path) -> None:
    ps = VARIANTS[0]
    csv = _write((FIX / "recordings/smi-table-535-series.txt").read_text(), ps, tmp_path / "smi.txt")
    log = _write((FIX / "recordings/dmesg-iso.log").read_text(), ps, tmp_path / "dmesg.log")
    r = load_recording([csv, log])
    assert [(e.code, e.gpu_index) for e in r.events] == [(13, 0), (43, 1)]


# -- the real recordings -------------------------------------------------------------------------

#: CSVs whose whole UTF-16 copy is compared (each under 10,000 lines, < 0.3 s to read).
WHOLE = {
    "1gpu-idle-allocation-plato/gpu_log.csv.gz",
    "a6000x2-one-idle-openad/gpu_usage.csv.gz",
    "h100x8-colocated-nanogpt-pr643/gpu_metrics_16a680b7.csv.gz",
    "titanx2-gpt-ddp/power-trace_2gpu_2025-12-10-17-40-10.csv.gz",
    "rtx4090-vlm-1gpu/gpu_log.csv.gz",
}
HEAD_LINES = 2500
PLATO_COLUMNS = "timestamp,utilization.gpu,utilization.memory,memory.used,memory.free,temperature.gpu,power.draw"


def _need_realdata() -> None:
    need_path(REALDATA)


def _real_csvs() -> list[str]:
    if not REALDATA.is_dir():
        return []
    return sorted(str(p.relative_to(REALDATA)) for p in REALDATA.rglob("*.csv*"))


def _kw(rel: str) -> dict[str, Any]:
    return {"columns": PLATO_COLUMNS.split(",")} if rel.startswith("1gpu-idle-allocation-plato") else {}


def test_the_real_csvs_are_found() -> None:
    _need_realdata()
    assert len(_real_csvs()) >= 21 and set(_real_csvs()) >= WHOLE


@pytest.mark.parametrize("rel", _real_csvs() or ["(none)"])
def test_every_real_csv_reads_the_same_from_a_powershell_copy(rel: str, tmp_path: Path) -> None:
    """The first HEAD_LINES lines of every CSV (header, dialect, units, GPU numbering), as UTF-8
    and as UTF-16LE+BOM+CRLF, give the same samples, notes and errors; the small ones whole."""
    _need_realdata()
    text = _text(REALDATA / rel)
    if rel not in WHOLE:
        text = "".join(text.splitlines(keepends=True)[:HEAD_LINES])
    name = Path(rel).name.removesuffix(".gz")
    (tmp_path / "utf8").mkdir()
    (tmp_path / "ps").mkdir()
    utf8 = tmp_path / "utf8" / name
    utf8.write_text(text, encoding="utf-8")
    ps = _write(text, VARIANTS[0], tmp_path / "ps" / name)
    assert _facts(ps, **_kw(rel)) == _facts(utf8, **_kw(rel))


@pytest.mark.parametrize(
    ("rel", "model", "pattern"),
    [
        ("a6000x2-one-idle-openad/gpu_usage.csv.gz", None, "partial-idle-allocation"),
        ("1gpu-idle-allocation-plato/gpu_log.csv.gz", None, "idle-allocation"),
    ],
)
def test_analyze_of_a_powershell_copy_gives_the_same_findings(
    rel: str, model: str | None, pattern: str, tmp_path: Path
) -> None:
    _need_realdata()
    ps = _write(_text(REALDATA / rel), VARIANTS[5], tmp_path / Path(rel).name.removesuffix(".gz"))
    rows = []
    for p in (REALDATA / rel, ps):
        rec = load_recording([p], **_kw(rel))
        samples, assumed = fill_from_spec(rec.samples, rec.fields, None)
        res = analyze_recording(
            samples, rec.events, fields=frozenset(rec.fields) | frozenset(assumed), spans=list(rec.spans.values())
        )
        rows.append(res.rows())
    assert rows[0] == rows[1]
    assert pattern in {r["pattern"] for r in rows[0]}
