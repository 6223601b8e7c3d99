"""Write the scored scenario suite: one positive and one negative scenario per pattern.

Usage: python tests/scenarios/make_suite.py tests/scenarios   (the YAML files are committed; edit
them here and regenerate). Positive scenarios inject a fault or use a job profile and expect the
pattern; negatives are the same job without it, or a near miss shorter than the rule's for_s.
"""

import sys
from pathlib import Path

import yaml

OUT = Path(sys.argv[1])
N1, N2 = "gpu-node-001", "gpu-node-002"


def job(profile="training", id=1001, nodes="gpu-node-[001-002]", gpus=8, start=0, end=3600, **kw):
    return {
        "id": id,
        "user": "user1",
        "account": "ml",
        "partition": "gpu",
        "nodes": nodes,
        "gpus_per_node": gpus,
        "start_s": start,
        "end_s": end,
        "profile": profile,
        **kw,
    }


def sc(name, desc, faults=(), jobs=None, expect=(), allow=(), duration=300, nodes=2, model="H100-SXM5-80GB"):
    return {
        "name": name,
        "description": desc,
        "seed": 11,
        "duration_s": duration,
        "tick_s": 1,
        "cluster": {"nodes": nodes, "gpus_per_node": 8, "gpu_model": model, "price_usd_per_gpu_hour": 3.26},
        "jobs": list(jobs if jobs is not None else [job()]),
        "faults": list(faults),
        "expect": list(expect),
        "allow": list(allow),
    }


def ex(pattern, node=N2, gpu=3, job=1001, within=30):
    e = {"pattern": pattern, "node": node, "within_s": within}
    if gpu is not None:
        e["gpu"] = gpu
    if job is not None:
        e["job"] = job
    return e


S = {}
# --- XID and event patterns ----------------------------------------------------------------
for pattern, code, allow in [
    ("gpu-fallen-off-bus", 79, ["gpu-missing"]),
    ("contained-memory-error", 94, ["uncorrectable-ecc", "row-remap-pending"]),
    ("uncontained-memory-error", 95, ["uncorrectable-ecc", "row-remap-pending"]),
    ("gsp-firmware-error", 119, []),
    ("driver-fault", 109, []),
    ("xid-application-fault", 13, []),
    ("xid-other", 62, []),
]:
    S[pattern] = sc(
        pattern,
        f"XID {code} on {N2} GPU 3 during training",
        faults=[{"at_s": 60, "kind": "xid", "node": N2, "gpu": 3, "xid": code}],
        expect=[ex(pattern, within=5)],
        allow=allow,
    )
    S[f"{pattern}-negative"] = sc(f"{pattern}-negative", "the same training job without the XID")
