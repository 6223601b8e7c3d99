"""``python -m gpuwarden.slurm_watcher [--help]``: the same command as ``gpuwarden slurm-watcher``."""

from .cli import app

if __name__ == "__main__":
    app(prog_name="python -m gpuwarden.slurm_watcher")
