"""Destinations: one module per type behind the small protocol in ``base.py``."""
