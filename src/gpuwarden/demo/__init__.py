"""gpuwarden.demo: run the whole pipeline on a simulated fleet (``gpuwarden demo``, ``gpuwarden simulate``)."""

from .runner import Pipeline, RunResult, score

__all__ = ["Pipeline", "RunResult", "score"]
