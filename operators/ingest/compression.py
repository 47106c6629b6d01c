"""Transparent decompression by file suffix (.gz, .zst), streaming, that never hides a cut-off file.

gzip raises ``EOFError`` when its input ends inside a member. zstandard's ``stream_reader``
just stops, so a truncated .zst would read as a shorter file; ``_ZstdFrames`` follows the
frame and block headers of the compressed bytes (RFC 8878 section 3.1) and raises the same
``EOFError`` when the input ends inside a frame. ``find_cut`` walks gzip members or zstd frames
of a file from a given offset and reports the first that is cut off (used by the WARC reader).
"""

from __future__ import annotations

import gzip
import io
import zlib
from dataclasses import dataclass
from typing import IO, Any, Literal, cast

Codec = Literal["gzip", "zstd", "none"]
CHUNK = 1 << 17
_ZSTD_MAGIC = 0xFD2FB528
_SKIPPABLE = range(0x184D2A50, 0x184D2A60)  # skippable frames: magic, 4-byte size, payload


class InvalidStreamError(ValueError):
    """A compressed file that holds no stream of its codec at all: 0 bytes, where compressing even
    empty data writes a gzip member or a zstd frame. Readers quarantine the file as ``invalid_stream``."""


def empty_stream(uri: str, codec: Codec) -> InvalidStreamError:
    """The error for a 0-byte compressed file (readers quarantine it as ``invalid_stream``)."""
    unit = "member" if codec == "gzip" else "frame"
    return InvalidStreamError(f"{uri}: 0-byte {codec} file, not a {codec} stream (a compressed file holds at least one "
                              f"{unit}, even for empty data); it was cut to nothing or never written: re-create it or "
                              "remove it from the inputs")


def codec_of(uri: str) -> Codec:
    name = uri.lower()
    if name.endswith(".gz"):
        return "gzip"
    if name.endswith((".zst", ".zstd")):
        return "zstd"
    return "none"


def decompress(stream: IO[bytes], uri: str) -> IO[bytes]:
    codec = codec_of(uri)
    if codec == "gzip":
        return cast(IO[bytes], gzip.GzipFile(fileobj=cast(IO[bytes], _NonEmptySource(stream, uri, "gzip"))))
    if codec == "zstd":
        return io.BufferedReader(_ZstdFrames(stream, uri), buffer_size=1 << 20)
    if isinstance(stream, io.BufferedReader):
        return stream
    # fsspec remote files (s3fs, webhdfs) have no readline(size): buffer them like local files
    return io.BufferedReader(cast(io.RawIOBase, stream), buffer_size=1 << 20)


def strip_compression_suffix(uri: str) -> str:
    for suffix in (".gz", ".zst", ".zstd"):
        if uri.lower().endswith(suffix):
            return uri[: -len(suffix)]
    return uri


class ZstdFrameWalker:
    """Follows zstd frame and block headers over compressed bytes fed in order, without decompressing.

    ``at_boundary`` is True when the bytes fed so far end exactly between two frames; ``frame_start``
    is the offset (in bytes fed) of the frame being read; ``invalid`` says why bytes are no frame.
    """

    _HEADER_BYTES = {"magic": 4, "descriptor": 1, "block": 3, "checksum": 4, "skippable_size": 4}

    def __init__(self) -> None:
        self.fed = 0
        self.frame_start = 0
        self.invalid: str | None = None
        self._state = "magic"
        self._want = 4
        self._header = bytearray()
        self._skip = 0
        self._after = "magic"
        self._checksum = False

    @property
    def at_boundary(self) -> bool:
        return self.invalid is None and self._state == "magic" and not self._header

    def feed(self, data: bytes | memoryview) -> None:
        view, pos, end = memoryview(data).cast("B"), 0, len(data)
        while pos < end and self.invalid is None:
            if self._skip:  # block contents: jump over them
                step = min(self._skip, end - pos)
                pos += step
                self._skip -= step
                if not self._skip:
                    self._enter(self._after, self.fed + pos)
                continue
            step = min(self._want - len(self._header), end - pos)
            self._header += view[pos:pos + step]
            pos += step
            if len(self._header) == self._want:
                header = bytes(self._header)
                self._header.clear()
                self._on_header(header, self.fed + pos)
        self.fed += end

    def _enter(self, state: str, at: int, want: int = 0) -> None:
        self._state = state
        self._want = self._HEADER_BYTES.get(state, want)
        if state == "magic":
            self.frame_start = at

    def _skip_then(self, size: int, after: str, at: int) -> None:
        self._skip, self._after = size, after
        if not size:
            self._enter(after, at)

    def _on_header(self, header: bytes, at: int) -> None:
        value = int.from_bytes(header, "little")
        if self._state == "magic":
            if value == _ZSTD_MAGIC:
                self._enter("descriptor", at)
            elif value in _SKIPPABLE:
                self._enter("skippable_size", at)
            else:
                self.invalid = f"no zstd frame starts at byte {at - 4} (magic {value:#010x})"
        elif self._state == "descriptor":  # Frame_Header_Descriptor, RFC 8878 section 3.1.1.1.1
            single_segment = (value >> 5) & 1
            self._checksum = bool((value >> 2) & 1)
            rest = (1 - single_segment) + (0, 1, 2, 4)[value & 3] + (single_segment, 2, 4, 8)[value >> 6]
            if rest:
                self._enter("frame_header", at, rest)
            else:
                self._enter("block", at)
        elif self._state == "frame_header":
            self._enter("block", at)
        elif self._state == "block":  # Block_Header: Last_Block (1 bit), Block_Type (2), Block_Size (21)
            last, kind, size = value & 1, (value >> 1) & 3, value >> 3
            if kind == 3:
                self.invalid = f"reserved zstd block type at byte {at - 3}"
                return
            after = ("checksum" if self._checksum else "magic") if last else "block"
            self._skip_then(1 if kind == 1 else size, after, at)  # an RLE block stores one byte
        elif self._state == "checksum":
            self._enter("magic", at)
        elif self._state == "skippable_size":
            self._skip_then(value, "magic", at)


