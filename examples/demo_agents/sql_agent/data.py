"""A Spider-style benchmark, generated: many small SQLite databases, questions and gold SQL.

Spider (Yu et al., 2018, https://arxiv.org/abs/1809.08887) cannot be downloaded here, so this builds its
shape from seeded vocabularies: every database has its own schema (an entity table and a group table
it references, with table, column and value names drawn per database), and questions come from a grammar
of templates covering what Spider's easy/medium queries do: counts, filters, aggregates, order/limit,
group by and joins. Simplified relative to Spider: two tables per database, one foreign key, no nested
queries, set operations or HAVING, and template English instead of paraphrases written by people.

The split is **cross-database**, as in Spider: held-out questions are asked on databases that no SFT or
RL question touches. Everything is deterministic in ``seed``. Numeric columns hold distinct values, so
"the highest" has one answer and ordered queries have no ties.

    bench = generate(Path("/tmp/sql"), seed=0, databases=40, questions_per_db=12)
    split = bench.split(held_out=0.25)          # split.train / split.test: lists of Example
    task = split.test[0].task()                 # a Flywheel task dict scored by the `sql` scorer
"""

from __future__ import annotations

import os
import random
import sqlite3
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from examples.demo_agents.sql_agent.prompts import rewriter_messages, schema_of, writer_messages

# ------------------------------------------------------------------------------ vocabularies

# (entity, group): the entity table references the group table (singer → band, pilot → airline ...)
PAIRS = [
    ("singer", "band"),
    ("pilot", "airline"),
    ("student", "school"),
    ("doctor", "hospital"),
    ("player", "team"),
    ("author", "publisher"),
    ("employee", "department"),
    ("farmer", "village"),
    ("driver", "company"),
    ("actor", "studio"),
    ("nurse", "clinic"),
    ("chef", "restaurant"),
]
NUMBERS = ["age", "salary", "rating", "height", "score", "weight", "years", "wins", "points", "level"]
CATEGORIES: dict[str, list[str]] = {
    "country": ["France", "Japan", "Brazil", "Canada", "Kenya", "Peru"],
    "city": ["Paris", "Lima", "Oslo", "Cairo", "Quito", "Perth"],
    "gender": ["female", "male"],
    "color": ["red", "blue", "green", "black", "white"],
    "grade": ["junior", "senior", "expert"],
    "status": ["active", "retired", "visiting"],
}
GROUP_NUMBERS = ["founded", "budget", "size", "members"]
NAMES = [
    "Ada", "Ben", "Cleo", "Dan", "Eve", "Finn", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lea", "Max", "Nia",
    "Oto", "Pia", "Quin", "Rae", "Sol", "Tom", "Uma", "Vic", "Wes", "Xia", "Yan", "Zoe",
]  # fmt: skip
GROUP_NAMES = ["North", "South", "East", "West", "Blue", "Gold", "Star", "Oak", "River", "Stone"]


@dataclass(frozen=True, slots=True)
class Schema:
    entity: str
    group: str
    numbers: tuple[str, str]
    category: str
    group_category: str
    group_number: str

    @property
    def fk(self) -> str:
        return f"{self.group}_id"


@dataclass(frozen=True, slots=True)
class Example:
    task_id: str
    db_id: str
    db: str  # path of the SQLite file
    question: str
    gold: str
    template: str

    def task(self) -> dict[str, Any]:
        """The Flywheel task: the agent gets the question and the database, the scorer the gold query."""
        return {
            "task_id": self.task_id,
            "input": {"question": self.question, "db": self.db},
            "answer": self.gold,
            "scorer": {"name": "sql", "options": {}},
            "metadata": {"db": self.db, "db_id": self.db_id, "template": self.template},
        }


@dataclass(slots=True)
class Split:
    train: list[Example]  # SFT and RL draw from these databases only
    test: list[Example]  # held out: questions on databases never seen in train


