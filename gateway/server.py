"""The gateway's HTTP server: :class:`infra.service.HttpServer` with the gateway's own protocol.

server = GatewayServer(app, host="127.0.0.1", port=0)   # port 0: pick a free port
url = await server.start()                              # "http://127.0.0.1:PORT"
...
await server.stop()

``GatewayHttpProtocol`` (``gateway.limits``) bounds header size and count and answers protocol errors
in OpenAI's format. A process that hosts a gateway runs on uvloop where it is installed
(``infra.service.run``): a gateway call is mostly loop and socket work (two HTTP hops), which uvloop
does in C (lower latency and CPU a call: docs/results/tuning.md). uvicorn picks httptools over h11 by
itself when it is installed.
"""

from __future__ import annotations

from starlette.types import ASGIApp

from gateway.limits import GatewayHttpProtocol
from infra.service import HttpServer, run

__all__ = ["GatewayServer", "run"]


class GatewayServer(HttpServer):
    def __init__(
        self, app: ASGIApp, *, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"
    ) -> None:
        super().__init__(app, host=host, port=port, log_level=log_level, http=GatewayHttpProtocol)
