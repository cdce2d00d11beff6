"""The Python SDK: lazy tensors, functions, nn, optim and the session that runs graphs."""
