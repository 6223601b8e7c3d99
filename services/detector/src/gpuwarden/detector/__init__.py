"""gpuwarden.detector: the failure catalog applied to attributed GPU events and samples."""

from .catalog import Catalog, CatalogError, Rule, load_catalog
from .engine import Detector
from .service import DetectorService, DetectorSettings

__all__ = ["Catalog", "CatalogError", "Detector", "DetectorService", "DetectorSettings", "Rule", "load_catalog"]