S["uncorrectable-ecc"] = sc(
    "uncorrectable-ecc",
    "double-bit ECC error (XID 48 + DBE counter) on GPU 3",
    faults=[{"at_s": 60, "kind": "ecc-dbe", "node": N2, "gpu": 3}],
    expect=[ex("uncorrectable-ecc", within=5)],
    allow=["row-remap-pending"],
)
S["uncorrectable-ecc-negative"] = sc("uncorrectable-ecc-negative", "correctable errors only, at a low rate", faults=[])
S["nvswitch-fatal"] = sc(
    "nvswitch-fatal",
    "a fatal NVSwitch SXID on node 2",
    faults=[{"at_s": 60, "kind": "sxid", "node": N2, "sxid": 24007}],
    expect=[ex("nvswitch-fatal", gpu=None, job=None, within=5)],
    allow=[],
)
S["nvswitch-fatal-negative"] = sc("nvswitch-fatal-negative", "no SXID")
S["repeat-offender-gpu"] = sc(
    "repeat-offender-gpu",
    "application XIDs on the same GPU under two different jobs within a day",
    jobs=[job(id=2001, nodes=N2, end=150), job(id=2002, nodes=N2, start=160, end=3600)],
    faults=[
        {"at_s": 60, "kind": "xid", "node": N2, "gpu": 3, "xid": 13},
        {"at_s": 220, "kind": "xid", "node": N2, "gpu": 3, "xid": 31},
    ],
    expect=[ex("repeat-offender-gpu", job=2002, within=165), ex("xid-application-fault", job=2001, within=5)],
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
for pattern, kind, extra, within, short in [
    ("thermal-throttle", "thermal-throttle", {}, 45, 15),
    ("power-brake", "power-brake", {}, 35, 10),
    ("power-cap-throttle", "power-cap", {}, 135, 60),
    ("clocks-low", "clocks-low", {"factor": 0.4}, 75, 30),
    ("pcie-link-degraded", "pcie-degraded", {}, 75, 30),
    ("nvlink-link-down", "nvlink-down", {"link": 4}, 25, 5),
    ("nvlink-error", "nvlink-errors", {"link": 2}, 75, None),
    ("pcie-replay-storm", "pcie-replays", {}, 75, None),
    ("correctable-ecc-storm", "ecc-sbe-storm", {}, 75, None),
    ("row-remap-pending", "row-remap-pending", {}, 5, None),
    ("row-remap-failure", "row-remap-failed", {}, 5, None),
]:
    slow = (
        ["straggler-gpu", "clocks-low"]
        if pattern in ("thermal-throttle", "power-brake", "power-cap-throttle", "clocks-low", "pcie-link-degraded")
        else []
    )
    S[pattern] = sc(
        pattern,
        f"{kind} on {N2} GPU 3 from 60 s",
        faults=[{"at_s": 60, "kind": kind, "node": N2, "gpu": 3, **extra}],
        expect=[ex(pattern, within=within)],
        allow=[p for p in slow if p != pattern],
    )
    if short is not None:
        S[f"{pattern}-negative"] = sc(
            f"{pattern}-negative",
            f"{kind} for only {short} s: shorter than the rule's for_s",
            faults=[{"at_s": 60, "kind": kind, "node": N2, "gpu": 3, "duration_s": short, **extra}],
            allow=[p for p in slow if p != pattern],
        )
    else:
        S[f"{pattern}-negative"] = sc(f"{pattern}-negative", "healthy training job")
S["retired-pages"] = sc(
    "retired-pages",
    "page retirement pending on a V100-class GPU",
    model="V100-SXM2-32GB",
    faults=[{"at_s": 60, "kind": "retired-pages", "node": N2, "gpu": 3}],
    expect=[ex("retired-pages", within=5)],
)
S["retired-pages-negative"] = sc("retired-pages-negative", "healthy V100 job", model="V100-SXM2-32GB")
S["gpu-missing"] = sc(
    "gpu-missing",
    "GPU 3 of node 2 drops out of NVML",
    faults=[{"at_s": 60, "kind": "gpu-missing", "node": N2, "gpu": 3}],
    expect=[ex("gpu-missing", gpu=None, job=None, within=20)],
)
S["gpu-missing-negative"] = sc("gpu-missing-negative", "all GPUs stay present")
S["zombie-process"] = sc(
    "zombie-process",
    "a leftover process holds memory on an unallocated GPU",
    jobs=[job(nodes=N1)],
    faults=[{"at_s": 60, "kind": "zombie-process", "node": N2, "gpu": 3}],
    expect=[ex("zombie-process", job=None, within=75)],
)
S["zombie-process-negative"] = sc("zombie-process-negative", "idle unallocated GPUs hold nothing", jobs=[job(nodes=N1)])
S["telemetry-silent"] = sc(
    "telemetry-silent",
    "node 2 stops sending telemetry while node 1 reports",
    faults=[{"at_s": 60, "kind": "telemetry-silent", "node": N2, "duration_s": 120}],
    expect=[ex("telemetry-silent", gpu=None, job=None, within=40)],
)
S["telemetry-silent-negative"] = sc(
    "telemetry-silent-negative",
    "a 10 s gap: shorter than the rule's 30 s",
    faults=[{"at_s": 60, "kind": "telemetry-silent", "node": N2, "duration_s": 10}],
)
S["health-check-failed"] = sc(
    "health-check-failed",
    "the prolog health check fails on node 2",
    faults=[{"at_s": 60, "kind": "health-check-fail", "node": N2, "gpu": 3}],
    expect=[ex("health-check-failed", job=None, within=5)],
)
S["health-check-failed-negative"] = sc("health-check-failed-negative", "health checks pass")

# --- job efficiency ---------------------------------------------------------------------------
for pattern, profile, within, gpu, node in [
    ("idle-allocation", "idle", 160, None, N1),
    ("partial-idle-allocation", "partial-idle", 160, 4, N1),
    ("input-starvation", "input-bound", 160, None, N1),
    ("checkpoint-stall", "checkpoint-heavy", 400, None, N1),
    ("gpu-memory-leak", "memory-leak", 250, 0, N1),
    ("low-tensor-activity", "low-tensor", 360, 0, N1),
]:
    dur = 600 if pattern in ("checkpoint-stall", "low-tensor-activity") else 300
    expect = (
        [ex(pattern, node=n, gpu=None, within=within) for n in (N1, N2)]
        if pattern in ("gpu-memory-leak", "low-tensor-activity")
        else [ex(pattern, node=node, gpu=gpu, within=within)]
    )
    S[pattern] = sc(
        pattern,
        f"a job with the {profile} profile",
        jobs=[job(profile)],
        duration=dur,
        expect=expect,
        allow=["partial-idle-allocation"] if pattern == "partial-idle-allocation" else [],
    )
    S[f"{pattern}-negative"] = sc(f"{pattern}-negative", "the same job with the training profile", duration=dur)
S["straggler-gpu"] = sc(
    "straggler-gpu",
    "GPU 3 of node 2 runs at 60 % speed",
    faults=[{"at_s": 60, "kind": "straggler-gpu", "node": N2, "gpu": 3, "factor": 0.6}],
    expect=[ex("straggler-gpu", within=75)],
)
S["straggler-gpu-negative"] = sc(
    "straggler-gpu-negative",
    "GPU 3 runs at 95 % speed: within noise",
    faults=[{"at_s": 60, "kind": "straggler-gpu", "node": N2, "gpu": 3, "factor": 0.95}],
)
S["straggler-node"] = sc(
    "straggler-node",
    "node 2 runs at 60 % speed",
    faults=[{"at_s": 60, "kind": "straggler-node", "node": N2, "factor": 0.6}],
    expect=[ex("straggler-node", gpu=None, within=75)],
    allow=["straggler-gpu"],
)
S["straggler-node-negative"] = sc(
    "straggler-node-negative",
    "node 2 at 95 % speed",
    faults=[{"at_s": 60, "kind": "straggler-node", "node": N2, "factor": 0.95}],
)
S["collective-hang"] = sc(
    "collective-hang",
    "the job hangs in a collective from 60 s",
    faults=[{"at_s": 60, "kind": "collective-hang", "node": N2}],
    expect=[ex("collective-hang", node=N1, gpu=None, within=160)],
)
S["collective-hang-negative"] = sc(
    "collective-hang-negative",
    "a 60 s hang that clears: shorter than 120 s",
    faults=[{"at_s": 60, "kind": "collective-hang", "node": N2, "duration_s": 60}],
)

# --- mixed ------------------------------------------------------------------------------------
S["mixed-several-faults"] = sc(
    "mixed-several-faults",
    "XID 79 on one node and thermal throttling on another GPU at once",
    faults=[
        {"at_s": 60, "kind": "xid", "node": N2, "gpu": 3, "xid": 79},
        {"at_s": 60, "kind": "thermal-throttle", "node": N1, "gpu": 6},
    ],
    expect=[ex("gpu-fallen-off-bus", within=5), ex("thermal-throttle", node=N1, gpu=6, within=45)],
    allow=["gpu-missing", "straggler-gpu"],
)
S["mixed-fault-at-job-start"] = sc(
    "mixed-fault-at-job-start",
    "an XID 94 in the job's first second",
    jobs=[job(start=30)],
    faults=[{"at_s": 30, "kind": "xid", "node": N1, "gpu": 0, "xid": 94}],
    expect=[ex("contained-memory-error", node=N1, gpu=0, within=5)],
    allow=["uncorrectable-ecc", "row-remap-pending"],
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
    expect=[ex("uncorrectable-ecc", gpu=5, job=None, within=5)],
    allow=["row-remap-pending"],
)

OUT.mkdir(parents=True, exist_ok=True)
for name, data in S.items():
    (OUT / f"{name}.yaml").write_text(yaml.safe_dump(data, sort_keys=False, width=120))
print(len(S), "scenarios")
