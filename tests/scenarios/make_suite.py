"""Write the scored scenario suite: per pattern, positives with several seeds and a near-miss negative.

Usage: python tests/scenarios/make_suite.py tests/scenarios   (the YAML files are committed; edit
them here and regenerate; the old files are removed first).

Files: ``<pattern>.yaml`` (seed 11, two nodes) and ``<pattern>-s23.yaml`` / ``<pattern>-s37.yaml``
(other seeds; one node, and for seed 37 a job that starts at 30 s, so its start-up phase and a
later fault); ``<pattern>-negative.yaml`` is the near miss for that pattern's rule: just under its
threshold, or healthy but alarming (a legit power cap, a hot GPU, bursty inference, a comm-bound
job, a staggered job end, a 120 s all-GPU pin that recovers, start-up memory growth). Every
scenario has the simulator's realism (per-GPU offsets, clock jitter, checkpoints and eval pauses,
logger gaps on some nodes); ``allow`` names only patterns that really co-occur with the fault.
"""

import sys
from pathlib import Path

import yaml

from gpuwarden.sim.gpu_model import gpu_offsets, job_timing

OUT = Path(sys.argv[1])
N1, N2 = "gpu-node-001", "gpu-node-002"
SEEDS = (11, 23, 37)


def job(profile="training", id=1001, nodes="gpu-node-[001-002]", gpus=8, start=0, end=3600, user="user1", **kw):
    return {
        "id": id,
        "user": user,
        "account": "ml",
        "partition": "gpu",
        "nodes": nodes,
        "gpus_per_node": gpus,
        "start_s": start,
        "end_s": end,
        "profile": profile,
        **kw,
    }


def sc(name, desc, faults=(), jobs=None, expect=(), allow=(), duration=300, nodes=2, model="H100-SXM5-80GB", seed=11):
    return {
        "name": name,
        "description": desc,
        "seed": seed,
        "duration_s": duration,
        "tick_s": 1,
        "cluster": {"nodes": nodes, "gpus_per_node": 8, "gpu_model": model, "price_usd_per_gpu_hour": 3.26},
        "jobs": list(jobs if jobs is not None else [job()]),
        "faults": list(faults),
        "expect": list(expect),
        "allow": list(allow),
    }


def ex(pattern, node=N2, gpu=3, job=1001, within=30, count=None):
    e = {"pattern": pattern, "node": node, "within_s": within}
    if gpu is not None:
        e["gpu"] = gpu
    if job is not None:
        e["job"] = job
    if count is not None:
        e["count"] = count  # one fault, exactly this many findings (the pending stage's folds)
    return e


class V:
    """One seed's variant of a positive: where the fault goes and when the job starts."""

    def __init__(self, seed):
        self.seed = seed
        self.nodes = 2 if seed == 11 else 1
        self.node = N2 if seed == 11 else N1
        self.gpu = {11: 3, 23: 5, 37: 1}[seed]
        self.start = 30 if seed == 37 else 0  # seed 37: a job with a start-up phase (<= 240 s)
        self.at = {11: 60, 23: 90, 37: 300}[seed]
        self.extra = 240 if seed == 37 else 0  # seconds added to the scenario for the later fault
        self.suffix = "" if seed == 11 else f"-s{seed}"
        self.jobnodes = "gpu-node-[001-002]" if self.nodes == 2 else N1

    def job(self, profile="training", **kw):
        kw.setdefault("start", self.start)
        kw.setdefault("nodes", self.jobnodes)
        return job(profile, **kw)

    def sc(self, name, desc, duration=300, **kw):
        return sc(
            name + self.suffix,
            f"{desc} (seed {self.seed})",
            duration=duration + self.extra,
            nodes=self.nodes,
            seed=self.seed,
            **kw,
        )

    def fault(self, kind, gpu=True, **kw):
        f = {"at_s": self.at, "kind": kind, "node": self.node, **kw}
        if gpu:
            f["gpu"] = self.gpu
        return f

    def ex(self, pattern, gpu=True, job=1001, within=30, node=None, count=None):
        return ex(pattern, node=node or self.node, gpu=self.gpu if gpu else None, job=job, within=within, count=count)


