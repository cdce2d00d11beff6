"""The REST (FastAPI) front of the scheduler (its gRPC one is ``triplane.scheduler.grpc``)."""
