"""``python -m gpuwarden.remediator [--help]``: the same command as ``gpuwarden remediator``."""

from .cli import app

if __name__ == "__main__":
    app(prog_name="python -m gpuwarden.remediator")