VS = [V(s) for s in SEEDS]


def _hot_seed(node, gpus=8, lo=83.0, hi=86.0):
    """A seed whose hot GPU on ``node`` sits at lo..hi C in training compute (~595 W)."""
    for seed in range(1, 1000):
        o = gpu_offsets(seed, node, gpus)
        if o.hot is not None and lo <= 28 + 595 * o.power_scale[o.hot] * 0.055 + o.temp_c[o.hot] <= hi:
            return seed, o.hot
    raise RuntimeError("no seed with a hot GPU in range")


def _job_id(seed, profile, start, pred):
    for jid in range(1001, 3000):
        if pred(job_timing(seed, str(jid), profile, start)):
            return jid
    raise RuntimeError("no job id with that timing")


S = {}
# --- XID and event patterns ----------------------------------------------------------------
for pattern, code, allow in [
    # XID 79's GPU vanishes from NVML (gpu-missing), XID 94/95 count a DBE and leave a row remap
    # pending: one failure each, the rest as its evidence (the detector's pending stage)
    ("gpu-fallen-off-bus", 79, []),
    ("contained-memory-error", 94, []),
    ("uncontained-memory-error", 95, []),
    ("gsp-firmware-error", 119, []),
    ("driver-fault", 109, []),
    ("xid-application-fault", 13, []),
    ("xid-other", 62, []),
]:
    for v in VS:
        S[pattern + v.suffix] = v.sc(
            pattern,
            f"XID {code} on {v.node} GPU {v.gpu} during training",
            jobs=[v.job()],
            faults=[v.fault("xid", xid=code)],
            expect=[v.ex(pattern, within=5, count=1)],
            allow=allow,
        )
    S[f"{pattern}-negative"] = sc(f"{pattern}-negative", "the same training job without the XID")
for v in VS:
    S["uncorrectable-ecc" + v.suffix] = v.sc(
        "uncorrectable-ecc",
        f"double-bit ECC error (XID 48 + DBE counter) on GPU {v.gpu}",
        jobs=[v.job()],
        faults=[v.fault("ecc-dbe")],
        expect=[v.ex("uncorrectable-ecc", within=5, count=1)],
    )
    S["nvswitch-fatal" + v.suffix] = v.sc(
        "nvswitch-fatal",
        f"a fatal NVSwitch SXID on {v.node}",
        jobs=[v.job()],
        faults=[v.fault("sxid", gpu=False, sxid=24007)],
        expect=[v.ex("nvswitch-fatal", gpu=False, job=None, within=5)],
    )
S["uncorrectable-ecc-negative"] = sc(
    "uncorrectable-ecc-negative", "correctable errors only: constant non-zero SBE counters on some GPUs"
)
S["nvswitch-fatal-negative"] = sc(
    "nvswitch-fatal-negative", "a non-fatal SXID only", faults=[{"at_s": 60, "kind": "sxid", "node": N2, "sxid": 11004}]
)
for i, v in enumerate(VS):
    a, b = 1000 + i * 1000 + 1, 1000 + i * 1000 + 2
    S["repeat-offender-gpu" + v.suffix] = v.sc(
        "repeat-offender-gpu",
        "application XIDs on the same GPU under two different jobs within a day",
        jobs=[v.job(id=a, end=150, start=0), v.job(id=b, start=160, end=3600)],
        faults=[
            {"at_s": 60, "kind": "xid", "node": v.node, "gpu": v.gpu, "xid": 13},
            {"at_s": 220, "kind": "xid", "node": v.node, "gpu": v.gpu, "xid": 31},
        ],
        expect=[v.ex("repeat-offender-gpu", job=b, within=165), v.ex("xid-application-fault", job=a, within=5)],
        allow=["xid-application-fault"],
    )
