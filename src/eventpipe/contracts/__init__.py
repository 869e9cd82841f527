"""Data contracts: tracking plans (a JSON Schema per event, :mod:`eventpipe.contracts.plans`)
and the check of an event against its plan (:mod:`eventpipe.contracts.check`), at the
collector when configured (docs/contracts.md)."""
