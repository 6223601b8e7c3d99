"""Slurm access shared by the slurm-watcher and the remediator.

* :class:`SlurmClient` — the narrow protocol (``jobs``, ``nodes``, ``node``, ``update_node``);
* :class:`CliSlurm` — Slurm 22.05 commands (``squeue``/``sinfo --json``, ``scontrol``);
* :class:`RestSlurm` — slurmrestd (aiohttp, unix socket or TCP, versioned paths);
* :class:`SimulatedSlurm` — the scheduler state machine of a scenario (simulation, demo);
* :class:`FakeSlurm` — in-memory, for tests;
* ``parse_*`` — pure parsers of recorded command output.
"""

from .client import (
    MAX_REASON_LEN,
    CliSlurm,
    CommandResult,
    CommandRunner,
    SlurmAccounting,
    SlurmClient,
    SlurmEndedJobs,
    SlurmError,
    SubprocessRunner,
    check_reason,
    drain_argv,
    ended_after,
    sacct_ended_argv,
)
from .factory import DEFAULT_SIM_STATE_FILE, build_client
from .names import NODE_NAME_RE, expand_nodes, validate_node_name
from .parse import (
    TERMINAL_JOB_STATES,
    SinfoJsonParser,
    SqueueJsonParser,
    api_version,
    parse_gres_idx,
    parse_idx_list,
    parse_sacct_json,
    parse_scontrol_job_gpus,
    parse_scontrol_jobs,
    parse_scontrol_nodes,
    parse_sinfo_json,
    parse_sinfo_reasons,
    parse_slurm_time,
    parse_squeue_json,
)
from .rest import AiohttpTransport, HttpTransport, RestSlurm
from .simulated import JOB_RETENTION_S, FakeSlurm, SimulatedSlurm

__all__ = [
    "DEFAULT_SIM_STATE_FILE",
    "JOB_RETENTION_S",
    "MAX_REASON_LEN",
    "NODE_NAME_RE",
    "TERMINAL_JOB_STATES",
    "AiohttpTransport",
    "CliSlurm",
    "CommandResult",
    "CommandRunner",
    "FakeSlurm",
    "HttpTransport",
    "RestSlurm",
    "SimulatedSlurm",
    "SinfoJsonParser",
    "SlurmAccounting",
    "SlurmClient",
    "SlurmEndedJobs",
    "SlurmError",
    "SqueueJsonParser",
    "SubprocessRunner",
    "api_version",
    "build_client",
    "check_reason",
    "drain_argv",
    "ended_after",
    "expand_nodes",
    "parse_gres_idx",
    "parse_idx_list",
    "parse_sacct_json",
    "parse_scontrol_job_gpus",
    "parse_scontrol_jobs",
    "parse_scontrol_nodes",
    "parse_sinfo_json",
    "parse_sinfo_reasons",
    "parse_slurm_time",
    "parse_squeue_json",
    "sacct_ended_argv",
    "validate_node_name",
]