S["repeat-offender-gpu-negative"] = sc(
    "repeat-offender-gpu-negative",
    "two application XIDs under the same job: the job's fault only",
    jobs=[job(id=2001, nodes=N2)],
    faults=[
        {"at_s": 60, "kind": "xid", "node": N2, "gpu": 3, "xid": 13},
        {"at_s": 220, "kind": "xid", "node": N2, "gpu": 3, "xid": 31},
    ],
    expect=[ex("xid-application-fault", job=2001, within=5)],
    allow=["xid-application-fault"],
)

# --- GPU conditions ---------------------------------------------------------------------------
HOT_SEED, HOT_GPU = _hot_seed(N2)
NEGATIVES = {
    # pattern: (description, faults, expect, allow, seed)
    "thermal-throttle": (
        f"a hot but healthy GPU ({N2} GPU {HOT_GPU} at ~83-85 C under load, no slowdown reason)",
        [],
        [],
        [],
        HOT_SEED,
    ),
    "power-brake": ("power brake for only 10 s: shorter than the rule's for_s", "short:10", [], [], 11),
    "power-cap-throttle": ("power cap for only 60 s: shorter than the rule's for_s", "short:60", [], [], 11),
    "clocks-low": (
        "a legit power cap: sw_power_cap at the 700 W limit, SM clock 0.8x: power-cap-throttle, never clocks-low",
        [{"at_s": 60, "kind": "power-cap", "node": N2, "gpu": 3, "factor": 0.8}],
        [],
        # capped near the rule's 0.75 x max clock: power-cap-throttle may or may not fire; a GPU capped
        # to 0.8x clocks is slower than its peers
        [{"pattern": "power-cap-throttle", "node": N2}, {"pattern": "straggler-gpu", "node": N2}],
        11,
    ),
    "pcie-link-degraded": ("PCIe link degraded for only 30 s", "short:30", [], [], 11),
    "nvlink-link-down": ("an NVLink down for only 5 s", "short:5", [], [], 11),
    "nvlink-error": ("healthy training job", [], [], [], 11),
    "pcie-replay-storm": ("constant non-zero PCIe replay counters on some GPUs, not growing", [], [], [], 23),
    "correctable-ecc-storm": ("constant non-zero correctable-ECC counters on some GPUs, not growing", [], [], [], 23),
    "row-remap-pending": ("healthy training job", [], [], [], 11),
    "row-remap-failure": ("healthy training job", [], [], [], 11),
}
for pattern, kind, extra, within, slow in [
    ("thermal-throttle", "thermal-throttle", {}, 45, True),
    ("power-brake", "power-brake", {}, 35, True),
    ("power-cap-throttle", "power-cap", {}, 135, True),
    ("clocks-low", "clocks-low", {"factor": 0.4}, 75, True),
    ("pcie-link-degraded", "pcie-degraded", {}, 75, False),
    ("nvlink-link-down", "nvlink-down", {"link": 4}, 25, False),
    ("nvlink-error", "nvlink-errors", {"link": 2}, 75, False),
    ("pcie-replay-storm", "pcie-replays", {}, 75, False),
    ("correctable-ecc-storm", "ecc-sbe-storm", {}, 75, False),
    ("row-remap-pending", "row-remap-pending", {}, 5, False),
    ("row-remap-failure", "row-remap-failed", {}, 5, False),
]:
    # a GPU slowed to <= 0.75 of its peers is a real straggler as well
    allow = ["straggler-gpu"] if slow and pattern != "power-cap-throttle" else []
    for v in VS:
        S[pattern + v.suffix] = v.sc(
            pattern,
            f"{kind} on {v.node} GPU {v.gpu} from {v.at} s",
            jobs=[v.job()],
            faults=[v.fault(kind, **extra)],
            expect=[v.ex(pattern, within=within)],
            allow=allow,
        )
    desc, faults, expect, nallow, seed = NEGATIVES[pattern]
    if isinstance(faults, str):
        short = float(faults.split(":")[1])
        faults = [{"at_s": 60, "kind": kind, "node": N2, "gpu": 3, "duration_s": short, **extra}]
        nallow = allow
    S[f"{pattern}-negative"] = sc(f"{pattern}-negative", desc, faults=faults, expect=expect, allow=nallow, seed=seed)
