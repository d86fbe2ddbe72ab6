"""The configuration reference (``docs/configuration.md``), generated from the settings models.

Every ``FLYWHEEL_*`` variable is a field of one pydantic-settings model (``infra/settings.py`` and each
service's ``settings.py``), so the page is rendered from those models: the variable, its type as written,
its default, and its meaning, taken from the field's ``description`` or else from the comment written
beside or above it in the source (comments are where this codebase explains its settings). The
algorithm's knobs (``FLYWHEEL_TRAINER_ALGO__<FIELD>``) take their meaning from the first sentence of
their entry in ``trainer/config.py``'s docstring. Variables read outside the models (the environment an
agent is given, helpers of the CLI) are listed with the modules that read them.

    python -m flywheel.config_reference            # rewrite docs/configuration.md
    python -m flywheel.config_reference --check    # exit 1 when the committed page is stale

``tests/unit/test_docs.py`` fails when the committed page differs from what this renders.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Literal, get_args, get_origin

from pydantic import BaseModel, SecretStr
from pydantic_core import PydanticUndefined

import trainer.config
from flywheel.stack_settings import PARTS, StackGatewaySettings, StackSettings
from gateway.settings import GatewaySettings
from infra.eventlog.settings import EventLogSettings
from infra.otel.settings import OtelSettings
from infra.settings import FlywheelSettings
from reward_service.settings import RewardSettings
from rollout_worker.settings import WorkerSettings
from trainer.config import AlgorithmConfig
from trainer.settings import TrainerSettings

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "configuration.md"
PACKAGES = ("schemas", "infra", "gateway", "rollout_worker", "reward_service", "trainer", "flywheel")
_VAR = re.compile(r"\bFLYWHEEL_[A-Z0-9_]*[A-Z0-9]\b")

# Meanings of the fields whose source carries neither a description nor a comment (or, for the
# algorithm's knobs, whose docstring entry's first sentence says too little). A field that has
# neither, and no entry here, fails ``undocumented()`` (and so the docs test); an entry here for a field
# that no longer exists fails ``unused_meanings()``.
MEANINGS: dict[str, str] = {
    "FLYWHEEL_ENV": "production refuses placeholder secrets (the admin token)",
    "FLYWHEEL_BUS": "memory: the in-process bus (one process); kafka: Apache Kafka at FLYWHEEL_KAFKA_BOOTSTRAP",
    "FLYWHEEL_KAFKA_BOOTSTRAP": "Kafka bootstrap servers (host:port, comma-separated)",
    "FLYWHEEL_TOPIC_PREFIX": "prefix of every topic name (and of consumer-group journals): stacks sharing a broker never meet",
    "FLYWHEEL_DATA_DIR": "where local state lives: chdb, the gateway's spool and keys, journals, checkpoints",
    "FLYWHEEL_ADMIN_TOKEN": "bearer token of the admin routes; the placeholder is refused when FLYWHEEL_ENV=production",
    "FLYWHEEL_MODEL": "the policy's model name (key of flywheel.control, the name agents ask for)",
    "FLYWHEEL_LOG_LEVEL": "structlog level",
    "FLYWHEEL_GATEWAY_HOST": "address the gateway listens on",
    "FLYWHEEL_GATEWAY_PORT": "port the gateway listens on",
    "FLYWHEEL_GATEWAY_ID": "this gateway's id in InferenceDrained / InferenceResumed (default gw-<host>-<pid>)",
    "FLYWHEEL_MAX_BODY_BYTES": "largest request body accepted (413 beyond, chunked bodies too)",
    "FLYWHEEL_UPSTREAM_KIND": "vllm or embedded (token ids and logprobs asked for), or openai (a hosted API, recorded text-only)",
    "FLYWHEEL_UPSTREAM_API_KEY": "bearer key sent to the upstream",
    "FLYWHEEL_LOGPROBS_MODE": "the logprobs mode the upstream serves, recorded on every call",
    "FLYWHEEL_UPSTREAM_TIMEOUT_S": "timeout of one upstream request",
    "FLYWHEEL_UPSTREAM_RETRIES": "retries on connection errors, 429 and 5xx",
    "FLYWHEEL_UPSTREAM_BACKOFF_S": "first backoff between upstream retries",
    "FLYWHEEL_EPISODES_FROM_BEGINNING": "read flywheel.episodes from its start when the gateway starts (call_seq numbering)",
    "FLYWHEEL_INITIAL_WEIGHT_VERSION": "the weight version stamped on calls before the first WeightsActivated",
    "FLYWHEEL_GATEWAY_URL": "the gateway agents are pointed at",
    "FLYWHEEL_WORKER_GROUP": "the workers' consumer group",
    "FLYWHEEL_WORKER_ID": "this worker's id (default <host>-<pid>)",
    "FLYWHEEL_CONCURRENCY": "episodes run at once (and tasks per committed batch)",
    "FLYWHEEL_RETRY_STATUSES": "episode statuses that are retried as a new attempt",
    "FLYWHEEL_STDERR_TAIL_CHARS": "how much of an agent's stderr EpisodeFinished keeps",
    "FLYWHEEL_BATCH_WAIT_S": "how long a batch of tasks waits to fill",
    "FLYWHEEL_K8S_NAMESPACE": "namespace of Kubernetes agent Jobs",
    "FLYWHEEL_K8S_JOBS_PER_MINUTE": "rate limit on Job creation",
    "FLYWHEEL_K8S_TTL_AFTER_FINISHED_S": "ttlSecondsAfterFinished of each Job",
    "FLYWHEEL_K8S_POLL_S": "how often a Job's status is polled",
    "FLYWHEEL_REWARD_GROUP": "the reward service's consumer group (and its journal's name)",
    "FLYWHEEL_SWEEP_INTERVAL_S": "how often deadlines and idle production sessions are checked",
    "FLYWHEEL_FEEDBACK_STARS_MAX": "the top of the stars scale",
    "FLYWHEEL_JUDGE_API_KEY": "bearer key of the judge's endpoint",
    "FLYWHEEL_JUDGE_MODEL": "model name the judge asks for",
    "FLYWHEEL_MAX_BATCH": "episode events handled per batch",
    "FLYWHEEL_SCORER_TIMEOUT_S": "a scorer running longer fails the score (reward None, score_error set)",
    "FLYWHEEL_TRAIN_SYSTEM_MATCH": "regex on the system prompt selecting the calls that become transitions (see FLYWHEEL_TRAIN_MODELS)",
    "FLYWHEEL_TRAINER_MODE": "async (generation overlaps training) or sync (gateways held while training)",
    "FLYWHEEL_TRAINER_OBJECTIVE": "rl, or sft on the episodes at or above the SFT threshold",
    "FLYWHEEL_TRAINER_BATCH_GROUPS": "groups per training step (B)",
    "FLYWHEEL_TRAINER_MAX_IN_FLIGHT": "groups requested ahead in async mode (sync requests exactly B)",
    "FLYWHEEL_TRAINER_BATCH_TIMEOUT_S": "train on fewer than B ready groups after this long (unset: wait)",
    "FLYWHEEL_TRAINER_GROUP_TIMEOUT_S": "a group still incomplete after this long is trained partially or dropped",
    "FLYWHEEL_TRAINER_PARTIAL_GROUPS": "what a timed-out group does: train on its rewarded members, or drop",
    "FLYWHEEL_TRAINER_MIN_PARTIAL": "rewarded members a partial group needs to train",
    "FLYWHEEL_TRAINER_SYNC_EVERY": "a weight update every N steps",
    "FLYWHEEL_TRAINER_CHECKPOINT_EVERY": "a checkpoint every N steps",
    "FLYWHEEL_TRAINER_KEEP_CHECKPOINTS": "checkpoints kept on disk",
    "FLYWHEEL_TRAINER_EXPECTED_GATEWAYS": "gateways a weight update waits for at least (besides those seen on flywheel.control)",
    "FLYWHEEL_TRAINER_DRAIN_TIMEOUT_S": "how long a weight update waits for gateways to drain",
    "FLYWHEEL_TRAINER_ENGINE_KIND": "the HTTP engine's kind: flywheel (POST /load_weights) or vllm (its dev routes)",
    "FLYWHEEL_TRAINER_SUCCESS_THRESHOLD": "reward at or above which an episode counts as a success in the step's figures",
    "FLYWHEEL_TRAINER_TRACKER": "experiment tracker: none, tensorboard or wandb",
    "FLYWHEEL_TRAINER_DEVICE": "torch device (cpu, cuda)",
    "FLYWHEEL_TRAINER_ALGO": "the algorithm's knobs, one nested object (next section)",
    "FLYWHEEL_TRAINER_ALGO__ALGORITHM": "grpo (critic-free, group-relative advantages, per-call credit) or ppo (a value head, GAE)",
    "FLYWHEEL_TRAINER_ALGO__ADVANTAGE": "the group estimator: grpo (mean/std), rloo (leave-one-out) or mean (no scaling)",
    "FLYWHEEL_TRAINER_ALGO__STALE_DECAY": "the down-weighting factor per version of lag beyond max_staleness",
    "FLYWHEEL_TRAINER_ALGO__PRODUCTION_STD_FLOOR": "the floor of the running std production advantages are divided by",
    "FLYWHEEL_TRAINER_ALGO__LEARNING_RATE": "Adam(W) learning rate",
    "FLYWHEEL_TRAINER_ALGO__WEIGHT_DECAY": "AdamW weight decay",
    "FLYWHEEL_TRAINER_ALGO__BETAS": "Adam's betas",
    "FLYWHEEL_RECORDER_HOST": "address of the recorder's admin API",
    "FLYWHEEL_RECORDER_MAX_WAIT_S": "longest a recorder batch waits to fill",
    "FLYWHEEL_ENGINE_MAX_NUM_SEQS": "the embedded engine's concurrent sequences (continuous batching)",
    "FLYWHEEL_RUN_TRAINER": "False: no trainer of its own (serve and record only)",
}


@dataclass(frozen=True, slots=True)
class Setting:
    variable: str
    type: str
    default: str
    meaning: str


@dataclass(frozen=True, slots=True)
class Section:
    title: str
    source: str  # the file that defines the model
    intro: str
    settings: tuple[Setting, ...]


def _first_sentence(text: str) -> str:
    """Up to the first full stop outside parentheses (abbreviations like "e.g." kept whole)."""
    depth = 0
    for i, ch in enumerate(text):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth = max(0, depth - 1)
        elif ch == "." and depth == 0 and (i + 1 == len(text) or text[i + 1] == " "):
            if text[max(0, i - 3) : i + 1] in ("e.g.", "i.e.") or text[max(0, i - 2) : i + 1] == "vs.":
                continue
            return text[: i + 1]
    return text


def _clean(text: str) -> str:
    """One line for a table cell: reST roles and double backticks as Markdown code, pipes escaped."""
    text = re.sub(r":[a-z]+:`([^`]+)`", r"`\1`", text).replace("``", "`")
    return " ".join(text.split()).replace("|", "\\|")


def _comments_of(cls: type[BaseModel]) -> dict[str, tuple[str, str]]:
    """Per field defined in ``cls``'s own body: (annotation as written, its comment)."""
    source = textwrap.dedent(inspect.getsource(cls))
    lines = source.splitlines()
    tree = ast.parse(source)
    body = tree.body[0]
    assert isinstance(body, ast.ClassDef)
    found: dict[str, tuple[str, str]] = {}
    for node in body.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        first, last = node.lineno - 1, (node.end_lineno or node.lineno) - 1
        trailing = ""
        tail = lines[last]
        if "#" in tail:
            code, _, comment = tail.partition("  #")
            trailing = comment.strip() if code.strip() else ""
        above: list[str] = []
        i = first - 1
        while i >= 0 and lines[i].strip().startswith("#"):
            above.insert(0, lines[i].strip().lstrip("#").strip())
            i -= 1
        after_blank = i < 0 or not lines[i].strip() or lines[i].lstrip().startswith("class ")
        heading = bool(above) and (
            (len(above) == 1 and len(above[0].split()) <= 5 and ":" not in above[0])
            or (after_blank and bool(trailing))
        )
        parts = ([] if heading else above) + ([trailing] if trailing else [])
        found[node.target.id] = (ast.unparse(node.annotation), " ".join(parts))
    return found


