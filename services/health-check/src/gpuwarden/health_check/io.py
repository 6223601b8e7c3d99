"""The outside systems the checks read, each behind a narrow protocol with a real implementation.

* :class:`ToolRunner` - run a command (argv list, never a shell string) with a timeout and
  return its text, on the contract of :mod:`gpuwarden.shared.command` (a non-zero exit is
  returned; :class:`ToolMissing` / :class:`ToolTimeout` raised). :class:`SubprocessRunner` in
  production (kills a command past its time, and everything still running at the end of a
  run); tests pass a fake.
* :class:`KernelLog` - the kernel log as text lines. :class:`DmesgLog` runs
  ``dmesg --time-format iso`` (ISO stamps, so XIDs carry their event time); :class:`FileLog`
  reads a file such as ``/var/log/kern.log``.
* :func:`read_sysfs_ib` - ``/sys/class/infiniband/<dev>/ports/<n>/{state,phys_state,rate,link_layer}``
  under a root folder (``/`` in production, a temporary tree in tests).

NVML itself is the :class:`gpuwarden.shared.nvidia.nvml.Nvml` protocol (the NVIDIA layer the collector uses too).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gpuwarden.shared import command

from .parsers import IbPort, parse_ib_rate, parse_ib_state

__all__ = [
    "DmesgLog",
    "FileLog",
    "KernelLog",
    "SubprocessRunner",
    "ToolMissing",
    "ToolOutput",
    "ToolRunner",
    "ToolTimeout",
    "read_sysfs_ib",
]


ToolMissing = command.CommandNotFound
"""The command is not installed (``argv[0]`` not found): :class:`gpuwarden.shared.command.CommandNotFound`."""

ToolTimeout = command.CommandTimeout
"""The command ran past its timeout and was killed: :class:`gpuwarden.shared.command.CommandTimeout`."""


@dataclass(frozen=True)
class ToolOutput:
    """Exit status and text (stdout, then stderr) of one finished command."""

    returncode: int
    stdout: str
    stderr: str = ""


class ToolRunner(Protocol):
    """Runs one command. Raises :class:`ToolMissing` or :class:`ToolTimeout`; a non-zero exit is
    returned, not raised (``dcgmi diag`` exits non-zero when a test fails)."""

    def run(self, argv: list[str], timeout_s: float) -> ToolOutput: ...


class SubprocessRunner:
    """:class:`ToolRunner` on :class:`gpuwarden.shared.command.SubprocessRunner`: no shell, stdin
    closed, each command in its own process group (``dcgmi diag`` runs ``nvvs`` children), the
    whole group killed when ``timeout_s`` (seconds) passes. :meth:`kill_all` kills what is still
    running when a run ends past its budget or the process is told to stop (SIGTERM from the
    wrapper's guard), and refuses new commands after that, so an abandoned check cannot start
    the next tool and no diagnostic keeps stressing the GPUs while the job starts."""

    def __init__(self) -> None:
        self._runner = command.SubprocessRunner()

    def run(self, argv: list[str], timeout_s: float) -> ToolOutput:
        """Run ``argv``.

        Raises:
            ToolMissing: ``argv[0]`` is not installed (nothing forked).
            ToolTimeout: it ran past ``timeout_s`` (killed with its children), or the run is over.
            ValueError: ``argv`` is a string or empty, or ``timeout_s`` <= 0.
        """
        res = self._runner.run(argv, timeout_s)
        return ToolOutput(res.exit_code, res.stdout, res.stderr)

    def kill_all(self) -> int:
        """Kill every command still running (and its process group) and start no more; returns
        how many were running."""
        return self._runner.kill_all()


class KernelLog(Protocol):
    """The kernel log's lines (oldest first)."""

    def read_lines(self) -> list[str]: ...


class DmesgLog:
    """``dmesg --time-format iso`` through a :class:`ToolRunner`.

    Raises:
        ToolMissing, ToolTimeout: from the runner.
        PermissionError: dmesg exited non-zero (``kernel.dmesg_restrict=1`` without CAP_SYSLOG).
    """

    def __init__(self, runner: ToolRunner, timeout_s: float = 3.0) -> None:
        self.runner = runner
        self.timeout_s = timeout_s

    def read_lines(self) -> list[str]:
        out = self.runner.run(["dmesg", "--time-format", "iso"], self.timeout_s)
        if out.returncode != 0:
            raise PermissionError(f"dmesg exited {out.returncode}: {out.stderr.strip()[:200]}")
        return out.stdout.splitlines()


class FileLog:
    """A kernel log file (e.g. ``/var/log/kern.log`` or a recorded capture).

    Raises:
        OSError: the file is missing or unreadable (the xid check is then UNKNOWN, never OK)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read_lines(self) -> list[str]:
        return self.path.read_text(errors="replace").splitlines()


def read_sysfs_ib(root: Path = Path("/")) -> list[IbPort]:
    """Every port under ``<root>/sys/class/infiniband``, sorted by device and port.

    ``state`` (``4: ACTIVE``), ``phys_state`` (``5: LinkUp``), ``rate`` (``400 Gb/sec (4X NDR)``)
    and ``link_layer`` (``InfiniBand``/``Ethernet``) as the kernel's ib_core exposes them.
    Returns ``[]`` when the folder does not exist (no RDMA devices). A port whose ``state``
    cannot be read is skipped."""
    base = root / "sys" / "class" / "infiniband"
    if not base.is_dir():
        return []
    ports: list[IbPort] = []
    for dev in sorted(base.iterdir()):
        pdir = dev / "ports"
        if not pdir.is_dir():
            continue
        for p in sorted(pdir.iterdir(), key=lambda x: int(x.name) if x.name.isdigit() else 0):
            if not p.name.isdigit():
                continue

            def rd(name: str, p: Path = p) -> str | None:
                try:
                    return (p / name).read_text().strip()
                except OSError:
                    return None

            state = rd("state")
            if not state:
                continue
            rate, width, speed = parse_ib_rate(rd("rate") or "")
            phys = rd("phys_state")
            ports.append(
                IbPort(
                    device=dev.name,
                    port=int(p.name),
                    state=parse_ib_state(state),
                    phys_state=phys.split(":", 1)[-1].strip() if phys else None,
                    rate_gbps=rate,
                    link_layer=rd("link_layer"),
                    width=width,
                    speed=speed,
                )
            )
    return ports
