"""The registry of live nodes and engines: etcd and in-memory backends (distributed-runtime issue)."""
