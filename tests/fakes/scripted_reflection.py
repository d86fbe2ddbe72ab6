"""``ScriptedReflectionLM``: a deterministic stand-in for GEPA's reflection model, over real HTTP.

It is *not* a model. It serves an OpenAI-compatible ``POST /v1/chat/completions`` that answers the
n-th request with the n-th text of a fixed list (wrapped in ``` fences, as GEPA's instruction proposal
expects; after the last, the list starts again) and says so: its model id is ``scripted-reflection``
and every answer's ``system_fingerprint`` is ``scripted``. It keeps every prompt it received, so a test
can check that GEPA showed it the rollouts' feedback. Everything else in ``flywheel optimize`` — the
rollouts, the gateway's substitution, the scoring, GEPA's selection — is real.

    with ScriptedReflectionLM(["Use CALC: <expr> then ANSWER: <n>."]) as lm:
        lm.url   # http://127.0.0.1:<port>/v1

As a process (for running ``flywheel optimize`` by hand):
``python -m tests.fakes.scripted_reflection --port 8399 candidates.json`` (a JSON list of strings).
"""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

MODEL = "scripted-reflection"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class ScriptedReflectionLM:
    def __init__(self, candidates: list[str], *, port: int = 0) -> None:
        if not candidates:
            raise ValueError("ScriptedReflectionLM needs at least one candidate text")
        self.candidates = list(candidates)
        self.prompts: list[str] = []
        self.port = port or _free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.app = self._build()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    def _build(self) -> FastAPI:
        app = FastAPI(title="ScriptedReflectionLM (returns fixed candidates; not a model)")

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> JSONResponse:
            body: Any = await request.json()
            messages = body.get("messages") if isinstance(body, dict) else None
            if not isinstance(messages, list) or not messages:
                err = {"message": "messages must be a non-empty list", "type": "invalid_request_error"}
                return JSONResponse({"error": err}, status_code=400)
            self.prompts.append("\n".join(str(m.get("content", "")) for m in messages if isinstance(m, dict)))
            text = self.candidates[(len(self.prompts) - 1) % len(self.candidates)]
            return JSONResponse(
                {
                    "id": f"scripted-{len(self.prompts)}",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": MODEL,
                    "system_fingerprint": "scripted",
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": f"```\n{text}\n```"},
                            "finish_reason": "stop",
                        }
                    ],
                }
            )

        @app.get("/v1/models")
        async def models() -> JSONResponse:
            return JSONResponse(
                {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "test"}]}
            )

        return app

    def start(self) -> ScriptedReflectionLM:
        config = uvicorn.Config(
            self.app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="scripted-reflection", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("ScriptedReflectionLM did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> ScriptedReflectionLM:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("candidates", type=Path, help="a JSON list of candidate texts")
    parser.add_argument("--port", type=int, default=8399)
    args = parser.parse_args()
    texts = json.loads(args.candidates.read_text())
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        parser.error("the candidates file must hold a JSON list of strings")
    lm = ScriptedReflectionLM(texts, port=args.port)
    print(f"ScriptedReflectionLM (fixed candidates, not a model) at {lm.url}", flush=True)
    uvicorn.run(lm.app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
