"""zstd data read frame by frame: data that ends inside a frame is refused, not read as a shorter file.

zstandard's own stream reader ends quietly where its input ends, even inside a frame, so a
``.zst`` cut short reads as a shorter file (or, when the cut falls in its first block, an empty
one). Here each frame is decompressed until the decompressor says it is whole, and input that ends
before then raises :class:`EOFError` once everything before the cut has been given, as Python's
``gzip`` does for a member cut short. Frames may follow one another (``cat a.zst b.zst``).
"""

from __future__ import annotations

import io
from typing import IO, Any

# Input fed to the decompressor at a time: its output (a few times this for text) is held at once.
_READ_SIZE = 1 << 15


class ZstdFrames(io.RawIOBase):
    """The decompressed bytes of ``raw``, a stream of zstd frames."""

    def __init__(self, raw: IO[bytes]):
        import zstandard

        self._raw = raw
        self._decompressor = zstandard.ZstdDecompressor()
        self._frame: Any = None  # the frame being decompressed; None between frames
        self._input = b""
        self._output = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._output:
            if not self._input:
                self._input = self._raw.read(_READ_SIZE)
                if not self._input:
                    if self._frame is not None:
                        raise EOFError("the zstd data ends inside a frame")
                    return 0
            if self._frame is None:
                self._frame = self._decompressor.decompressobj()
            self._output = memoryview(self._frame.decompress(self._input))
            self._input = b""
            if self._frame.eof:  # whole; what follows it is the next frame
                self._input, self._frame = self._frame.unused_data, None
        size = min(len(buffer), len(self._output))
        buffer[:size] = self._output[:size]
        self._output = self._output[size:]
        return size
