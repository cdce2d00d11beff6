"""``python -m triplane.executor --registry URL ...``: run one executor (see ``cli.py``)."""

from triplane.executor.cli import main

main()