def _default(model: type[BaseModel], name: str) -> str:
    field = model.model_fields[name]
    if field.default_factory is not None:
        factory = field.default_factory
        if factory in (list, dict, set, tuple):
            value: object = factory()
        else:
            return f"computed (`{getattr(factory, '__qualname__', repr(factory))}`)"
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, BaseModel):
        return "see below"
    if isinstance(value, Path):
        value = str(value)
    if value is None:
        return "unset"
    if isinstance(value, tuple):
        value = list(value)
    text = json.dumps(value, default=str) if not isinstance(value, str) else json.dumps(value)
    return f"`{_clean(text)}`"


def _algo_meanings() -> dict[str, str]:
    """``name: text`` entries of ``trainer/config.py``'s docstring (``a / b: text`` names both)."""
    doc = inspect.getdoc(trainer.config) or ""
    meanings: dict[str, str] = {}
    names: list[str] = []
    text: list[str] = []

    def flush() -> None:
        sentence = _first_sentence(" ".join(text).strip())
        for n in names:
            meanings[n] = sentence

    for line in doc.splitlines():
        head = re.match(r"^    ([a-z_][a-z0-9_]*(?:(?: / |, )[a-z_][a-z0-9_]*)*): (.*)$", line)
        if head:
            flush()
            names = re.split(r" / |, ", head.group(1))
            text = [head.group(2)]
        elif line.startswith("        ") and names:
            text.append(line.strip())
        else:
            flush()
            names, text = [], []
    flush()
    return meanings


