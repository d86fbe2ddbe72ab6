"""Agent Lightning v1.0's server API on Flywheel's gateway, bus and event log (``flywheel agl-server``).

- ``models.py``: the wire shapes AGL 1.0 clients send and expect (rollouts, events, models, pause).
- ``state.py``: the state of one tenant (rollouts, attempts, events, models, terminal log), changed
  only by applying records; the triplet projection of events.
- ``journal.py``: the durable store the state is rebuilt from on start (SQLite, WAL).
- ``serving.py``: the operations (no FastAPI): every change is journaled, published on the bus
  (``AglRecorded`` on ``flywheel.agl``; calls as ``LLMCallRecorded``, rewards and outcomes as
  ``RewardReported``/``EpisodeFinished`` on ``flywheel.episodes``) and then applied.
- ``proxy.py``: the model-call proxy on the gateway's ``CallService`` (capture, recording, streaming).
- ``routes.py``: the thin FastAPI app (key check, AGL's ``{"detail": ...}`` errors).
"""
