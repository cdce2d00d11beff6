"""Transport shared by the scheduler and the executor: the data port's one server and one
client (``dataport``) and the limits every TCP port holds to (``guard``). Imports
``triplane.proto`` and ``triplane.engines`` only."""
