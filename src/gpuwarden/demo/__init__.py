"""gpuwarden.demo: run the whole pipeline on a simulated fleet (``gpuwarden demo``, ``gpuwarden simulate``);
``gpuwarden analyze`` (a recording) is in :mod:`gpuwarden.recordings`.

The modules are imported where they are used (:mod:`.runner`, :mod:`.scoring`, :mod:`.inprocess`):
every ``gpuwarden`` command loads this package's CLI plugins, and the runners
pull in the services (Kafka clients, aiohttp, the detector).
"""
