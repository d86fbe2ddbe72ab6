"""Small models built locally from configs (no model hub)."""
