"""Agent Lightning agent classes, run as AGL 1.0's local controller runs them, by Flywheel's worker.

    flywheel worker …  with the task's agent = command
        flywheel agl-agent --env-map QUESTION=input.question --env-map ANSWER=input.answer gsm8k_agent:ChatAgent

The worker runs this as a command agent: its own process group, the deadline kills the group, the
exit code decides ok/error. Here, as AGL's controller does: ``AGL_OPENAI_BASE_URL`` (the episode's
gateway URL: every call recorded token-faithfully), ``AGL_KEY`` and ``AGL_EVENT_URL`` are set, the
``env_map`` entries are resolved against the task's ``input`` (AGL's rules: ``input`` is all of it,
``input.a.0.b`` walks dicts and lists, anything else is a literal; non-strings become JSON), then
``Class().run()`` is called and awaited when it returns an awaitable. An exception exits 1 with the
traceback on stderr. The events the agent posts to ``AGL_EVENT_URL`` are taken by a loopback sink in
this process; the last ``reward`` event's ``data.value`` is the episode's reported reward (the final
stdout line, the worker's command-agent protocol), so the reward service scores the episode from the
agent's own reward event.

``env_map`` comes from ``--env-map`` and from the task's ``metadata["agl_env_map"]`` (a JSON object,
as AGL keeps it in ``config.local.env_map``); the task's wins.

With ``--python PY`` the class runs in a child ``PY -c …`` (the agent's own environment, e.g. a 3.12
venv with AutoGen; its ``bin`` first on ``PATH``, the ``--path`` dirs as its ``PYTHONPATH``), as AGL's
controller runs it in a child of its own interpreter; the child shares the worker's process group.
"""

from __future__ import annotations

import asyncio
import hmac
import importlib
import inspect
import json
import os
import subprocess
import sys
import threading
import traceback
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class AgentClassError(Exception):
    """The agent class spec cannot be loaded (bad spec, missing module, not a class)."""


def resolve(task_input: Any, path: str) -> Any:
    """AGL's ``env_map`` path rule against a task's input."""
    if path == "input":
        return task_input
    if not path.startswith("input."):
        return path
    value = task_input
    for part in path.split(".")[1:]:
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            raise ValueError(f"env_map path not found in the task input: {path}")
    return value


def env_from_map(task_input: Any, env_map: Mapping[str, str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for name, path in env_map.items():
        value = resolve(task_input, path)
        env[name] = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return env


def load_class(spec: str) -> type:
    module_name, sep, name = spec.partition(":")
    if not sep:
        module_name, _, name = spec.rpartition(".")
    if not module_name or not name:
        raise AgentClassError(f"agent class must be 'package.module:Class', got {spec!r}")
    try:
        loaded = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise AgentClassError(f"cannot load {spec!r}: {type(exc).__name__}: {exc}") from exc
    if not isinstance(loaded, type):
        raise AgentClassError(f"{spec} is not a class")
    return loaded


class EventSink:
    """A loopback ``POST …/events`` endpoint in AGL's shape (``{event_type, data}``, Bearer key)."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.events: list[dict[str, Any]] = []
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                auth = self.headers.get("authorization", "")
                given = auth[7:] if auth.startswith("Bearer ") else self.headers.get("x-api-key", "")
                if not hmac.compare_digest(given.encode(), sink.key.encode()):
                    return self._answer(401, {"detail": "Invalid or missing API key"})
                try:
                    body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
                except ValueError:
                    return self._answer(422, {"detail": "body is not JSON"})
                if not isinstance(body, dict) or not isinstance(body.get("event_type"), str):
                    return self._answer(422, {"detail": "event_type (a string) is required"})
                data = body.get("data", {})
                if not isinstance(data, dict):
                    return self._answer(422, {"detail": "data must be an object"})
                event = {"event_type": body["event_type"], "data": data}
                sink.events.append(event)
                self._answer(200, event)

            def _answer(self, status: int, body: Any) -> None:
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="agl-events", daemon=True)

    def __enter__(self) -> EventSink:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def last_reward(self) -> float | None:
        for event in reversed(self.events):
            value = event["data"].get("value")
            if event["event_type"] == "reward":
                is_number = isinstance(value, int | float) and not isinstance(value, bool)
                return float(value) if is_number else None
        return None


# What the child interpreter runs (``--python``): load the class, run it, exit 0, or 1 with the traceback.
CHILD = """
import asyncio, importlib, inspect, sys, traceback
spec = sys.argv[1]
module, sep, name = spec.partition(":")
if not sep:
    module, _, name = spec.rpartition(".")
try:
    result = getattr(importlib.import_module(module), name)().run()
    if inspect.isawaitable(result):
        async def _wait():
            return await result
        asyncio.run(_wait())
except Exception:
    traceback.print_exc()
    sys.exit(1)
"""


def _run_in_child(python: str, spec: str, environ: dict[str, str], paths: list[str]) -> int:
    env = dict(environ)
    env["PATH"] = str(os.path.dirname(python)) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.pop("VIRTUAL_ENV", None)
    return subprocess.run([python, "-c", CHILD, spec], env=env, check=False).returncode


def run_agent(
    spec: str,
    env_map: Mapping[str, str],
    task: Mapping[str, Any],
    environ: dict[str, str],
    *,
    python: str | None = None,
    paths: list[str] | None = None,
) -> int:
    """Run ``spec``'s ``Class().run()`` for ``task``; prints the result line; returns the exit code."""
    base_url = environ.get("OPENAI_BASE_URL", "")
    key = environ.get("OPENAI_API_KEY", "")
    episode = environ.get("FLYWHEEL_EPISODE_ID", "local")
    metadata = task.get("metadata") or {}
    merged = dict(env_map)
    if isinstance(metadata, dict) and isinstance(metadata.get("agl_env_map"), str):
        merged.update(json.loads(metadata["agl_env_map"]))
    code = 0
    with EventSink(key) as sink:
        try:
            environ.update(env_from_map(task.get("input"), merged))
            environ.update(
                AGL_OPENAI_BASE_URL=base_url,
                AGL_KEY=key,
                AGL_EVENT_URL=f"{sink.url}/api/rollouts/{episode}/attempt/0/events",
            )
            if python is not None:
                code = _run_in_child(python, spec, environ, paths or [])
            else:
                result = load_class(spec)().run()
                if inspect.isawaitable(result):
                    asyncio.run(_awaited(result))
        except Exception:
            traceback.print_exc()
            code = 1
        reward = sink.last_reward()
        types = [e["event_type"] for e in sink.events]
    print(json.dumps({"reward": reward, "output": {"exit_code": code, "events": types}}), flush=True)
    return code


async def _awaited(result: Any) -> Any:
    return await result


def main(
    spec: str, env_map: Mapping[str, str], *, python: str | None = None, paths: list[str] | None = None
) -> int:
    raw = os.environ.get("FLYWHEEL_TASK")
    if raw is None:
        raw = sys.stdin.read()
    task = json.loads(raw or "{}")
    if not isinstance(task, dict):
        print("the task (FLYWHEEL_TASK or stdin) is not a JSON object", file=sys.stderr)
        return 2
    return run_agent(spec, env_map, task, os.environ, python=python, paths=paths)  # type: ignore[arg-type]
