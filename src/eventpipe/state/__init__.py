"""The metadata store: runs, per segment x destination x table status."""
