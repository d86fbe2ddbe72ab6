"""Tenant API keys, stored hashed (HMAC-SHA256 with a per-install salt) in one JSON file.

A key looks like ``fw_<key_id>_<secret>``; only its HMAC is stored. The file is rewritten atomically
(temp file + ``os.replace``) and re-read when it changes, so ``flywheel keys create`` takes effect in a
running gateway without a restart.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import time
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(slots=True)
class KeyRecord:
    key_id: str
    tenant: str
    digest: str
    created_at: float
    revoked: bool = False


class KeyStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._salt = b""
        self._keys: dict[str, KeyRecord] = {}
        self._by_digest: dict[str, KeyRecord] = {}
        self._mtime: float | None = None
        self._checked = 0.0
        self._load()

    # --------------------------------------------------------------------------------- storage
    def _load(self) -> None:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            self._salt, self._keys, self._by_digest, self._mtime = b"", {}, {}, None
            return
        data = json.loads(self.path.read_text())
        self._salt = bytes.fromhex(data["salt"])
        self._keys = {k["key_id"]: KeyRecord(**k) for k in data.get("keys", [])}
        self._by_digest = {r.digest: r for r in self._keys.values()}
        self._mtime = stat.st_mtime_ns

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        payload = {"salt": self._salt.hex(), "keys": [asdict(r) for r in self._keys.values()]}
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(payload, fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
        self._load()

    def _refresh(self) -> None:
        now = time.monotonic()
        if now - self._checked < 1.0:
            return
        self._checked = now
        try:
            mtime: float | None = self.path.stat().st_mtime_ns
        except FileNotFoundError:
            mtime = None
        if mtime != self._mtime:
            self._load()

    def _digest(self, key: str) -> str:
        return hmac.new(self._salt, key.encode(), hashlib.sha256).hexdigest()

    # ------------------------------------------------------------------------------------- API
    def create(self, tenant: str) -> tuple[str, str]:
        """A new key for ``tenant``: returns ``(key_id, key)``; the key is not retrievable later."""
        if not tenant or len(tenant) > 128 or not tenant.replace("-", "").replace("_", "").isalnum():
            raise ValueError("tenant must be 1–128 letters, digits, '-' or '_'")
        self._load()
        if not self._salt:
            self._salt = secrets.token_bytes(32)
        key_id = secrets.token_hex(6)
        key = f"fw_{key_id}_{secrets.token_urlsafe(32)}"
        self._keys[key_id] = KeyRecord(key_id, tenant, self._digest(key), time.time())
        self._save()
        return key_id, key

    def list(self, tenant: str | None = None) -> list[KeyRecord]:
        self._load()
        return [r for r in self._keys.values() if tenant is None or r.tenant == tenant]

    def revoke(self, key_id: str | None = None, *, tenant: str | None = None) -> int:
        """Revoke one key, or all keys of ``tenant``; returns how many were revoked."""
        self._load()
        n = 0
        for r in self._keys.values():
            if not r.revoked and (r.key_id == key_id or (key_id is None and tenant and r.tenant == tenant)):
                r.revoked = True
                n += 1
        if n:
            self._save()
        return n

    def tenant_for(self, key: str) -> str | None:
        """The tenant a presented key belongs to, or None (unknown or revoked)."""
        self._refresh()
        if not self._salt:
            return None
        rec = self._by_digest.get(self._digest(key))
        if rec is None or rec.revoked:
            return None
        return rec.tenant
