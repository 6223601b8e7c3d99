"""Slurm access shared by the slurm-watcher and the remediator.

* :class:`SlurmClient` — the narrow protocol (``jobs``, ``nodes``, ``node``, ``update_node``);
* :class:`CliSlurm` — Slurm 22.05 commands (``squeue``/``sinfo --json``, ``scontrol``);
* :class:`RestSlurm` — slurmrestd (aiohttp, unix socket or TCP, versioned paths);
* ``simulated`` backend of :func:`build_client` — the simulation layer's
  :class:`~gpuwarden.sim.slurm.SimulatedSlurm` (entry point ``gpuwarden.slurm_backends``);
  :class:`~gpuwarden.sim.slurm.FakeSlurm` (in memory, for tests) lives there too;
* ``parse_*`` — pure parsers of recorded command output: JSON documents in :mod:`.jsonparse`,
  text output in :mod:`.textparse`, the field grammar both share in :mod:`.fields`;
  :mod:`.parsers` adapts them to ``gpuwarden parse``.
"""

from .client import (
    MAX_REASON_LEN,
    CliSlurm,
    CommandResult,
    SlurmAccounting,
    SlurmClient,
    SlurmEndedJobs,
    SlurmError,
    check_reason,
    drain_argv,
    ended_after,
    sacct_ended_argv,
)
from .factory import DEFAULT_SIM_STATE_FILE, build_client
from .fields import TERMINAL_JOB_STATES, parse_gres_idx, parse_idx_list
from .jsonparse import (
    SinfoJsonParser,
    SqueueJsonParser,
    api_version,
    parse_sacct_json,
    parse_sinfo_json,
    parse_squeue_json,
)
from .names import NODE_NAME_RE, expand_nodes, validate_node_name
from .rest import AiohttpTransport, HttpTransport, RestSlurm
from .textparse import (
    parse_scontrol_job_gpus,
    parse_scontrol_jobs,
    parse_scontrol_nodes,
    parse_sinfo_reasons,
    parse_slurm_time,
)

__all__ = [
    "DEFAULT_SIM_STATE_FILE",
    "MAX_REASON_LEN",
    "NODE_NAME_RE",
    "TERMINAL_JOB_STATES",
    "AiohttpTransport",
    "CliSlurm",
    "CommandResult",
    "HttpTransport",
    "RestSlurm",
    "SinfoJsonParser",
    "SlurmAccounting",
    "SlurmClient",
    "SlurmEndedJobs",
    "SlurmError",
    "SqueueJsonParser",
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
