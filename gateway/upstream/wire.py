"""A lean HTTP/1.1 keep-alive client for the gateway's one hot request: POST JSON to a model server.

    wire = WirePool("http://127.0.0.1:8000/v1/", headers={"Authorization": "Bearer ..."})
    response = await wire.post("chat/completions", body, stream=False)   # status, headers, content
    response = await wire.post("chat/completions", body, stream=True)    # then aiter_lines(), aclose()

Why not httpx here: one call through ``httpx.AsyncClient.send`` cost ~1.3 ms of CPU on this machine
(request/URL/cookie objects, the connection pool's bookkeeping, h11's pure-Python parser), the largest
share of the gateway's own time per call. This client writes the request in one buffer and parses the
response head with ``bytes`` operations: ~0.1 ms. It speaks exactly what vLLM-like servers answer
(``Content-Length``, ``chunked`` or read-to-close bodies; no compression is asked for) and is used only
for plain ``http://`` upstreams without an injected transport; everything else goes through httpx.

Errors are httpx's own exception types (``ConnectError``, ``RemoteProtocolError``, ``ReadTimeout``,
``ReadError``), so the caller has one vocabulary for both clients. A request on a reused keep-alive
connection that the server had already closed (no byte of a response came back) is sent once more on a
new connection, as browsers do; any other failure is the caller's to retry.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httpx

_Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]
_HEAD_LIMIT = 64 * 1024
_DRAIN_S = 0.05  # how long aclose() waits for the rest of an abandoned chunked body


class WireResponse:
    """The parts of ``httpx.Response`` the gateway uses (status, headers, content, lines, aclose)."""

    def __init__(
        self, pool: WirePool, conn: _Conn, status_code: int, headers: dict[str, str], reusable: bool
    ) -> None:
        self.status_code = status_code
        self.headers = headers  # names lower-cased
        self._pool = pool
        self._conn: _Conn | None = conn
        self._reusable = reusable
        self._content: bytes | None = None
        self._chunked = headers.get("transfer-encoding", "").lower() == "chunked"
        length = headers.get("content-length")
        self._remaining = int(length) if length is not None and not self._chunked else -1
        if status_code in (204, 304) or status_code < 200:
            self._chunked, self._remaining = False, 0  # no body by definition

    @property
    def content(self) -> bytes:
        if self._content is None:
            raise httpx.ResponseNotRead()
        return self._content

    async def aread(self) -> bytes:
        return await self._read_all(timed=True)

    async def _read_all(self, *, timed: bool) -> bytes:
        if self._content is None:
            if not timed and self._remaining >= 0 and self._conn is not None:
                self._content = await self._read_exactly()
            else:
                self._content = b"".join([piece async for piece in self._pieces(timed)])
        return self._content

    async def _read_exactly(self) -> bytes:
        """A ``Content-Length`` body in one read (the common non-streamed answer), under the caller's
        deadline: no per-piece timer, no async generator."""
        assert self._conn is not None
        try:
            data = await self._conn[0].readexactly(self._remaining)
        except asyncio.IncompleteReadError as exc:
            self._discard()
            raise httpx.RemoteProtocolError("upstream closed the connection mid-body") from exc
        except OSError as exc:
            self._discard()
            raise httpx.ReadError(f"upstream read failed: {exc!r}") from exc
        self._remaining = 0
        conn, self._conn = self._conn, None
        self._pool.release(conn, self._reusable)
        return data

    async def aiter_lines(self) -> AsyncIterator[str]:
        pending = b""
        async for piece in self._pieces():
            pending += piece
            *lines, pending = pending.split(b"\n")
            for line in lines:
                yield line.removesuffix(b"\r").decode("utf-8", "replace")
        if pending:
            yield pending.removesuffix(b"\r").decode("utf-8", "replace")

    async def _pieces(self, timed: bool = True) -> AsyncIterator[bytes]:
        """The body as it arrives; the connection goes back to the pool once it was read to its end.

        ``timed``: each read waits at most ``read_timeout_s`` (off where the caller bounds the whole read).
        """
        if self._conn is None:
            return
        reader = self._conn[0]
        timeout = self._pool.read_timeout_s if timed else None
        try:
            if self._chunked:
                while True:
                    async with asyncio.timeout(timeout):
                        size_line = await reader.readuntil(b"\r\n")
                        size = int(size_line.split(b";", 1)[0], 16)
                        if size == 0:
                            while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers
                                pass
                            break
                        data = await reader.readexactly(size + 2)
                    yield data[:-2]
            elif self._remaining >= 0:
                while self._remaining > 0:
                    async with asyncio.timeout(timeout):
                        data = await reader.read(min(self._remaining, 256 * 1024))
                    if not data:
                        raise httpx.RemoteProtocolError("upstream closed the connection mid-body")
                    self._remaining -= len(data)
                    yield data
            else:  # no framing: the body ends when the server closes the connection
                self._reusable = False
                while True:
                    async with asyncio.timeout(timeout):
                        data = await reader.read(256 * 1024)
                    if not data:
                        break
                    yield data
        except TimeoutError as exc:
            self._discard()
            raise httpx.ReadTimeout("upstream read timed out") from exc
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            self._discard()
            raise httpx.RemoteProtocolError(f"malformed upstream body: {type(exc).__name__}") from exc
        except OSError as exc:
            self._discard()
            raise httpx.ReadError(f"upstream read failed: {exc!r}") from exc
        conn, self._conn = self._conn, None
        if conn is not None:
            self._pool.release(conn, self._reusable)

    def _discard(self) -> None:
        """Close the connection (a body not read to its end leaves it unusable)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            self._pool.release(conn, False)

    async def aclose(self) -> None:
        """Give the connection back if the body was read to its end, else close it.

        A stream left right after its last event (SSE ``[DONE]``) still has the chunked terminator on
        the wire: it is read if it is there within ``_DRAIN_S``, so streamed calls keep their
        connection instead of paying a new one (a connect on the next call's critical path).
        """
        try:
            if self._conn is not None and self._chunked and self._reusable:
                with contextlib.suppress(httpx.HTTPError, TimeoutError):
                    async with asyncio.timeout(_DRAIN_S):
                        async for _ in self._pieces(timed=False):
                            pass
        finally:
            # also when the drain is cancelled: an agent that hangs up mid-stream cancels the gateway's
            # handler, and under anyio every await in its cleanup is cancelled again; without this the
            # connection stayed open, out of the pool, until garbage collection found it (measured
            # against a live vLLM: "unclosed <StreamWriter ...>" with the stream's last 5 bytes unread)
            self._discard()


