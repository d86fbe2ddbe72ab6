"""Operations logic behind the admin CLI (status, doctor, health checks, the admin HTTP client).

Nothing here prints or parses command lines: :mod:`infra.application.cli.ops_cmd` does.
"""
