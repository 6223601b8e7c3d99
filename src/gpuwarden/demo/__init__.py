"""gpuwarden.demo: run the whole pipeline on a simulated fleet (``gpuwarden demo``, ``gpuwarden simulate``)
or on a recording (``gpuwarden analyze``).

The modules are imported where they are used (:mod:`.runner`, :mod:`.scoring`, :mod:`.inprocess`,
:mod:`.analyze`): every ``gpuwarden`` command loads this package's CLI plugins, and the runners
pull in the services (Kafka clients, aiohttp, the detector).
"""
