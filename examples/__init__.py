"""Real agents trained with Flywheel. Each imports nothing of Flywheel."""
