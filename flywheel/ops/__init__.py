"""Operations logic behind the admin CLI (status, doctor, health checks, the admin HTTP client).

Nothing here prints or parses command lines: :mod:`flywheel.cli.ops_cmd` does.
"""
