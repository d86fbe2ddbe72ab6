"""``flywheel doctor``: what is wrong with this installation, and how to fix it.

Each check returns a :class:`Check` (``ok`` / ``warn`` / ``fail``, a one-line detail, a fix). Nothing
raises: an unreachable dependency is a failed check that names it. The CLI exits 1 when any check
failed; warnings (e.g. the chdb directory held by a running ``flywheel up``) do not fail it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

import httpx
from aiokafka.admin import AIOKafkaAdminClient
from pydantic import ValidationError

from flywheel.ops.admin import AdminClient, AdminError
from infra.eventlog.lock import chdb_holder
from infra.settings import DEV_ADMIN_TOKEN, FlywheelSettings
from schemas import TOPICS

Level = Literal["ok", "warn", "fail"]

# package → (minimum version, required?). Optional ones only warn when missing.
PACKAGES: dict[str, tuple[str, bool]] = {
    "pydantic": ("2.9", True),
    "faststream": ("0.6", True),
    "aiokafka": ("0.12", True),
    "chdb": ("3.0", True),
    "clickhouse-connect": ("0.8", True),
    "pyarrow": ("17", True),
    "fastapi": ("0.115", True),
    "httpx": ("0.27", True),
    "typer": ("0.12", True),
    "torch": ("2.4", False),
    "transformers": ("4.46", False),
    "vllm": ("0.10.2", False),
}


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    level: Level
    detail: str
    fix: str = ""

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def _version_tuple(text: str) -> tuple[int, ...]:
    parts: list[int] = []
    for piece in text.split("."):
        digits = "".join(c for c in piece if c.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def check_settings() -> tuple[Check, FlywheelSettings | None]:
    try:
        settings = FlywheelSettings()
    except ValidationError as exc:
        first = exc.errors()[0]
        message = str(first.get("msg", exc)).removeprefix("Value error, ")
        fix = (
            "export FLYWHEEL_ADMIN_TOKEN=$(openssl rand -hex 32)"
            if "ADMIN_TOKEN" in message
            else "fix FLYWHEEL_*"
        )
        return Check("settings", "fail", message, fix), None
    token = settings.admin_token.get_secret_value()
    if settings.env == "development" and token == DEV_ADMIN_TOKEN:
        return (
            Check(
                "admin token",
                "warn",
                "development mode with the placeholder admin token (refused when FLYWHEEL_ENV=production)",
                "export FLYWHEEL_ADMIN_TOKEN=$(openssl rand -hex 32) before exposing any port",
            ),
            settings,
        )
    if len(token) < 16:
        return Check(
            "admin token", "warn", "the admin token is shorter than 16 characters", "use openssl rand -hex 32"
        ), settings
    return Check("admin token", "ok", f"set ({settings.env} mode)"), settings


def check_packages() -> list[Check]:
    checks = [
        Check(
            "python",
            "ok" if sys.version_info >= (3, 11) else "fail",
            platform.python_version(),
            "use Python ≥ 3.11",
        )
    ]
    for name, (minimum, required) in PACKAGES.items():
        try:
            found = version(name)
        except PackageNotFoundError:
            level: Level = "fail" if required else "ok"
            detail = "missing" if required else "not installed (optional)"
            checks.append(
                Check(name, level, detail, f"uv sync --all-extras  (or pip install '{name}>={minimum}')")
            )
            continue
        if _version_tuple(found) < _version_tuple(minimum):
            checks.append(
                Check(name, "fail", f"{found} is older than {minimum}", f"pip install -U '{name}>={minimum}'")
            )
        else:
            checks.append(Check(name, "ok", found))
    return checks


def check_data_dir(settings: FlywheelSettings) -> Check:
    path = settings.data_dir.resolve()
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".doctor-"):
            pass
    except OSError as exc:
        return Check(
            "data dir",
            "fail",
            f"{path} is not writable: {exc.strerror}",
            "set FLYWHEEL_DATA_DIR to a writable directory",
        )
    return Check("data dir", "ok", str(path))


async def check_kafka(settings: FlywheelSettings, timeout_s: float = 5.0) -> Check:
    if settings.bus != "kafka":
        return Check("kafka", "ok", "in-process bus (FLYWHEEL_BUS=memory): no broker needed")
    admin = AIOKafkaAdminClient(
        bootstrap_servers=settings.kafka_bootstrap, request_timeout_ms=int(timeout_s * 1000)
    )
    try:
        async with asyncio.timeout(timeout_s):
            await admin.start()
            existing = set(await admin.list_topics())
    except Exception as exc:  # aiokafka raises KafkaError subclasses, OSError, TimeoutError
        return Check(
            "kafka",
            "fail",
            f"broker at {settings.kafka_bootstrap} unreachable ({type(exc).__name__})",
            "start it (`flywheel kafka start`, or docker compose up kafka) or fix FLYWHEEL_KAFKA_BOOTSTRAP",
        )
    finally:
        with contextlib.suppress(Exception):
            await admin.close()
    missing = [t for t in TOPICS if settings.topic_prefix + t not in existing]
    if missing:
        return Check(
            "kafka", "fail", f"reachable, topics missing: {', '.join(missing)}", "flywheel topics create"
        )
    return Check("kafka", "ok", f"{settings.kafka_bootstrap}: {len(TOPICS)} topics present")


def _strip_credentials(url: str) -> tuple[str, httpx.BasicAuth | None]:
    parts = urlsplit(url)
    auth = httpx.BasicAuth(parts.username or "default", parts.password or "") if parts.username else None
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, "", "", "")), auth


async def check_clickhouse(settings: FlywheelSettings, timeout_s: float = 5.0) -> Check:
    if settings.clickhouse_url:
        base, auth = _strip_credentials(settings.clickhouse_url)
        try:
            async with httpx.AsyncClient(timeout=timeout_s, auth=auth) as client:
                ping = await client.get(f"{base}/ping")
                answer = await client.get(base + "/", params={"query": "SELECT version()"})
        except httpx.HTTPError as exc:
            return Check(
                "clickhouse",
                "fail",
                f"server at {base} unreachable ({type(exc).__name__})",
                "start ClickHouse or fix FLYWHEEL_CLICKHOUSE_URL",
            )
        if ping.status_code != 200 or answer.status_code != 200:
            return Check(
                "clickhouse",
                "fail",
                f"{base} answered {answer.status_code}: {answer.text[:120].strip()}",
                "check the user and password in FLYWHEEL_CLICKHOUSE_URL",
            )
        server = answer.text.strip()
        if _version_tuple(server) < (24, 8):
            return Check("clickhouse", "fail", f"server {server} is older than 24.8", "upgrade ClickHouse")
        return Check("clickhouse", "ok", f"server {server} at {base}")
    return await asyncio.to_thread(_check_chdb, settings.chdb_path)


def _check_chdb(path: Path) -> Check:
    holder = chdb_holder(path.resolve())
    if holder is not None:
        return Check(
            "clickhouse",
            "warn",
            f"embedded chdb: {holder}",
            "normal while `flywheel up` runs; reads go through its admin API (--url); otherwise stop that process",
        )
    if not path.exists():
        return Check("clickhouse", "ok", f"embedded chdb at {path} (created on first use)")
    return Check("clickhouse", "ok", f"embedded chdb at {path}, not in use")


async def check_upstreams(urls: Sequence[str], timeout_s: float = 5.0) -> list[Check]:
    checks = []
    for url in urls:
        models_url = url.rstrip("/") + "/models"
        try:
            async with httpx.AsyncClient(timeout=timeout_s) as client:
                response = await client.get(models_url)
        except httpx.HTTPError as exc:
            checks.append(
                Check(
                    f"upstream {url}",
                    "fail",
                    f"unreachable ({type(exc).__name__})",
                    "start the model server (vLLM, or `flywheel engine`) or fix FLYWHEEL_UPSTREAM_URLS",
                )
            )
            continue
        if response.status_code != 200:
            checks.append(
                Check(
                    f"upstream {url}",
                    "fail",
                    f"GET /models answered {response.status_code}",
                    "check the server and its API key",
                )
            )
            continue
        try:
            models = [m.get("id") for m in response.json().get("data", [])]
        except (ValueError, AttributeError):
            models = []
        checks.append(
            Check(f"upstream {url}", "ok", f"models: {', '.join(map(str, models)) or '(none listed)'}")
        )
    return checks


async def check_admin(url: str, token: str, timeout_s: float = 5.0) -> Check:
    try:
        state = await AdminClient(url, token, timeout_s=timeout_s).get("/admin/state")
    except AdminError as exc:
        return Check(
            "admin api", "fail", str(exc), "check --url / FLYWHEEL_ADMIN_URL and FLYWHEEL_ADMIN_TOKEN"
        )
    paused = state.get("paused") if isinstance(state, dict) else None
    return Check("admin api", "ok", f"{url} answers (paused={paused})")


def upstreams_from_env() -> list[str]:
    raw = os.environ.get("FLYWHEEL_UPSTREAM_URLS", "")
    return [u.strip() for u in raw.split(",") if u.strip()]


async def run_doctor(
    *, upstreams: Sequence[str] = (), admin_url: str | None = None, timeout_s: float = 5.0
) -> list[Check]:
    settings_check, settings = check_settings()
    checks = [settings_check, *check_packages()]
    if settings is None:
        return checks
    checks.append(check_data_dir(settings))
    kafka, clickhouse, upstream_checks = await asyncio.gather(
        check_kafka(settings, timeout_s),
        check_clickhouse(settings, timeout_s),
        check_upstreams(upstreams, timeout_s),
    )
    checks += [kafka, clickhouse, *upstream_checks]
    if admin_url:
        checks.append(await check_admin(admin_url, settings.admin_token.get_secret_value(), timeout_s))
    return checks
