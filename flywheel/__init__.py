"""The application, above the services: the ``flywheel`` CLI, the web view, the embedded stack and the
one builder every entry point assembles its parts with, the ops API, replay and export, prompt
optimisation.

Nothing in ``schemas``, ``infra`` or a service imports this package; the demo (``examples/demo``) stands
above it (``tests/unit/test_layering.py``).
"""
