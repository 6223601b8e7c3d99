"""gpuwarden slurm-watcher: polls Slurm, publishes job and node state changes and snapshots."""

from .diff import GONE_STATE, diff_jobs, diff_nodes
from .service import SlurmWatcher, SlurmWatcherSettings, make_client

__all__ = ["GONE_STATE", "SlurmWatcher", "SlurmWatcherSettings", "diff_jobs", "diff_nodes", "make_client"]
