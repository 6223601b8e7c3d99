"""gpuwarden.recordings: recordings people already have, offline.

* :mod:`.analyze` / :mod:`.analyze_cli` — ``gpuwarden analyze``: a recording through the
  correlator and detector code of the services, in event time (in memory, or with ``--kafka``
  through the real services: :mod:`.analyze_kafka`).

The recording readers themselves (``nvidia-smi`` CSV logs, ``dmon``, dcgm-exporter scrapes,
``-q``/``-x`` captures, kernel logs) are in :mod:`gpuwarden.collector.recordings`; the tool
output parsers they use are shared with the collector and the health check.

Modules are imported where they are used: every ``gpuwarden`` command loads the CLI plugins.
"""
