"""Checkpoints: weights (safetensors) + optimiser state + ``meta.json`` beside them, and the inbox.

Layout under the trainer's directory (``<data_dir>/trainer`` by default)::

    checkpoints/v000012/model.safetensors   weights (what ``load_weights(path, version)`` reads)
    checkpoints/v000012/optimizer.pt        Adam state, so a resumed run continues the same optimiser
    checkpoints/v000012/meta.json           version, step, config, consumed group ids, bus offsets,
                                            production baselines, samples trained per source
    checkpoints/LATEST                      name of the newest complete checkpoint
    inbox.jsonl                             episodes received but not yet trained

A checkpoint directory is written under a temporary name and renamed into place, and ``LATEST`` is
replaced atomically, so a crash mid-save leaves the previous checkpoint in charge.

Why an inbox: the bus commits an offset when the handler returns, and the handler returns as soon as
the episode is buffered — long before its group is trained. So the handler appends the episode to
``inbox.jsonl`` first (durable work, then commit, as the reliability rules of docs/architecture.md ask), each checkpoint
rewrites the inbox down to what is still pending, and a restarted trainer reloads it. Together with the
consumed group ids in ``meta.json`` this means: nothing received is lost, and nothing is trained twice.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from schemas import EpisodeScored

LATEST = "LATEST"
META = "meta.json"


@dataclass
class CheckpointMeta:
    version: int
    step: int
    created_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat())
    model: str = "policy"
    base_model: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    consumed_groups: list[str] = field(default_factory=list)
    offsets: dict[str, int] = field(default_factory=dict)  # "topic/partition" -> next offset seen
    metrics: dict[str, float] = field(default_factory=dict)
    # running production baselines (trainer.baselines) and samples trained per source, so far
    baselines: dict[str, dict[str, float]] = field(default_factory=dict)
    samples: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class CheckpointInfo:
    path: Path
    meta: CheckpointMeta


class CheckpointStore:
    def __init__(self, root: Path, keep: int = 3) -> None:
        self.root = root
        self.dir = root / "checkpoints"
        self.keep = keep

    @property
    def inbox_path(self) -> Path:
        return self.root / "inbox.jsonl"

    def path_for(self, version: int) -> Path:
        return self.dir / f"v{version:06d}"

    def save(self, meta: CheckpointMeta, write_weights: Any) -> Path:
        """``write_weights(tmp_dir)`` writes the weights; then meta.json, rename, LATEST, prune."""
        self.dir.mkdir(parents=True, exist_ok=True)
        final = self.path_for(meta.version)
        tmp = self.dir / f".tmp-{final.name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        write_weights(tmp)
        # one line, from the fields as they are: the consumed ids run to 200,000, this runs on the event
        # loop every ``checkpoint_every`` steps, and both asdict's deep copy and json's indenting encoder
        # (pure Python) cost ten times what the C encoder does
        (tmp / META).write_text(json.dumps({f.name: getattr(meta, f.name) for f in fields(meta)}))
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        _atomic_write(self.dir / LATEST, final.name)
        self._prune(keep_name=final.name)
        return final

    def _prune(self, keep_name: str) -> None:
        done = sorted(p for p in self.dir.iterdir() if p.is_dir() and (p / META).exists())
        for old in done[: max(0, len(done) - self.keep)]:
            if old.name != keep_name:
                shutil.rmtree(old, ignore_errors=True)

    def latest(self) -> CheckpointInfo | None:
        marker = self.dir / LATEST
        if not marker.exists():
            return None
        path = self.dir / marker.read_text().strip()
        try:
            return CheckpointInfo(path, read_meta(path))
        except (OSError, ValueError, TypeError):
            return None

    def all(self) -> list[CheckpointInfo]:
        if not self.dir.exists():
            return []
        out = []
        for p in sorted(self.dir.iterdir()):
            if p.is_dir() and (p / META).exists():
                try:
                    out.append(CheckpointInfo(p, read_meta(p)))
                except (OSError, ValueError, TypeError):
                    continue
        return out

    # ------------------------------------------------------------------ inbox
    def append_inbox(self, events: Sequence[EpisodeScored], fsync: bool = True) -> None:
        """Append ``events`` (one JSON line each) with one write and, if ``fsync``, one fsync."""
        self.root.mkdir(parents=True, exist_ok=True)
        with self.inbox_path.open("a", encoding="utf-8") as f:
            f.write("".join(e.model_dump_json() + "\n" for e in events))
            f.flush()
            if fsync:
                os.fsync(f.fileno())

    def rewrite_inbox(self, events: Iterable[EpisodeScored]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        _atomic_write(self.inbox_path, "".join(e.model_dump_json() + "\n" for e in events))

    def read_inbox(self) -> list[EpisodeScored]:
        if not self.inbox_path.exists():
            return []
        out = []
        for line in self.inbox_path.read_text(encoding="utf-8").splitlines():
            try:
                out.append(EpisodeScored.model_validate_json(line))
            except ValidationError:
                continue  # a torn last line after a crash
        return out


def read_meta(path: Path) -> CheckpointMeta:
    return CheckpointMeta(**json.loads((path / META).read_text()))


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
