"""``python -m gpuwarden.otlp_bridge``."""

from .cli import app

if __name__ == "__main__":
    app(prog_name="python -m gpuwarden.otlp_bridge")
