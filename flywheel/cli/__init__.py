"""The ``flywheel`` admin CLI: the one place that wires services together."""
