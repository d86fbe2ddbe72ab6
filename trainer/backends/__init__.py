"""Training backends: the :class:`~trainer.backends.base.Backend` protocol and its implementations."""
