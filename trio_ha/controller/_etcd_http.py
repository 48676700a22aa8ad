# pyright: strict
"""The one place the etcd client touches httpx: JSON POSTs to etcd's gateway.

Two reasons for a module of its own. It is imported only when an etcd client opens: httpx
takes about 0.1 s to import, and ``trio_ha.controller`` (which the name server and the CLI
import whether or not they use etcd) names the etcd client. And it sends each request body
as one chunk through an iterator object rather than httpx's own body stream, which is an
async generator: httpcore awaits the socket between that generator's chunks, so a request
cancelled there (every campaign that a follower renews, every call cut off by its timeout)
left the generator suspended, and trio warns when such a generator is collected (an error
in the tests, which run with warnings as errors).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import httpx
import trio

from .._errors import TrioHAError

__all__ = ["Post", "TransportFailure", "open_post"]

#: ``await post(url, body)``: the reply's status and bytes
Post = Callable[[str, bytes], Awaitable[tuple[int, bytes]]]


class TransportFailure(TrioHAError, ConnectionError):
    """The request did not get an HTTP reply (refused, reset, closed); the etcd client
    turns it into a note about that member, never lets it out. ``maybe_sent``: false only
    when no connection was made, so etcd cannot have seen the request."""

    def __init__(self, message: str, *, maybe_sent: bool = True) -> None:
        super().__init__(message)
        self.maybe_sent = maybe_sent


class _Chunk:
    """An async iterator over one bytes value: a plain object, so that leaving it early
    leaves nothing to finalize."""

    def __init__(self, data: bytes) -> None:
        self._data: bytes | None = data

    def __aiter__(self) -> _Chunk:
        return self

    async def __anext__(self) -> bytes:
        await trio.lowlevel.checkpoint()
        data, self._data = self._data, None
        if data is None:
            raise StopAsyncIteration
        return data


class _Body(httpx.AsyncByteStream):
    def __init__(self, data: bytes) -> None:
        self._data = data

    def __aiter__(self) -> AsyncIterator[bytes]:
        return _Chunk(self._data)


@asynccontextmanager
async def open_post() -> AsyncGenerator[Post, None]:
    """A :data:`Post` over one connection pool, closed on exit. Timeouts are the caller's
    (trio cancel scopes): one campaign waits long, every other call briefly."""
    async with httpx.AsyncClient(timeout=None, trust_env=False) as http:

        async def post(url: str, body: bytes) -> tuple[int, bytes]:
            request = http.build_request("POST", url, headers={
                "content-type": "application/json", "content-length": str(len(body))})
            request.stream = _Body(body)
            try:
                reply = await http.send(request)
            except httpx.TransportError as exc:
                raise TransportFailure(
                    f"{type(exc).__name__}: {exc}",
                    maybe_sent=not isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout),
                ) from exc
            return reply.status_code, reply.content

        yield post
