"""The web view of the event log: episodes, one episode's calls and tokens, training (``flywheel ui``,
and ``/ui`` on the port of ``flywheel up``). See README.md in this folder."""