class _WalkedSource:
    """The compressed source as zstandard reads it, every byte fed through a ``ZstdFrameWalker``."""

    def __init__(self, source: IO[bytes], walker: ZstdFrameWalker) -> None:
        self._source = source
        self._walker = walker

    def read(self, size: int = CHUNK) -> bytes:
        data = self._source.read(size if size >= 0 else CHUNK)
        self._walker.feed(data)
        return data


class _NonEmptySource:
    """A compressed source whose first read raises ``InvalidStreamError`` when the file has no byte
    (gzip itself reads a 0-byte file as empty data)."""

    def __init__(self, source: IO[bytes], uri: str, codec: Codec) -> None:
        self._source = source
        self._uri = uri
        self._codec = codec
        self._fed = 0

    def read(self, size: int = -1) -> bytes:
        data = self._source.read(size)
        if not data and not self._fed:
            raise empty_stream(self._uri, self._codec)
        self._fed += len(data)
        return data


class _ZstdFrames(io.RawIOBase):
    """zstandard's bounded ``stream_reader`` (across frames) that raises ``EOFError`` on a cut-off frame."""

    def __init__(self, source: IO[bytes], uri: str) -> None:
        import zstandard

        super().__init__()
        self.uri = uri
        self._walker = ZstdFrameWalker()
        walked = cast(IO[bytes], _WalkedSource(source, self._walker))  # a RawIOBase: what stream_reader reads
        self._reader = zstandard.ZstdDecompressor().stream_reader(walked, read_across_frames=True)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        count = int(self._reader.readinto(buffer))
        if count == 0 and self._walker.fed == 0:
            raise empty_stream(self.uri, "zstd")
        if count == 0 and not self._walker.at_boundary:
            where = self._walker.invalid or f"the frame starting at byte {self._walker.frame_start} is cut off"
            raise EOFError(f"zstd data ends at byte {self._walker.fed} inside a frame ({where}); the file is truncated")
        return count


@dataclass(frozen=True)
class Cut:
    """Where a compressed file stops making sense: ``offset`` of the broken member/frame, why."""

    offset: int
    reason: Literal["truncated_file", "corrupt_file"]
    detail: str


def find_cut(stream: IO[bytes], start: int, codec: Codec) -> Cut | None:
    """Walk the gzip members or zstd frames of ``stream`` from byte ``start`` to its end.

    Returns the first member/frame that is cut off or corrupt, or None when the data from
    ``start`` ends cleanly on a boundary. Output is decompressed in bounded pieces and dropped.
    """
    stream.seek(start)
    if codec == "gzip":
        return _gzip_cut(stream, start)
    if codec == "zstd":
        walker = ZstdFrameWalker()
        while chunk := stream.read(CHUNK):
            walker.feed(chunk)
            if walker.invalid:
                return Cut(start + walker.frame_start, "corrupt_file", walker.invalid)
        if walker.at_boundary:
            return None
        return Cut(start + walker.frame_start, "truncated_file",
                   f"zstd frame at byte {start + walker.frame_start} is cut off at byte {start + walker.fed} (end of file)")
    raise ValueError(f"find_cut needs a compressed stream, got codec {codec!r}")


def _gzip_cut(stream: IO[bytes], start: int) -> Cut | None:
    offset, pending = start, b""
    while True:
        data = pending or stream.read(CHUNK)
        if not data:
            return None
        if not b"\x1f\x8b".startswith(data[:2]):  # a lone first byte may be a member cut after one byte
            if not data.strip(b"\0") and not stream.read(CHUNK).strip(b"\0"):
                return None  # zero padding after the last member (tape-style) is no data
            return Cut(offset, "corrupt_file", f"no gzip member starts at byte {offset}")
        member = zlib.decompressobj(wbits=31)
        fed = 0
        while True:
            fed += len(data)
            try:
                while data and not member.eof:
                    member.decompress(data, CHUNK)  # bounded output, dropped: only the framing matters
                    data = member.unconsumed_tail
            except zlib.error as exc:
                return Cut(offset, "corrupt_file", f"gzip member at byte {offset}: {exc}")
            if member.eof:
                pending = member.unused_data
                offset += fed - len(pending)
                break
            data = stream.read(CHUNK)
            if not data:
                return Cut(offset, "truncated_file",
                           f"gzip member at byte {offset} is cut off at byte {offset + fed} (end of file) "
                           "before its end-of-stream marker")
