"""A revocation of the correlator service against the release of held records: nothing the
worker still holds when its revocation checkpoint is taken may be joined (and its windows
emitted) before the revoked nodes are dropped: the next owner re-reads those records from the
committed offset (capped below them) and would emit the same windows a second time.

Found by ``tests/integration/test_correlator_restarts.py`` (18 windows emitted twice, 0.1 s
apart, at a graceful rebalance); here without Kafka: a fake consumer whose commit takes a
moment, during which the Slurm watermark passes the held samples."""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka import TopicPartition

from gpuwarden.correlator import CorrelatorService, CorrelatorSettings
from gpuwarden.shared.models import GpuSample, JobState, NodeSample, SlurmWatermark

T0 = 1_700_000_000.0
NODE = "rev-node-001"


class Outputs:
    """The narrow producer interface the service uses: ``queue``, ``drain_soon``, ``flush``."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str | None, bytes]] = []

    def queue(self, topic: str, key: str | None, value: bytes) -> None:
        self.sent.append((topic, key, value))

    async def drain_soon(self) -> None: ...

    async def flush(self) -> None: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def topics(self) -> list[str]:
        return [t.split(".", 1)[1] if t.startswith("gpuwarden.") else t for t, _, _ in self.sent]


class SlowCommit:
    """The shared consumer's ``commit_now``: checkpoints, then the commit takes ``delay_s``
    (a broker round trip), while ``during`` runs."""

    def __init__(self, service: CorrelatorService, during: Any, delay_s: float = 0.2) -> None:
        self.service, self.during, self.delay_s = service, during, delay_s
        self.committed: dict[TopicPartition, int] = {}
        self.task: asyncio.Future[None] | None = None

    async def commit_now(self, force: bool = True) -> None:
        tp = TopicPartition(self.service.settings.topic("gpu.samples"), 0)
        self.committed = await self.service._checkpoint({tp: 60})  # 60 records handled
        self.task = asyncio.ensure_future(self.during())  # another task: the Slurm reader's
        await asyncio.sleep(self.delay_s)

    def owns(self, rec: Any) -> bool:
        return True


def _service() -> tuple[CorrelatorService, Outputs]:
    out = Outputs()
    svc = CorrelatorService(CorrelatorSettings(), producer=out)  # type: ignore[arg-type]
    return svc, out


def _sample(ts: float) -> NodeSample:
    return NodeSample(node=NODE, ts=ts, collector_id="c", source="simulated",
                      gpus=[GpuSample(index=0, utilization_gpu_pct=90.0)])  # fmt: skip


async def _holding_service() -> tuple[CorrelatorService, Outputs]:
    """A service that joined 31 readings of NODE (up to T0, where Slurm's view ends) and holds
    the 29 after it (offsets 31..59 of gpu.samples partition 0)."""
    svc, out = _service()
    job = JobState(job_id="7", ts=T0, state="RUNNING", user="u", nodes=[NODE], gpus={NODE: [0]},
                   start_ts=T0 - 100)  # fmt: skip
    svc.view.apply_job(job)
    svc.view.on_position(0, 1)
    svc.view.on_watermark(SlurmWatermark(cluster="c", ts=T0, jobs_offsets={0: 1}))
    svc._restored.set()
    for i, ts in enumerate(range(int(T0) - 30, int(T0) + 30)):
        s = _sample(float(ts))
        await svc._handle("gpu.samples", s, _Rec(i, s.to_json()))
    assert svc.core.held_count == 29, svc.core.held_count
    return svc, out


def _watermark_passes(svc: CorrelatorService) -> Any:
    """The Slurm reader's step: the watermark passes every held reading, and it releases."""

    async def step() -> None:
        svc.view.on_watermark(SlurmWatermark(cluster="c", ts=T0 + 60, jobs_offsets={0: 1}))
        await svc._release()

    return step


def test_no_held_record_is_released_between_the_revocation_checkpoint_and_the_drop() -> None:
    async def scenario() -> None:
        svc, out = await _holding_service()
        before = len(out.sent)

        # the watcher catches up while the revocation commits: the reader releases
        svc._consumer = commit = SlowCommit(svc, _watermark_passes(svc))
        await asyncio.wait_for(svc.revoked({TopicPartition(svc.settings.topic("gpu.samples"), 0)}), 10)
        assert commit.task is not None
        await asyncio.wait_for(commit.task, 10)  # the release, once the revocation is done
        after = out.topics()[before:]
        # the checkpoint wrote the changelog; nothing was joined after it
        assert "gpu.attributed" not in after and "job.windows" not in after, after
        # the committed offset stays below the oldest held record: the next owner reads it again
        [(_tp, offset)] = commit.committed.items()
        assert offset == 31, offset  # records 0..30 joined (ts <= T0), 31.. held
        assert svc.core.held_count == 0  # dropped with the node

    asyncio.run(scenario())


class _Rec:
    def __init__(self, offset: int, value: bytes) -> None:
        self.topic, self.partition, self.offset, self.value = "gpu.samples", 0, offset, value


class SlowLeave:
    """The shared consumer at ``Service.stop``: its final commit checkpoints, then leaving the
    group takes ``delay_s`` (the LeaveGroup round trip), while ``during`` runs."""

    def __init__(self, service: CorrelatorService, during: Any, delay_s: float = 0.2) -> None:
        self.service, self.during, self.delay_s = service, during, delay_s
        self.committed: dict[TopicPartition, int] = {}
        self.task: asyncio.Future[None] | None = None

    async def stop_gracefully(self, task: Any, grace_s: float = 10.0) -> None:
        tp = TopicPartition(self.service.settings.topic("gpu.samples"), 0)
        self.committed = await self.service._checkpoint({tp: 60})
        self.task = asyncio.ensure_future(self.during())  # the Slurm reader's or the hold timer's
        await asyncio.sleep(self.delay_s)


def test_no_held_record_is_released_while_a_stopping_worker_leaves_the_group() -> None:
    """The same race on the way out (found by the restarts test again: 18 windows twice, 0.1 s
    apart, at a graceful leave): the final commit is capped below the held records, so a release
    while the consumer leaves the group would emit windows its next owner emits again."""

    async def scenario() -> None:
        svc, out = await _holding_service()
        before = len(out.sent)

        leave = SlowLeave(svc, _watermark_passes(svc))
        svc._consumers = [leave]  # type: ignore[list-item]
        svc._started = True
        await asyncio.wait_for(svc.stop(), 10)
        assert leave.task is not None
        await asyncio.wait_for(leave.task, 10)
        after = out.topics()[before:]
        assert "gpu.attributed" not in after and "job.windows" not in after, after
        [(_tp, offset)] = leave.committed.items()
        assert offset == 31, offset  # the held records stay for the next owner
        assert svc.core.held_count == 29  # still held, never joined

    asyncio.run(scenario())
