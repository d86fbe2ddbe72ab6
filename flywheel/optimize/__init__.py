"""Prompt optimisation (``flywheel optimize``): GEPA over real rollouts through the stack."""
