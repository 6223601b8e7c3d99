"""``python -m gpuwarden.detector [--help]``: the same command as ``gpuwarden detector``."""

from .cli import app

if __name__ == "__main__":
    app(prog_name="python -m gpuwarden.detector")
