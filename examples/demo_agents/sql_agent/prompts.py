"""The SQL agent's prompts and SQLite helpers, without third-party imports (the data generator and its
sloppy teacher build demonstrations in exactly the format the agent sends)."""

from __future__ import annotations

import re
import sqlite3
import time
from typing import Any

WRITER_SYSTEM = "Write one SQLite query that answers the question. Reply with the query only."
REWRITER_SYSTEM = "Fix the SQLite query so that it answers the question. Reply with the query only."
CHECKER_SYSTEM = (
    "Check whether the SQLite query answers the question. Reply CORRECT, or WRONG and the reason."
)
PREVIEW_ROWS = 5


def schema_of(db: str) -> str:
    """The database's ``CREATE TABLE`` statements, as a LangGraph SQL agent shows them to the model."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' ORDER BY rowid").fetchall()
    finally:
        conn.close()
    return "\n".join(f"{r[0]};" for r in rows if r[0])


def writer_messages(schema: str, question: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": WRITER_SYSTEM},
        {"role": "user", "content": f"{schema}\nQuestion: {question}"},
    ]


def rewriter_messages(schema: str, question: str, query: str, problem: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": REWRITER_SYSTEM},
        {"role": "user", "content": f"{schema}\nQuestion: {question}\nQuery: {query}\nProblem: {problem}"},
    ]


def checker_messages(question: str, query: str, result: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": CHECKER_SYSTEM},
        {"role": "user", "content": f"Question: {question}\nQuery: {query}\nResult: {result}"},
    ]


_FENCE = re.compile(r"```(?:sql)?\s*(.*?)(?:```|$)", re.DOTALL | re.IGNORECASE)


def extract_sql(reply: str) -> str:
    """The query in a model reply: the fenced block if any, else the text; one statement, no ``;``."""
    fenced = _FENCE.search(reply)
    text = fenced.group(1) if fenced else reply
    return text.strip().split(";")[0].strip()


def execute(db: str, sql: str, *, timeout_s: float = 5.0) -> tuple[list[tuple[Any, ...]] | None, str]:
    """Run ``sql`` read-only: ``(rows, preview)`` or ``(None, "Error: ...")``. A runaway query (the model
    wrote it) is interrupted after ``timeout_s``."""
    if not sql:
        return None, "Error: empty query"
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    deadline = time.monotonic() + timeout_s
    conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
    try:
        rows = conn.execute(sql).fetchmany(1000)
    except (sqlite3.Error, sqlite3.Warning) as exc:
        return None, f"Error: {exc}"
    finally:
        conn.close()
    preview = repr(rows[:PREVIEW_ROWS]) + (f" ... ({len(rows)} rows)" if len(rows) > PREVIEW_ROWS else "")
    return rows, preview


def verdict(reply: str) -> bool:
    """The checker's reply: only an explicit WRONG sends the query back (a checker that rambles passes)."""
    return "WRONG" not in reply.upper()