@dataclass(slots=True)
class Benchmark:
    examples: list[Example]
    schemas: dict[str, Schema] = field(default_factory=dict)
    seed: int = 0

    def split(self, held_out: float = 0.25) -> Split:
        """Cross-database split: a seeded ``held_out`` share of the databases and all their questions."""
        if not 0.0 < held_out < 1.0:
            raise ValueError("held_out must be between 0 and 1")
        dbs = sorted(self.schemas)
        random.Random(f"split-{self.seed}").shuffle(dbs)
        n_test = max(1, round(len(dbs) * held_out))
        test_dbs = set(dbs[:n_test])
        return Split(
            train=[e for e in self.examples if e.db_id not in test_dbs],
            test=[e for e in self.examples if e.db_id in test_dbs],
        )


# ---------------------------------------------------------------------------------- databases


def _schema(rng: random.Random) -> Schema:
    entity, group = rng.choice(PAIRS)
    n1, n2 = rng.sample(NUMBERS, 2)
    cat, gcat = rng.sample(sorted(CATEGORIES), 2)
    return Schema(entity, group, (n1, n2), cat, gcat, rng.choice(GROUP_NUMBERS))


def _build(path: Path, s: Schema, rng: random.Random) -> None:
    n_groups = rng.randint(3, 5)
    n_rows = rng.randint(6, 12)
    groups = rng.sample(GROUP_NAMES, n_groups)
    gnums = rng.sample(range(10, 400), n_groups)
    # Built aside and moved into place: another process generating the same recipe (two demos sharing a
    # cache) or an episode reading the file never sees it half written.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    os.close(fd)
    conn = sqlite3.connect(tmp)
    try:
        conn.execute(
            f"CREATE TABLE {s.group} (id INTEGER PRIMARY KEY, name TEXT, {s.group_category} TEXT, "
            f"{s.group_number} INTEGER)"
        )
        conn.execute(
            f"CREATE TABLE {s.entity} (id INTEGER PRIMARY KEY, name TEXT, {s.numbers[0]} INTEGER, "
            f"{s.numbers[1]} INTEGER, {s.category} TEXT, {s.fk} INTEGER REFERENCES {s.group}(id))"
        )
        for i, name in enumerate(groups):
            conn.execute(
                f"INSERT INTO {s.group} VALUES (?, ?, ?, ?)",
                (i + 1, name, rng.choice(CATEGORIES[s.group_category]), gnums[i]),
            )
        names = rng.sample(NAMES, n_rows)
        first = rng.sample(range(18, 99), n_rows)  # distinct: "the highest" has one answer
        second = rng.sample(range(1, 200), n_rows)
        for i in range(n_rows):
            conn.execute(
                f"INSERT INTO {s.entity} VALUES (?, ?, ?, ?, ?, ?)",
                (
                    i + 1,
                    names[i],
                    first[i],
                    second[i],
                    rng.choice(CATEGORIES[s.category]),
                    rng.randint(1, n_groups),
                ),
            )
        conn.commit()
    except BaseException:
        conn.close()
        os.unlink(tmp)
        raise
    conn.close()
    os.replace(tmp, path)


def _values(db: Path, sql: str) -> list[Any]:
    conn = sqlite3.connect(db)
    try:
        return [row[0] for row in conn.execute(sql).fetchall()]
    finally:
        conn.close()


# ---------------------------------------------------------------------------------- questions

TEMPLATES = (
    "count", "filter_number", "filter_category", "aggregate", "argmax", "top_k", "group_count",
    "join_filter", "join_group", "join_category",
)  # fmt: skip


def _used(s: Schema, column: str) -> str:
    """The values of a group column that some entity row refers to (a join question has an answer)."""
    return (
        f"SELECT DISTINCT T2.{column} FROM {s.entity} AS T1 JOIN {s.group} AS T2 ON T1.{s.fk} = T2.id "
        f"ORDER BY T2.{column}"
    )


