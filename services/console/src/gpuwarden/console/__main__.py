"""``python -m gpuwarden.console [--help]``: the same command as ``gpuwarden console``."""

from .cli import app

if __name__ == "__main__":
    app(prog_name="python -m gpuwarden.console")
