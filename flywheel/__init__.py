"""The application on top of the ground: the ``flywheel`` CLI, the embedded stack, the demo, the ops
API, replay and export, prompt optimisation, and the engine subprocess the stack starts.

Nothing in the ground (the rest of ``infra``) or in a service imports this package
(``tests/unit/test_layering.py``).
"""