def _type(annotation: object, written: str) -> str:
    """The values a closed type admits (an enum, a ``Literal``), else the annotation as written."""
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return " | ".join(str(member.value) for member in annotation)
    if get_origin(annotation) is Literal:
        return " | ".join(str(value) for value in get_args(annotation))
    return written


def _section(
    title: str,
    model: type[BaseModel],
    intro: str,
    *,
    prefix: str = "FLYWHEEL_",
    meanings: dict[str, str] | None = None,
) -> Section:
    own = _comments_of(model)
    rows = []
    for name, (annotation, comment) in own.items():
        if name not in model.model_fields:
            continue
        field = model.model_fields[name]
        variable = f"{prefix}{name.upper()}"
        meaning = field.description or comment or MEANINGS.get(variable) or (meanings or {}).get(name, "")
        rows.append(
            Setting(
                variable=variable,
                type=_type(field.annotation, annotation),
                default=_default(model, name),
                meaning=_clean(meaning) or "—",
            )
        )
    source = Path(inspect.getfile(model)).resolve().relative_to(ROOT).as_posix()
    return Section(title, source, intro, tuple(rows))


def sections() -> list[Section]:

    return [
        _section("Shared by every service", FlywheelSettings, "The base every service's settings extend."),
        _section("Gateway", GatewaySettings, "`flywheel gateway`, and the gateway inside `flywheel up`."),
        _section("Rollout worker", WorkerSettings, "`flywheel worker`."),
        _section("Reward service", RewardSettings, "`flywheel reward`."),
        _section("Trainer", TrainerSettings, "`flywheel trainer run`."),
        _section(
            "Trainer algorithm",
            AlgorithmConfig,
            "One nested object: set a field as `FLYWHEEL_TRAINER_ALGO__<FIELD>`. Each knob's paper is cited in "
            "`trainer/config.py`.",
            prefix="FLYWHEEL_TRAINER_ALGO__",
            meanings=_algo_meanings(),
        ),
        _section(
            "Event log and recorder", EventLogSettings, "`flywheel recorder` and every event-log reader."
        ),
        _section(
            "OpenTelemetry export",
            OtelSettings,
            "The `otel-export` consumer inside `flywheel up` when `FLYWHEEL_OTLP_ENDPOINT` is set "
            "([observability.md](observability.md)).",
        ),
        _stack_section(),
    ]