for v in VS:
    S["retired-pages" + v.suffix] = v.sc(
        "retired-pages",
        "page retirement pending on a V100-class GPU",
        model="V100-SXM2-32GB",
        jobs=[v.job()],
        faults=[v.fault("retired-pages")],
        expect=[v.ex("retired-pages", within=5)],
    )
    S["gpu-missing" + v.suffix] = v.sc(
        "gpu-missing",
        f"GPU {v.gpu} of {v.node} drops out of NVML",
        jobs=[v.job()],
        faults=[v.fault("gpu-missing")],
        expect=[v.ex("gpu-missing", gpu=False, job=None, within=20)],
    )
    S["health-check-failed" + v.suffix] = v.sc(
        "health-check-failed",
        f"the node health check's DCGM diag fails on {v.node} GPU {v.gpu}",
        jobs=[v.job()],
        faults=[v.fault("health-check-fail")],
        expect=[v.ex("health-check-failed", job=None, within=5)],
    )
S["retired-pages-negative"] = sc("retired-pages-negative", "healthy V100 job", model="V100-SXM2-32GB")
S["gpu-missing-negative"] = sc("gpu-missing-negative", "all GPUs stay present (logger gaps only)", seed=23)
S["health-check-failed-negative"] = sc("health-check-failed-negative", "no health check fails")
for v in VS:
    zn = N2 if v.nodes == 2 else N1
    S["zombie-process" + v.suffix] = v.sc(
        "zombie-process",
        "a leftover process holds memory on an unallocated GPU",
        jobs=[v.job(nodes=N1, gpus=8 if v.nodes == 2 else 4)],
        faults=[{"at_s": v.at, "kind": "zombie-process", "node": zn, "gpu": 6 if v.nodes == 1 else v.gpu}],
        expect=[ex("zombie-process", node=zn, gpu=6 if v.nodes == 1 else v.gpu, job=None, within=75)],
    )
    S["telemetry-silent" + v.suffix] = sc(
        "telemetry-silent" + v.suffix,
        f"{N2} stops sending telemetry while {N1} reports (seed {v.seed})",
        faults=[{"at_s": v.at, "kind": "telemetry-silent", "node": N2, "duration_s": 120}],
        expect=[ex("telemetry-silent", gpu=None, job=None, within=40)],
        seed=v.seed,
        duration=300 + v.extra,
    )
S["zombie-process-negative"] = sc(
    "zombie-process-negative",
    "a job ends: its GPUs free their memory within seconds, idle unallocated GPUs hold nothing",
    jobs=[job(nodes=N1), job(id=1002, nodes=N2, end=150)],
)
S["telemetry-silent-negative"] = sc(
    "telemetry-silent-negative",
    "a 20 s silence (plus the collector's 1-7 s logger gaps): shorter than the rule's 30 s",
    faults=[{"at_s": 60, "kind": "telemetry-silent", "node": N2, "duration_s": 20}],
    seed=23,
)

# --- job efficiency ---------------------------------------------------------------------------
for pattern, profile, within, gpu, dur in [
    # within_s follows the rules and the job's start-up phase (up to 240 s of model loading):
    # idle once it outlasts the 300 s start-up grace; input-starvation and low tensor activity after
    # the start-up phase + 600 s / 300 s; memory growth after the start-up grace + 6 windows
    ("idle-allocation", "idle", 420, None, 600),
    ("partial-idle-allocation", "partial-idle", 480, 4, 600),
    ("input-starvation", "input-bound", 900, None, 1100),
    ("checkpoint-stall", "checkpoint-heavy", 500, None, 600),
    ("gpu-memory-leak", "memory-leak", 480, 0, 600),
    ("low-tensor-activity", "low-tensor", 600, None, 700),
]:
    for v in VS:
        both = pattern == "gpu-memory-leak"  # low-tensor: one finding for the job
        nodes = [N1, N2][: v.nodes] if both else [N1]
        # partial-idle-allocation: the idle half of each node of the job (GPUs 4-7) is one job-level
        # finding (aggregate: job), named by the job's first node
        gpus = [None] if both or pattern == "partial-idle-allocation" else [gpu]
        count = 1 if pattern == "partial-idle-allocation" else None
        S[pattern + v.suffix] = v.sc(
            pattern,
            f"a job with the {profile} profile",
            jobs=[v.job(profile)],
            duration=dur,
            expect=[ex(pattern, node=n, gpu=g, within=within, count=count) for n in nodes for g in gpus],
        )
