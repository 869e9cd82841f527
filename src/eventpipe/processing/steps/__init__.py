"""The shaping steps a run applies per destination, each pure DataFrame (or column)
work: fields at JSON pointers, flattening, mappings, table names, lookups, transforms,
metering, and the lattice type of each column. Imports nothing else of ``processing``."""
