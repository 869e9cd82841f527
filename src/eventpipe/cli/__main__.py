"""``python -m eventpipe.cli``."""

from eventpipe.cli import main

main()