S["idle-allocation-negative"] = sc(
    "idle-allocation-negative",
    "bursty inference: busy 3-12 % of the time, idle at 60-80 W in between, after a start-up phase",
    jobs=[job("inference", start=30)],
    duration=600,
)
STAGGER = _job_id(11, "training", 0, lambda tm: tm.stagger_s >= 55)
S["partial-idle-allocation-negative"] = sc(
    "partial-idle-allocation-negative",
    "a staggered job end: half the GPUs finish ~60 s before the job ends",
    jobs=[job(id=STAGGER, end=420)],
    duration=480,
)
S["input-starvation-negative"] = sc(
    "input-starvation-negative",
    "a comm-bound (gloo-like) job: ~25-30 % util, periodic, low power",
    jobs=[job("comm-bound")],
    duration=400,
)
CKPT = _job_id(11, "training", 0, lambda tm: tm.ckpt_phase_s < 200 and tm.ckpt_every_s < 500)
S["checkpoint-stall-negative"] = sc(
    "checkpoint-stall-negative",
    "training with its ordinary, infrequent checkpoints (rank 0 writes 10-30 s every 7-12 min)",
    jobs=[job(id=CKPT)],
    duration=600,
)
S["gpu-memory-leak-negative"] = sc(
    "gpu-memory-leak-negative",
    "training after a start-up phase: memory ramps to the working set while the model loads, then stays",
    jobs=[job(start=20)],
    duration=600,
)
EVAL = _job_id(11, "training", 0, lambda tm: tm.eval_phase_s < 300)
S["low-tensor-activity-negative"] = sc(
    "low-tensor-activity-negative", "training with an evaluation pause", jobs=[job(id=EVAL)], duration=600
)
for v in VS:
    S["straggler-gpu" + v.suffix] = v.sc(
        "straggler-gpu",
        f"GPU {v.gpu} of {v.node} runs at 60 % speed",
        jobs=[v.job()],
        faults=[v.fault("straggler-gpu", factor=0.6)],
        expect=[v.ex("straggler-gpu", within=120)],  # 60 s of persistence over 10 s windows
    )
S["straggler-gpu-negative"] = sc(
    "straggler-gpu-negative",
    "GPU 3 runs at 90 % speed: within the fleet's per-GPU spread",
    faults=[{"at_s": 60, "kind": "straggler-gpu", "node": N2, "gpu": 3, "factor": 0.9}],
)
for seed, at in ((11, 60), (23, 90), (37, 300)):
    suffix = "" if seed == 11 else f"-s{seed}"
    start = 30 if seed == 37 else 0
    S["straggler-node" + suffix] = sc(
        "straggler-node" + suffix,
        f"{N2} runs at 60 % speed (seed {seed})",
        jobs=[job(start=start)],
        faults=[{"at_s": at, "kind": "straggler-node", "node": N2, "factor": 0.6}],
        expect=[ex("straggler-node", gpu=None, within=120, count=1)],
        seed=seed,
        duration=300 + (240 if seed == 37 else 0),
    )
    S["collective-hang" + suffix] = sc(
        "collective-hang" + suffix,
        f"the job hangs in a collective from {at + 60} s to the end (seed {seed})",
        jobs=[job(start=start)],
        faults=[{"at_s": at + 60, "kind": "collective-hang", "node": N2}],
        expect=[ex("collective-hang", node=N1, gpu=None, within=180)],  # within 3 min: 150 s on strong evidence
        seed=seed,
        duration=at + 60 + 480,
    )
