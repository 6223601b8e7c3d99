"""``python -m gpuwarden.health_check prolog|epilog|run NAME...``."""

from .cli import main

main()
