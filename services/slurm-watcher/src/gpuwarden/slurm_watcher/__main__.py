from gpuwarden.shared.service import run_service

from .service import SlurmWatcher, SlurmWatcherSettings

if __name__ == "__main__":
    _s = SlurmWatcherSettings()
    raise SystemExit(run_service(lambda: SlurmWatcher(_s), _s.log_level))
