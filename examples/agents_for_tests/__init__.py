"""Tiny agents used by Flywheel's own tests. Each imports nothing of Flywheel."""
