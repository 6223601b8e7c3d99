from gpuwarden.shared.service import run_service

from .service import Remediator, RemediatorSettings

if __name__ == "__main__":
    _s = RemediatorSettings()
    raise SystemExit(run_service(lambda: Remediator(_s), _s.log_level))