class WirePool:
    """Keep-alive connections to one ``http://host:port/base/`` (idle ones reused last-in first-out)."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: dict[str, str] | None = None,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 120.0,
        max_idle: int = 256,
        max_connections: int = 1024,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"WirePool speaks plain http:// only, not {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.base_path = parts.path.rstrip("/") + "/"
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.max_idle = max_idle
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._head_tail = (
            f"Host: {parts.netloc}\r\nContent-Type: application/json\r\nAccept: */*\r\n{extra}"
        ).encode("latin-1")
        self._idle: list[_Conn] = []
        self._slots = asyncio.Semaphore(max_connections)  # requests in flight; more wait for a slot
        self._closed = False

    async def _connect(self) -> _Conn:
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                return await asyncio.open_connection(self.host, self.port, limit=_HEAD_LIMIT)
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(f"connecting to {self.host}:{self.port} timed out") from exc
        except OSError as exc:
            raise httpx.ConnectError(f"cannot connect to {self.host}:{self.port}: {exc!r}") from exc

    def release(self, conn: _Conn, reusable: bool) -> None:
        """A request is done with ``conn``: pool it (read to its end, server keeps it open) or close it."""
        if reusable and not self._closed and len(self._idle) < self.max_idle and not conn[0].at_eof():
            self._idle.append(conn)
        else:
            conn[1].close()
        self._slots.release()

    async def post(self, path: str, body: bytes, *, stream: bool) -> WireResponse:
        """POST ``body`` (JSON) to ``base + path``; the whole body is read unless ``stream``.

        Bounded by the caller (``asyncio.timeout``): connect, head and, unless ``stream``, the body.
        """
        if self._closed:
            raise httpx.ConnectError("the upstream client is closed")
        request = b"".join(
            (
                b"POST ",
                (self.base_path + path).encode("latin-1"),
                b" HTTP/1.1\r\n",
                self._head_tail,
                b"Content-Length: %d\r\n\r\n" % len(body),
                body,
            )
        )
        await self._slots.acquire()  # given back by release(), when the response is done with it
        try:
            while True:
                reused = bool(self._idle)
                conn = self._idle.pop() if reused else await self._connect()
                if reused and conn[0].at_eof():  # closed by the server while idle (keep-alive timeout)
                    conn[1].close()
                    continue
                try:
                    response = await self._exchange(conn, request)
                    break
                except _StaleConnectionError:
                    conn[1].close()
                    if reused:
                        continue  # the server had closed this idle connection: a fresh one, once per idle
                    raise httpx.RemoteProtocolError(
                        "upstream closed the connection without a response"
                    ) from None
                except BaseException:
                    conn[1].close()
                    raise
        except BaseException:
            self._slots.release()
            raise
        if not stream:
            try:
                await response._read_all(timed=False)  # the caller's deadline covers it
            except BaseException:  # a timeout cancels us mid-body: never pool that connection
                response._discard()
                raise
        return response

    async def _exchange(self, conn: _Conn, request: bytes) -> WireResponse:
        reader, writer = conn
        try:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            if not exc.partial:
                raise _StaleConnectionError from exc
            raise httpx.RemoteProtocolError("upstream closed the connection mid-head") from exc
        except ConnectionError as exc:
            raise _StaleConnectionError from exc
        except asyncio.LimitOverrunError as exc:
            raise httpx.RemoteProtocolError("upstream response head too large") from exc
        except OSError as exc:
            raise httpx.ReadError(f"upstream read failed: {exc!r}") from exc
        lines = head[:-4].decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        try:
            status = int(rest[:3])
        except ValueError:
            raise httpx.RemoteProtocolError(f"malformed upstream status line {lines[0][:100]!r}") from None
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        reusable = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
        try:
            return WireResponse(self, conn, status, headers, reusable)
        except ValueError:
            raise httpx.RemoteProtocolError("malformed upstream Content-Length") from None

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for _, writer in idle:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


class _StaleConnectionError(Exception):
    """The connection was closed before any byte of a response arrived."""