S["straggler-node-negative"] = sc(
    "straggler-node-negative",
    f"{N2} at 90 % speed",
    faults=[{"at_s": 60, "kind": "straggler-node", "node": N2, "factor": 0.9}],
)
S["collective-hang-negative"] = sc(
    "collective-hang-negative",
    "a 120 s all-GPU pin (100 % util, ~115 W) that recovers: shorter than the rule's 150 s",
    faults=[{"at_s": 60, "kind": "collective-hang", "node": N2, "duration_s": 120}],
    duration=400,
)

# --- mixed ------------------------------------------------------------------------------------
S["mixed-several-faults"] = sc(
    "mixed-several-faults",
    "XID 79 on one node and thermal throttling on another GPU at once",
    faults=[
        {"at_s": 60, "kind": "xid", "node": N2, "gpu": 3, "xid": 79},
        {"at_s": 60, "kind": "thermal-throttle", "node": N1, "gpu": 6},
    ],
    expect=[ex("gpu-fallen-off-bus", within=5, count=1), ex("thermal-throttle", node=N1, gpu=6, within=45)],
    allow=["straggler-gpu"],
)
S["mixed-fault-at-job-start"] = sc(
    "mixed-fault-at-job-start",
    "an XID 94 in the job's first second",
    jobs=[job(start=30)],
    faults=[{"at_s": 30, "kind": "xid", "node": N1, "gpu": 0, "xid": 94}],
    expect=[ex("contained-memory-error", node=N1, gpu=0, within=5, count=1)],
)
S["mixed-fault-at-job-end"] = sc(
    "mixed-fault-at-job-end",
    "an XID 119 in the job's last second",
    jobs=[job(end=120)],
    faults=[{"at_s": 119, "kind": "xid", "node": N1, "gpu": 2, "xid": 119}],
    expect=[ex("gsp-firmware-error", node=N1, gpu=2, within=5)],
)
S["mixed-fault-on-idle-node"] = sc(
    "mixed-fault-on-idle-node",
    "an XID 48 on a node without a job: no job attributed",
    jobs=[job(nodes=N1)],
    faults=[{"at_s": 60, "kind": "ecc-dbe", "node": N2, "gpu": 5}],
    expect=[ex("uncorrectable-ecc", gpu=5, job=None, within=5, count=1)],
)

# The join race of the stream-core issue: jobs from t=0 on part of each node, healthy; through
# the services at --speed 50 samples were once joined before Slurm's view had the jobs (false
# zombie-process findings). A100 nodes at a lower price than the suite's H100s.
S["healthy-partial-allocation"] = sc(
    "healthy-partial-allocation",
    "four A100 nodes, healthy jobs from t=0 on part of each node (GPUs 0-3 and 4-5 busy, 6-7 unallocated "
    "and idle): no finding",
    jobs=[
        job(id=3001, nodes="gpu-node-[001-004]", gpus=4),
        job(id=3002, user="user2", nodes="gpu-node-[001-002]", gpus=2),
        job("inference", id=3003, user="user3", nodes="gpu-node-[003-004]", gpus=2),
    ],
    nodes=4,
    model="A100-SXM4-80GB",
)
S["healthy-partial-allocation"]["cluster"]["price_usd_per_gpu_hour"] = 1.8

