"""The engines that host a federation in one process: the real ServerApp strategy and
ClientApp clients without a SuperLink (``inprocess``, its ``cohort`` step and ``heap``),
and Flower's own Ray simulation started from Python (``simulate``). They compose both
apps, so they sit above them (docs/ARCHITECTURE.md)."""