def _stack_section() -> Section:
    """The stack's own knobs, and the fields whose default differs in it (``StackGatewaySettings``); its
    parts (``gateway``, ``worker``, ...) are the sections above, read from the same variables."""
    own = _section("", StackSettings, "")
    changed = _section("", StackGatewaySettings, "")
    return Section(
        "Embedded stack",
        own.source,
        "`flywheel up` and `flywheel demo` compose the sections above, one object per service (each read from "
        "the same variables: a variable sets one thing), plus these (a field listed again here has a "
        "different default in the embedded stack).",
        changed.settings
        + tuple(s for s in own.settings if s.variable.removeprefix("FLYWHEEL_").lower() not in PARTS),
    )


def _sources() -> list[Path]:
    """The packages' Python files git tracks (what a clone has), or every one when git cannot say."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--", *(f"{p}/*.py" for p in PACKAGES)],
            cwd=ROOT,
            capture_output=True,
            check=True,
            timeout=30,
        ).stdout.decode()
    except (OSError, subprocess.SubprocessError):
        return sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py"))
    return sorted(ROOT / name for name in listed.split("\0") if name)


def other_variables(known: set[str]) -> dict[str, list[str]]:
    """``FLYWHEEL_*`` names the code mentions that no settings model defines, with the files."""
    found: dict[str, set[str]] = {}
    for path in _sources():
        if path.is_file():
            for name in _VAR.findall(path.read_text(encoding="utf-8")):
                if name not in known and not name.startswith("FLYWHEEL_TRAINER_ALGO__"):
                    found.setdefault(name, set()).add(path.relative_to(ROOT).as_posix())
    return {name: sorted(files) for name, files in sorted(found.items())}


def undocumented() -> list[str]:
    """Variables whose meaning is nowhere: no description, no comment, no entry in ``MEANINGS``."""
    return [s.variable for section in sections() for s in section.settings if s.meaning == "—"]


def unused_meanings() -> list[str]:
    """Entries of ``MEANINGS`` that name no field any more."""
    known = {s.variable for section in sections() for s in section.settings}
    return sorted(set(MEANINGS) - known)


def render() -> str:
    parts = [
        "# Configuration reference",
        "",
        "For operators: every `FLYWHEEL_*` environment variable (a `.env` file in the working directory is read "
        "too), its default and its meaning. **Generated** from the pydantic settings models by "
        "`python -m flywheel.config_reference`; do not edit by hand (`tests/unit/test_docs.py` fails when this "
        "page is stale). How the services use them: [operating.md](operating.md).",
        "",
    ]
    all_sections = sections()
    known: set[str] = set()
    for section in all_sections:
        parts += [f"## {section.title}", "", f"{section.intro} Defined in `{section.source}`.", ""]
        parts += ["| variable | type | default | meaning |", "|---|---|---|---|"]
        for s in section.settings:
            known.add(s.variable)
            parts.append(f"| `{s.variable}` | `{_clean(s.type)}` | {s.default} | {s.meaning} |")
        parts.append("")
    others = other_variables(known)
    parts += [
        "## Read outside the settings models",
        "",
        "Names the code reads or sets directly: the environment a rollout worker gives its agent, helpers of the "
        "CLI and of the engine's child process.",
        "",
        "| variable | where |",
        "|---|---|",
    ]
    parts += [f"| `{name}` | {', '.join(f'`{f}`' for f in files)} |" for name, files in others.items()]
    return "\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 when the page is stale, write nothing")
    parser.add_argument("--out", type=Path, default=PAGE)
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
        if current != text:
            print(f"{args.out} is stale: run python -m flywheel.config_reference", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