# The same join race with jobs changing hands: one job ends and the next starts on the same GPUs in
# the same second, another node pair has gaps between jobs. Every allocation change must reach the
# correlator before the samples of its time are joined, at any speed.
S["healthy-job-churn"] = sc(
    "healthy-job-churn",
    "four A100 nodes; short training jobs back to back on the same GPUs (one ends, the next starts the same "
    "second) on two nodes, jobs with gaps on the other two: no finding",
    jobs=[
        job(id=4001, nodes="gpu-node-[001-002]", end=90),
        job(id=4002, user="user2", nodes="gpu-node-[001-002]", start=90, end=200),
        job("inference", id=4003, user="user3", nodes="gpu-node-[001-002]", start=200),
        job(id=4004, nodes="gpu-node-[003-004]", gpus=4, start=10, end=70),
        job(id=4005, user="user4", nodes="gpu-node-[003-004]", gpus=4, start=130),
    ],
    nodes=4,
    model="A100-SXM4-80GB",
    seed=5,
)
S["healthy-job-churn"]["cluster"]["price_usd_per_gpu_hour"] = 1.8
# Three faults on a 16-node fleet with two jobs, each finding with its own job.
S["mixed-faults-wide-job"] = sc(
    "mixed-faults-wide-job",
    "sixteen nodes, a 16-node job on six GPUs each and a second job on the other two of nodes 1-8: XID 79 on "
    "node 5, a thermal throttle on node 11, NVLink errors on node 3 (the second job): three findings, each "
    "with its job",
    jobs=[
        job(id=6001, nodes="gpu-node-[001-016]", gpus=6),
        job("inference", id=6002, user="user2", nodes="gpu-node-[001-008]", gpus=2, start=20),
    ],
    faults=[
        {"at_s": 100, "kind": "xid", "node": "gpu-node-005", "gpu": 2, "xid": 79},
        {"at_s": 60, "kind": "thermal-throttle", "node": "gpu-node-011", "gpu": 4},
        {"at_s": 80, "kind": "nvlink-errors", "node": "gpu-node-003", "gpu": 7},
    ],
    expect=[
        ex("gpu-fallen-off-bus", node="gpu-node-005", gpu=2, job=6001, within=5, count=1),
        ex("thermal-throttle", node="gpu-node-011", gpu=4, job=6001, within=45),
        ex("nvlink-error", node="gpu-node-003", gpu=7, job=6002, within=75),
    ],
    allow=["straggler-gpu", "straggler-node"],
    nodes=16,
    seed=29,
)

# --- one fault, one finding (issue 24: scope aggregation) --------------------------------------
S["straggler-node-large-job"] = sc(
    "straggler-node-large-job",
    "one node of a 16-node, 128-GPU job runs at 60 % speed: one straggler-node, not one straggler-gpu per GPU",
    jobs=[job(nodes="gpu-node-[001-016]")],
    faults=[{"at_s": 60, "kind": "straggler-node", "node": "gpu-node-009", "factor": 0.6}],
    expect=[ex("straggler-node", node="gpu-node-009", gpu=None, within=120, count=1)],
    nodes=16,
)
S["partial-idle-large-job"] = sc(
    "partial-idle-large-job",
    "an 8-node, 64-GPU job uses 4 of the 8 GPUs it holds on every node, beside a healthy 4-node job: one job-level "
    "partial-idle-allocation naming the 8 nodes, not one per node or per GPU, and nothing for the other job",
    jobs=[
        job("partial-idle", id=2001, user="user3", nodes="gpu-node-[001-008]"),
        job(id=2002, user="user4", nodes="gpu-node-[009-012]"),
    ],
    expect=[{"pattern": "partial-idle-allocation", "within_s": 420, "job": 2001, "count": 1}],
    duration=480,
    nodes=12,
    seed=29,
)
S["partial-idle-shared-node"] = sc(
    "partial-idle-shared-node",
    "two jobs share a node (GPUs 0-3 and 4-7); the first leaves half its GPUs idle: one node-level "
    "partial-idle-allocation for that job, nothing for the other",
    jobs=[
        job("partial-idle", nodes=N1, gpus=4),
        job(id=1002, user="user2", nodes=N1, gpus=4),
    ],
    expect=[ex("partial-idle-allocation", node=N1, gpu=None, within=480, count=1)],
    duration=600,
    nodes=1,
)

OUT.mkdir(parents=True, exist_ok=True)
for old in OUT.glob("*.yaml"):
    old.unlink()
for name, data in S.items():
    (OUT / f"{name}.yaml").write_text(yaml.safe_dump(data, sort_keys=False, width=120))
print(len(S), "scenarios")