def _question(template: str, s: Schema, db: Path, rng: random.Random) -> tuple[str, str]:
    e, g, fk = s.entity, s.group, s.fk
    num = rng.choice(s.numbers)
    if template == "count":
        return f"How many {e}s are there?", f"SELECT COUNT(*) FROM {e}"
    if template == "filter_number":
        op, word = rng.choice([(">", "greater than"), ("<", "less than")])
        values = sorted(_values(db, f"SELECT {num} FROM {e}"))
        v = rng.choice(values[1:] if op == "<" else values[:-1])  # never an empty answer
        return (
            f"List the names of {e}s whose {num} is {word} {v}.",
            f"SELECT name FROM {e} WHERE {num} {op} {v}",
        )
    if template == "filter_category":
        v = rng.choice(_values(db, f"SELECT {s.category} FROM {e}"))
        return f"How many {e}s have {s.category} {v}?", f"SELECT COUNT(*) FROM {e} WHERE {s.category} = '{v}'"
    if template == "aggregate":
        fn, word = rng.choice([("AVG", "average"), ("MAX", "maximum"), ("MIN", "minimum"), ("SUM", "total")])
        return f"What is the {word} {num} of all {e}s?", f"SELECT {fn}({num}) FROM {e}"
    if template == "argmax":
        order, word = rng.choice([("DESC", "highest"), ("ASC", "lowest")])
        return (
            f"What is the name of the {e} with the {word} {num}?",
            f"SELECT name FROM {e} ORDER BY {num} {order} LIMIT 1",
        )
    if template == "top_k":
        k = rng.randint(2, 4)
        order, word = rng.choice([("DESC", "highest"), ("ASC", "lowest")])
        return (
            f"List the names of the {k} {e}s with the {word} {num}, in order.",
            f"SELECT name FROM {e} ORDER BY {num} {order} LIMIT {k}",
        )
    if template == "group_count":
        return (
            f"For each {s.category}, how many {e}s are there?",
            f"SELECT {s.category}, COUNT(*) FROM {e} GROUP BY {s.category}",
        )
    if template == "join_filter":
        v = rng.choice(_values(db, _used(s, "name")))
        return (
            f"List the names of {e}s of the {g} named {v}.",
            f"SELECT T1.name FROM {e} AS T1 JOIN {g} AS T2 ON T1.{fk} = T2.id WHERE T2.name = '{v}'",
        )
    if template == "join_group":
        return (
            f"How many {e}s does each {g} have? Give the {g} name and the count.",
            f"SELECT T2.name, COUNT(*) FROM {e} AS T1 JOIN {g} AS T2 ON T1.{fk} = T2.id GROUP BY T2.name",
        )
    if template == "join_category":
        v = rng.choice(_values(db, _used(s, s.group_category)))
        return (
            f"List the names of {e}s whose {g} has {s.group_category} {v}.",
            f"SELECT T1.name FROM {e} AS T1 JOIN {g} AS T2 ON T1.{fk} = T2.id "
            f"WHERE T2.{s.group_category} = '{v}'",
        )
    raise ValueError(f"unknown template {template!r}")


