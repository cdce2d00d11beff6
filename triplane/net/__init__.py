"""Transport shared by the scheduler and the executor: the data port's one server and one
client (``dataport``), the limits every TCP port holds to (``guard``), and the guarded HTTP
serving of the scheduler's API and the served registry (``http``). Imports
``triplane.proto`` and ``triplane.engines`` only."""
