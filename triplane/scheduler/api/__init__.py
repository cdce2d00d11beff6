"""The REST (FastAPI) and gRPC front of the scheduler (the distributed-runtime issue)."""
