"""``gpuwarden parse kmsg`` refuses what is not a kernel log (issue 24, analyze and parse as tools
people reach for): an empty file and other tools' output exit 1 with a reason, as every other
parse kind does; a kernel log without GPU events is still ``[]``; every stamp format and a bare
driver line are kernel log lines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpuwarden.shared.nvidia import parse_kmsg

SMI_Q = """==============NVSMI LOG==============

Timestamp                                 : Mon Dec  4 10:00:00 2023
Driver Version                            : 535.129.03
Attached GPUs                             : 1
GPU 00000000:18:00.0
    Product Name                          : NVIDIA H100 80GB HBM3
    Product Brand                         : NVIDIA
"""
CSV = "timestamp, index, name, utilization.gpu [%]\n2024/01/01 00:00:00.000, 0, NVIDIA H100, 97 %\n"
DCGM = '# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).\nDCGM_FI_DEV_GPU_TEMP{gpu="0"} 41\n'


XML = "<?xml version='1.0'?>\n<nvidia_smi_log/>\n"


@pytest.mark.parametrize("text", ["", "\n  \n", SMI_Q, CSV, DCGM, XML, "hello\n"])
def test_what_is_not_a_kernel_log_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="kernel log: "):
        parse_kmsg(text)


@pytest.mark.parametrize(
    "line",
    [
        "[  365.969681] usb 1-1: new high-speed USB device number 2",  # dmesg
        "[Mon Dec  4 10:00:00 2023] usb 1-1: new high-speed USB device",  # dmesg -T
        "2024-01-02T03:04:05.123456+0000 host kernel: usb 1-1: new device",  # journalctl -o short-iso
        "Dec  4 10:00:00 host kernel: usb 1-1: new device",  # /var/log/kern.log
        "6,1234,5678901,-;usb 1-1: new device",  # /dev/kmsg
        "nvidia-nvlink: Nvlink Core is being initialized, major device number 510",  # dmesg -t
        "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.129.03",
    ],
)
def test_a_kernel_log_without_gpu_events_is_empty_not_refused(line: str) -> None:
    assert parse_kmsg(line + "\n") == []


def test_the_cli_exits_1_with_one_line(tmp_path: Path) -> None:
    f = tmp_path / "q.txt"
    f.write_text(SMI_Q)
    gw = str(Path(sys.executable).parent / "gpuwarden")
    out = subprocess.run([gw, "parse", "kmsg", str(f)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.strip().count("\n") == 0 and "no line has a dmesg" in out.stderr
