"""The registry of live nodes and engines: etcd and in-memory backends (distributed-runtime issue).

Layers, bottom up:

- :mod:`~triplane.registry.backend`: the narrow async contract ``RegistryBackend``
  (KV, leases with keep-alive, prefix watches, compare-and-swap) and its errors.
- :mod:`~triplane.registry.memory` / :mod:`~triplane.registry.etcd`: the two backends;
  :func:`connect_registry` picks one from a URL (``memory://``, ``etcd://host:port``).
- :mod:`~triplane.registry.records` / :mod:`~triplane.registry.nodes`: typed records under
  the ARCHITECTURE key layout, ``register_node`` (lease-bound, self-healing) and readers.
- :mod:`~triplane.registry.leader`: scheduler leader election on ``scheduler/leader``.
- :mod:`~triplane.registry.testing`: the conformance suite a backend must pass;
  :mod:`~triplane.registry.etcd_server` starts a local etcd for tests and ``triplane up``.
"""

from triplane.registry.backend import (
    DEFAULT_PREFIX,
    Entry,
    KeepAlive,
    LeaseNotFound,
    RegistryBackend,
    RegistryError,
    RegistryUnavailable,
    Watch,
    WatchEvent,
)
from triplane.registry.connect import connect_registry, known_schemes
from triplane.registry.leader import LEADER_KEY, Leadership, campaign, leader
from triplane.registry.memory import MemoryBackend, MemoryStore
from triplane.registry.nodes import (
    NodeEvent,
    NodeRegistration,
    list_bindings,
    list_drained,
    list_links,
    list_memory_engines,
    list_network_engines,
    list_node_leases,
    list_node_stats,
    list_nodes,
    list_op_engines,
    register_node,
    set_drained,
    watch_nodes,
)
from triplane.registry.records import (
    Binding,
    Drained,
    LinkInfo,
    MemoryEngineInfo,
    NetworkEngineInfo,
    NodeInfo,
    OpEngineInfo,
    RecordError,
)

__all__ = [
    "DEFAULT_PREFIX",
    "LEADER_KEY",
    "Binding",
    "Drained",
    "Entry",
    "KeepAlive",
    "Leadership",
    "LinkInfo",
    "LeaseNotFound",
    "MemoryBackend",
    "MemoryEngineInfo",
    "MemoryStore",
    "NetworkEngineInfo",
    "NodeEvent",
    "NodeInfo",
    "NodeRegistration",
    "OpEngineInfo",
    "RecordError",
    "RegistryBackend",
    "RegistryError",
    "RegistryUnavailable",
    "Watch",
    "WatchEvent",
    "campaign",
    "connect_registry",
    "known_schemes",
    "leader",
    "list_bindings",
    "list_drained",
    "list_links",
    "list_memory_engines",
    "list_network_engines",
    "list_node_leases",
    "list_node_stats",
    "list_nodes",
    "list_op_engines",
    "register_node",
    "set_drained",
    "watch_nodes",
]
