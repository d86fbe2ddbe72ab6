"""rollout_worker."""
