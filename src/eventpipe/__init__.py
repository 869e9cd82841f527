"""eventpipe: collect events over HTTP, keep them durably, process them on Spark."""

__version__ = "0.1.0"
