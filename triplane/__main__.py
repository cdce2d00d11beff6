"""``python -m triplane ...`` is the ``triplane`` command."""

from triplane.cli import main

main()
