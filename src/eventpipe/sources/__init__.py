"""Readers that feed the log beside the HTTP collector (docs/cdc.md)."""
