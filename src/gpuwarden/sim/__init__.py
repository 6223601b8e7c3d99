"""gpuwarden.sim: the simulation and benchmark layer of the ``gpuwarden`` umbrella package.

Service packages hold only their runtime code; everything that fakes a node, a scheduler or a
broker, and every benchmark, lives here (it may import any service; no service imports it):

* :mod:`.gpu_model` - the raw telemetry of a simulated HGX H100 node (jobs, profiles, faults);
* :mod:`.nvml` - :class:`~gpuwarden.sim.nvml.FakeNvml`, that model behind the NVML call names;
* :mod:`.kernel_log` - XID / SXID kernel-log lines of a simulated node's faults;
* :mod:`.collector` - :class:`~gpuwarden.sim.collector.SimulatedSource`, the collector's
  ``simulated`` source;
* :mod:`.health_check` - the health check on a simulated node (fake ``dcgmi``, kernel log, NVML);
* :mod:`.slurm` - :class:`~gpuwarden.sim.slurm.SimulatedSlurm` (scenario state machine) and
  :class:`~gpuwarden.sim.slurm.FakeSlurm` (in memory, for tests);
* :mod:`.brokers` - embedded Tansu and local Apache Kafka brokers (tests, benches, demo);
  :mod:`.cli` - ``gpuwarden broker``;
* :mod:`.bench` - ``gpuwarden bench collector|correlator|health-check|slurm``.

A service selects a simulated backend by a setting and finds it through an entry point that
this package registers (see :mod:`gpuwarden.shared.plugins`): ``gpuwarden.collector_sources``,
``gpuwarden.slurm_backends``, ``gpuwarden.health_check_nvml``. Nothing is imported here, so
loading one of them does not import the others.
"""
