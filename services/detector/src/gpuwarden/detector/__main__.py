from gpuwarden.shared.service import run_service

from .service import DetectorService, DetectorSettings

if __name__ == "__main__":
    _s = DetectorSettings()
    raise SystemExit(run_service(lambda: DetectorService(_s), _s.log_level))
