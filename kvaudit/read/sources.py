"""What a trace file holds, told from its first bytes, and the text of a compressed one.

Trace files are OTLP JSON text: lines (one `TracesData` per line, as the OpenTelemetry
Collector's file exporter and kvaudit write them) or pretty-printed documents (one
object over many lines, as opentelemetry-proto's `examples/trace.json` and saved
request bodies are). Either may be compressed whole, as the Collector's `compression`
option writes it: gzip (members) or zstd (frames), or, before the Collector's native
compression, a zstd frame per export behind its 4-byte big-endian length. What a file
holds is told from its bytes, never from its name. Anything else (binary data, OTLP
protobuf) is not read: the file is named with the reason (docs/design.md section 3.1).
"""

from __future__ import annotations

import io
import re
import zlib
from collections.abc import Iterator
from typing import Any, BinaryIO, Final

from kvaudit.errors import InputError

try:  # the standard library's from Python 3.14
    from compression import zstd  # type: ignore[import-not-found]
except ImportError:
    from backports import zstd

SNIFF_BYTES: Final = 4096  # what is looked at to tell a file's kind
GZIP: Final = "gzip"
ZSTD: Final = "zstd"
ZSTD_FRAMES: Final = "zstd-frames"  # the Collector's file exporter before its native compression
_GZIP_MAGIC: Final = b"\x1f\x8b"
_ZSTD_MAGIC: Final = b"\x28\xb5\x2f\xfd"
# JSON text holds no control character but white space; a file that does is not JSON.
_CONTROL: Final = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f]")
# A pretty-printed document starts with a line holding only its opening brace, the next indented...
_DOCUMENT_START: Final = re.compile(rb"[ \t\r\n]*\{[ \t\r]*\n[ \t\r\n]*[ \t]+[\"}]")
# ... and ends at a line holding only its closing brace.
DOCUMENT_END: Final = re.compile(rb"\n\}[ \t\r]*(?=\n)")
_READ_BYTES: Final = 1 << 20  # read, and decompressed, per call


class CompressedDataError(InputError):
    """Compressed data that ends early or is corrupt."""


def compression_of(head: bytes) -> str:
    """How the file whose first bytes are `head` is compressed ("" when it is not)."""
    if head.startswith(_GZIP_MAGIC):
        return GZIP
    if head.startswith(_ZSTD_MAGIC):
        return ZSTD
    if head[4:8] == _ZSTD_MAGIC:
        return ZSTD_FRAMES
    return ""


def is_document(text: bytes) -> bool:
    """Whether text starting with `text` is pretty-printed JSON: its first line that is not
    blank holds only an opening brace, and the next is indented (a line of OTLP JSON lines
    holds a whole object; one cut after its brace goes on unindented)."""
    return _DOCUMENT_START.match(text) is not None


def not_json(head: bytes) -> str | None:
    """Why text starting with `head` is not OTLP JSON (None when it may be): control bytes
    are a thirty-second of it or more (JSON text has none; a few come from a damaged line,
    which is named on its own)."""
    controls = [match.start() for match in _CONTROL.finditer(head)]
    if not controls or 32 * len(controls) < len(head):
        return None
    if head[4:5] == b"\x0a":  # a 4-byte length and a protobuf message's field 1
        return "not OTLP JSON: length-prefixed OTLP protobuf (the Collector's `format: proto`)"
    return f"not OTLP JSON: binary data (byte 0x{head[controls[0]]:02x} at offset {controls[0]})"


def decompress(file: BinaryIO, compression: str) -> Iterator[bytes]:
    """The text of a compressed file, in blocks as it is decompressed: all of it that can
    be, up to where the data ends (a writer may be in the middle of a member or frame).

    Raises:
        CompressedDataError: after the last whole block, when the data ends early or is corrupt.
    """
    if compression == ZSTD_FRAMES:
        yield from _zstd_frames(file)
    else:
        yield from _inflated(file, compression)


_UNIT: Final = {GZIP: "member", ZSTD: "frame"}  # what each compresses independently


def _inflater(compression: str) -> Any:
    """A decompressor of one gzip member or zstd frame (zlib's or zstd's: the same calls)."""
    return zlib.decompressobj(wbits=16 + zlib.MAX_WBITS) if compression == GZIP else zstd.ZstdDecompressor()


def _inflated(file: BinaryIO, compression: str) -> Iterator[bytes]:
    """Every gzip member or zstd frame, one after the other, in bounded blocks; of one cut
    short (the Collector keeps a zstd frame open between its flushes), what it holds."""
    inflater, fed = _inflater(compression), False
    while block := file.read(_READ_BYTES):
        while block is not None:
            fed = True
            try:
                text = inflater.decompress(block, _READ_BYTES)
            except (zlib.error, zstd.ZstdError) as exc:
                raise CompressedDataError(f"corrupt {compression} data: {exc}") from None
            if text:
                yield text
            if inflater.eof:  # the next member or frame
                block = inflater.unused_data or None
                inflater, fed = _inflater(compression), False
            elif compression == GZIP:  # zlib hands back what it has not taken of the block
                block = inflater.unconsumed_tail or None
            else:  # zstd keeps it: asked again with nothing until it wants more
                block = None if inflater.needs_input else b""
    if fed and not inflater.eof:
        raise CompressedDataError(f"{compression} data ends mid-{_UNIT[compression]} (truncated?)")


def _zstd_frames(file: BinaryIO) -> Iterator[bytes]:
    """The Collector's length-prefixed frames: each a zstd frame of one export's JSON, made a line here."""
    while header := file.read(4):
        size = int.from_bytes(header.ljust(4, b"\0"), "big")
        frame = file.read(size)
        if len(header) < 4 or len(frame) < size:
            raise CompressedDataError("a length-prefixed zstd frame ends early (truncated?)")
        if not frame.startswith(_ZSTD_MAGIC):
            raise CompressedDataError("a length-prefixed frame that is not zstd")
        # A block at a time, as any other zstd: the line limit applies before a frame is whole.
        yield from _inflated(io.BytesIO(frame), ZSTD)
        yield b"\n"
