"""The control plane: API, compiler and dispatcher."""