def generate(out_dir: Path, *, seed: int = 0, databases: int = 40, questions_per_db: int = 10) -> Benchmark:
    """Write ``databases`` SQLite files under ``out_dir`` and their questions; the same seed, the same
    files and questions. Questions of one database are distinct."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    bench = Benchmark(examples=[], seed=seed)
    for d in range(databases):
        schema = _schema(rng)
        db_id = f"db{d:03d}_{schema.entity}"
        path = out_dir / f"{db_id}.sqlite"
        _build(path, schema, rng)
        bench.schemas[db_id] = schema
        seen: set[str] = set()
        for _ in range(questions_per_db * 20):
            if len(seen) == questions_per_db:
                break
            template = TEMPLATES[len(seen) % len(TEMPLATES)] if len(seen) < len(TEMPLATES) else None
            template = template or rng.choice(TEMPLATES)
            question, gold = _question(template, schema, path, rng)
            if question in seen:
                continue
            seen.add(question)
            n = len(seen) - 1
            bench.examples.append(Example(f"{db_id}-q{n:02d}", db_id, str(path), question, gold, template))
    return bench


# ------------------------------------------------------------------------------ sloppy teacher

_MISTAKES = ("wrong_column", "flip_order", "drop_limit", "typo", "drop_where")


def _mistake(gold: str, kind: str, s: Schema) -> str:
    """A plausible wrong query: the teacher's deliberate errors (some fail to run, some run wrongly)."""
    if kind == "wrong_column":
        a, b = s.numbers
        if a in gold or b in gold:
            return gold.replace(a, "\0").replace(b, a).replace("\0", b)
        return gold.replace("COUNT(*)", "COUNT(name)").replace("SELECT name", f"SELECT {a}")
    if kind == "flip_order":
        flipped = gold.replace(" DESC", " \0").replace(" ASC", " DESC").replace(" \0", " ASC")
        return flipped.replace(" > ", " \0 ").replace(" < ", " > ").replace(" \0 ", " < ")
    if kind == "drop_limit":
        return gold.split(" LIMIT")[0] if " LIMIT" in gold else gold.replace("COUNT(*)", "*")
    if kind == "typo":
        return gold.replace("SELECT", "SELEC", 1)
    return gold.split(" WHERE")[0] if " WHERE" in gold else gold.replace(" FROM", " FORM", 1)


def _error(db: str, sql: str) -> str | None:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        conn.execute(sql).fetchall()
        return None
    except sqlite3.Error as exc:
        return f"Error: {exc}"
    finally:
        conn.close()


def sloppy_teacher(
    examples: list[Example], *, seed: int = 0, mistake_rate: float = 0.3
) -> list[dict[str, Any]]:
    """SFT demonstrations in the agent's exact chat format (``{"role", "messages"}``, the last message the
    assistant's reply). The teacher writes the gold query, except that with ``mistake_rate`` it writes a
    deliberately wrong one; a wrong query is followed by a rewriter demonstration that fixes it from the
    SQLite error (or, for a query that runs, the checker's complaint). Warm start only: RL has to close
    the gap the teacher's mistakes leave.

    A mistake always changes the query: its kinds are tried in a random order until one does (a query
    without ORDER BY has no order to flip), so every question shape is written wrong at the same rate and
    right in ``1 - mistake_rate`` of its demonstrations."""
    rng = random.Random(f"teacher-{seed}")
    out: list[dict[str, Any]] = []
    schemas: dict[str, str] = {}
    for ex in examples:
        schema = schemas.setdefault(ex.db, schema_of(ex.db))
        written = ex.gold
        if rng.random() < mistake_rate:
            written = _some_mistake(ex, rng)
        messages = writer_messages(schema, ex.question)
        out.append({"role": "writer", "messages": [*messages, {"role": "assistant", "content": written}]})
        if written != ex.gold:
            problem = _error(ex.db, written) or "WRONG: the result does not answer the question."
            fix = rewriter_messages(schema, ex.question, written, problem)
            out.append({"role": "rewriter", "messages": [*fix, {"role": "assistant", "content": ex.gold}]})
    return out


def _some_mistake(ex: Example, rng: random.Random) -> str:
    """The first of the mistake kinds, in a random order, that changes ``ex.gold`` (the gold query when
    none does)."""
    schema = _schema_for(ex)
    for kind in rng.sample(_MISTAKES, len(_MISTAKES)):
        candidate = _mistake(ex.gold, kind, schema)
        if candidate != ex.gold:
            return candidate
    return ex.gold


def _schema_for(ex: Example) -> Schema:
    """The schema of an example's database, read back from its table and column names."""
    conn = sqlite3.connect(f"file:{ex.db}?mode=ro", uri=True)
    try:
        tables = [
            r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY rowid")
        ]
        group, entity = tables[0], tables[1]
        ecols = [r[1] for r in conn.execute(f"PRAGMA table_info({entity})")]
        gcols = [r[1] for r in conn.execute(f"PRAGMA table_info({group})")]
    finally:
        conn.close()
    return Schema(entity, group, (ecols[2], ecols[3]), ecols[4], gcols[2], gcols[3])
