"""The read-only gate in front of ``query(sql)``.

Two layers: this lexical check (one statement, a read verb first, no write verb or file/network table
function anywhere outside string literals and quoted identifiers), and then the engine's own
``readonly`` setting on the connection that runs it. The check alone would be a blocklist; the setting
alone would give unclear errors. Together a write never runs and the user learns why in one line.
"""

from __future__ import annotations

import re

from infra.eventlog.errors import ReadOnlyQueryError

_READ_VERBS = frozenset({"SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXPLAIN", "EXISTS"})
_WRITE_WORDS = frozenset(
    {
        "INSERT", "ALTER", "CREATE", "DROP", "TRUNCATE", "DELETE", "UPDATE", "OPTIMIZE", "RENAME",
        "ATTACH", "DETACH", "GRANT", "REVOKE", "KILL", "SYSTEM", "SET", "USE", "EXCHANGE", "UNDROP",
        "BACKUP", "RESTORE", "MOVE", "INTO", "OUTFILE", "UPSERT", "MERGE", "CHECK",
    }
)  # fmt: skip
# Table functions that read or write outside the event log (files, network, processes, other DBs).
_OUTSIDE_FUNCTIONS = frozenset(
    {
        "file", "filecluster", "url", "urlcluster", "s3", "s3cluster", "gcs", "azureblobstorage",
        "azureblobstoragecluster", "hdfs", "hdfscluster", "remote", "remotesecure", "cluster",
        "clusterallreplicas", "mysql", "postgresql", "mongodb", "redis", "sqlite", "jdbc", "odbc",
        "executable", "python", "input", "deltalake", "iceberg", "hudi", "paimon", "arrowflight",
        "dictionary", "view", "loop", "fuzzjson", "fuzzquery", "ytsaurus",
    }
)  # fmt: skip

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<line>(--|\#)[^\n]*)
  | (?P<block>/\*.*?(\*/|\Z))
  | (?P<str>'(?:[^'\\]|\\.|'')*'?)
  | (?P<qid>"(?:[^"\\]|\\.|"")*"?|`(?:[^`\\]|\\.|``)*`?)
  | (?P<word>[A-Za-z_][A-Za-z0-9_$]*)
  | (?P<semi>;)
  | (?P<other>.)
    """,
    re.VERBOSE | re.DOTALL,
)


def _tokens(sql: str) -> list[tuple[str, str, int]]:
    out: list[tuple[str, str, int]] = []
    for m in _TOKEN.finditer(sql):
        kind = m.lastgroup or "other"
        if kind in ("ws", "line", "block"):
            continue
        text = m.group()
        if kind == "str" and (len(text) < 2 or not text.endswith("'")):
            raise ReadOnlyQueryError("unterminated string literal")
        out.append((kind, text, m.end()))
    return out


def check_read_only(sql: str) -> str:
    """Return the one statement of ``sql`` (trailing ``;`` removed) or raise :class:`ReadOnlyQueryError`."""
    if len(sql) > 100_000:
        raise ReadOnlyQueryError("query longer than 100000 characters")
    tokens = _tokens(sql)
    while tokens and tokens[-1][0] == "semi":
        tokens.pop()
    if not tokens:
        raise ReadOnlyQueryError("empty query")
    if any(kind == "semi" for kind, _, _ in tokens):
        raise ReadOnlyQueryError("only one statement is allowed")
    first = tokens[0][1].upper() if tokens[0][0] == "word" else tokens[0][1]
    if first == "(":
        first = next((t.upper() for k, t, _ in tokens if k == "word"), "")
    if first not in _READ_VERBS:
        raise ReadOnlyQueryError(
            f"only SELECT, WITH, SHOW, DESCRIBE, EXPLAIN are allowed, not {first[:30] or 'this'}"
        )
    for i, (kind, text, _) in enumerate(tokens):
        if kind != "word":
            continue
        upper = text.upper()
        prev = tokens[i - 1][1] if i > 0 else ""
        qualified = prev == "." or (i + 1 < len(tokens) and tokens[i + 1][1] == ".")  # system.parts, t.set
        if upper in _WRITE_WORDS and not qualified:
            raise ReadOnlyQueryError(f"{upper} is not allowed in a read-only query")
        nxt = tokens[i + 1][1] if i + 1 < len(tokens) else ""
        if nxt == "(" and text.lower() in _OUTSIDE_FUNCTIONS:
            raise ReadOnlyQueryError(f"table function {text}() is not allowed in a read-only query")
    return sql[: tokens[-1][2]].strip()
