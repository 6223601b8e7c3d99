"""Benchmarks of the services (``gpuwarden bench NAME``, entry points ``gpuwarden.bench`` of the
``gpuwarden`` package): ``bridge``, ``chaos``, ``collector``, ``correlator``, ``detect``,
``health-check``, ``pipeline``, ``slurm``; one module each (``pipeline``'s figures in
:mod:`.figures`)."""
