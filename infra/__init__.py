"""What the services stand on, and the application on top of them.

The ground, which every service may import: the buses (``infra.bus``), the event log
(``infra.eventlog``), settings (``infra.settings``), logging (``infra.logging``) and the Kafka launcher
(``infra.kafka``). The application (``flywheel``): the CLI, the embedded stack, the demo, the
ops API, replay, export and prompt optimisation; it imports the services and the ground, and nothing
imports it but itself and the tests (``tests/unit/test_layering.py`` checks both directions).
"""
