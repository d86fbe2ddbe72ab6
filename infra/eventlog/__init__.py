"""The event log: every event of every topic in ClickHouse (embedded chdb or a server).

- :mod:`infra.eventlog.ddl` — the schema, as numbered migrations (one text for chdb and servers ≥ 24.8)
- :mod:`infra.eventlog.reader` — ``EventLogReader``: the reads, one surface for a store and the HTTP client
- :mod:`infra.eventlog.store` — ``EventStore``: ``ChdbStore``, ``ServerStore``, ``open_store``
- :mod:`infra.eventlog.recorder` — the ``recorder`` consumer group writing every topic in batches
- :mod:`infra.eventlog.api` / :mod:`infra.eventlog.client` — reads through the process holding chdb
- :mod:`infra.eventlog.models` — typed filters and results
"""
