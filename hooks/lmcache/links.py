"""The layer above LMCache: which of its operations each LMCache operation belongs to.

When LMCache runs inside a vLLM worker under kvaudit's vLLM hook (docs/design.md section
6.4), the vLLM layer opens a `kvaudit.fetch` or `kvaudit.store` span per request and then
hands the request to LMCache. Before it does, it registers a `Link` under the request id
LMCache is called with (vLLM's internal id) and the operation: the LMCache hooks then
record their spans as children of the vLLM span, under vLLM's external request id, and
tell the link what became of every chunk, so that the vLLM layer can name, for each of
its blocks, the chunk that served it (`kvaudit.page.source_key`).

Lookups have no vLLM span in the worker (vLLM's lookup runs in its scheduler process): an
LMCache lookup only takes the request id the layer above names the request by.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Final, overload

import msgspec

if TYPE_CHECKING:
    from opentelemetry.trace import SpanContext

    from kvaudit.contract import Op, PageDescriptor
    from kvaudit.emit.emitter import Operation

# Links are per step; the bound only caps memory when the layer above never comes back
# for one (a request aborted between its registration and LMCache's call).
_MAX_LINKS: Final = 4096


class LazyPages(Sequence["PageDescriptor"]):
    """The descriptors of one LMCache operation's chunks, made when first read.

    The LMCache hook records what it must read while LMCache holds the objects and
    leaves the descriptors to whoever reads them first: an exporter thread, unless a
    registry or the guard needs them at once. Two threads reading at once make equal
    lists, and one is kept. `all_used`: every chunk was stored, or fetched and used; a
    reader that needs only that makes none of them.
    """

    def __init__(self, count: int, make: Callable[[], list[PageDescriptor]], *, all_used: bool) -> None:
        self._count, self._make, self.all_used = count, make, all_used
        self._pages: list[PageDescriptor] | None = None

    def _made(self) -> list[PageDescriptor]:
        pages = self._pages
        if pages is None:
            pages = self._pages = self._make()
        return pages

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> PageDescriptor: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[PageDescriptor]: ...

    def __getitem__(self, index: int | slice) -> PageDescriptor | Sequence[PageDescriptor]:
        return self._made()[index]

    def __iter__(self) -> Iterator[PageDescriptor]:
        return iter(self._made())


class Link(msgspec.Struct):
    """One operation of the layer above on one request (a struct: made in C, one a request a
    step, on the serving thread).

    Attributes:
        request_id: the request id LMCache's spans record (the layer above's own).
        parent: the layer above's operation (or its span's context): LMCache's spans for
            the request are its children.
        on_pages: told the pages of each LMCache operation for the request, in key order:
            every requested chunk of a fetch, those LMCache did not get with `used=False`;
            every chunk of a store. Without the guard, as `LazyPages`. Called inside the
            LMCache hook, which fails open.
    """

    request_id: str
    parent: SpanContext | Operation
    on_pages: Callable[[Sequence[PageDescriptor]], None]


class Links:
    """Links by (engine request id, operation), and the request ids of unlinked operations."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._links: dict[tuple[str, Op], Link] = {}
        self.rename: Callable[[str], str] | None = None

    def put(self, engine_request_id: str, op: Op, link: Link) -> None:
        with self._lock:
            links = self._links
            # Keyed by the `Op` itself (a str): its `.value` is two Python calls on the serving thread.
            links.pop((engine_request_id, op), None)
            links[(engine_request_id, op)] = link
            if len(links) > _MAX_LINKS:
                # Dicts keep insertion order: drop the oldest quarter in one go.
                for old in list(links)[: _MAX_LINKS // 4]:
                    links.pop(old, None)

    def get(self, engine_request_id: str | None, op: Op) -> Link | None:
        if engine_request_id is None:
            return None
        return self._links.get((engine_request_id, op))

    def request_id(self, engine_request_id: str | None, link: Link | None) -> str | None:
        """The request id to record: the link's, else the renamed engine id, else the engine id."""
        if link is not None:
            return link.request_id
        if engine_request_id is None or self.rename is None:
            return engine_request_id
        return self.rename(engine_request_id)

    def clear(self) -> None:
        with self._lock:
            self._links.clear()
        self.rename = None


LINKS: Final = Links()
