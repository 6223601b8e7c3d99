"""gpuwarden.shared: schemas, topics, bus, settings and lifecycle used by every service."""

from .models import SCHEMA_VERSION

__all__ = ["SCHEMA_VERSION"]
