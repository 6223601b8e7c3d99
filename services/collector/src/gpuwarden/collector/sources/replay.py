"""The replay source: recorded ``nvidia-smi -q -x`` captures and ``kern.log`` per node folder."""

from __future__ import annotations

import logging
from pathlib import Path

from gpuwarden.shared.models import GpuEvent, GpuSample, NodeSample
from gpuwarden.shared.nvidia.kernel_log import parse_kernel_log_line
from gpuwarden.shared.nvidia.smi_xml import parse_nvidia_smi_xml

from .base import Clock, default_collector_id, resolve_gpu
from .file_follower import FileFollower

__all__ = ["ReplaySource"]

log = logging.getLogger(__name__)


class ReplaySource:
    """Replay recorded node output from ``root/<node>/``.

    * ``*.xml``: ``nvidia-smi -q -x`` captures, one per tick in sorted name order, cycling;
      each collect yields one NodeSample per node with ts = ``clock()``.
    * ``kern.log``: followed like ``tail -f`` from its start (lines appended later are read
      on the next ``events()``); XIDs are mapped to a GPU index and UUID through the node's
      latest parsed capture.

    Node folders (and capture files) are rescanned each call, so ones created after start are
    picked up. ``nodes`` limits which folders are read. A capture that fails to parse is
    logged and skipped for that tick.
    """

    name = "replay"

    def __init__(self, root: Path, nodes: list[str] | None, clock: Clock, collector_id: str | None = None) -> None:
        self.root = Path(root)
        self.nodes = nodes
        self.clock = clock
        self.collector_id = collector_id or default_collector_id()
        self._cursor: dict[str, int] = {}
        self._followers: dict[str, FileFollower] = {}
        self.inventory: dict[str, list[GpuSample]] = {}

    def _node_dirs(self) -> list[Path]:
        if not self.root.is_dir():
            raise FileNotFoundError(f"replay folder {self.root} does not exist")
        dirs = sorted(p for p in self.root.iterdir() if p.is_dir())
        if self.nodes is not None:
            wanted = set(self.nodes)
            dirs = [d for d in dirs if d.name in wanted]
        return dirs

    async def collect(self) -> list[NodeSample]:
        return self.collect_sync()

    def collect_sync(self) -> list[NodeSample]:
        ts = self.clock()
        out = []
        for d in self._node_dirs():
            files = sorted(d.glob("*.xml"))
            if not files:
                continue
            i = self._cursor.get(d.name, 0)
            self._cursor[d.name] = i + 1
            f = files[i % len(files)]
            try:
                rep = parse_nvidia_smi_xml(f.read_text(errors="replace"))
            except (ValueError, OSError) as exc:
                log.warning("replay: skipping %s: %s", f, exc)
                continue
            self.inventory[d.name] = rep.gpus
            out.append(
                NodeSample(
                    node=d.name,
                    ts=ts,
                    collector_id=self.collector_id,
                    source="nvidia-smi-xml",
                    gpus=rep.gpus,
                    driver_version=rep.driver_version,
                    cuda_version=rep.cuda_version,
                )
            )
        return out

    async def events(self) -> list[GpuEvent]:
        return self.events_sync()

    def events_sync(self) -> list[GpuEvent]:
        now = self.clock()
        out = []
        for d in self._node_dirs():
            fol = self._followers.get(d.name)
            if fol is None:
                fol = self._followers[d.name] = FileFollower(d / "kern.log")
            lines = fol.read_new_lines()
            if not lines:
                continue
            inv = self.inventory.get(d.name)
            if inv is None:
                inv = self._first_inventory(d)
            for line in lines:
                ev = parse_kernel_log_line(line, d.name, now, source="replay")
                if ev is not None:
                    out.append(resolve_gpu(ev, inv))
        return out

    def _first_inventory(self, d: Path) -> list[GpuSample]:
        for f in sorted(d.glob("*.xml")):
            try:
                gpus = parse_nvidia_smi_xml(f.read_text(errors="replace")).gpus
            except (ValueError, OSError):
                continue
            self.inventory[d.name] = gpus
            return gpus
        return []

    async def close(self) -> None:
        return None
