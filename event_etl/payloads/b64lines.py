"""Base64 lines: how a folder source carries binary payloads, one per line.

Every line of a binary dialect's file is decoded by one function, :func:`b64decode_line` (``pybase64``'s SIMD
decoder, which validates: the standard alphabet, whole quads, ``=`` only at the end), on the record path and the
fast path alike, so that both take and refuse the same lines.  ``base64.b64decode`` took ~0.9 µs a line of 270
characters, ``pybase64`` ~0.37 (a numpy decoder of whole chunks took ~2.1: the per-character work dominates).
:func:`decode_lines` decodes a chunk's lines for the fast path, with where each lies in the chunk (a dead letter
keeps its line).
"""

from __future__ import annotations

import binascii
from collections.abc import Callable
from typing import Any

__all__ = ["decode_lines", "DecodedLines", "b64decode_line", "B64Error"]

B64Error = (binascii.Error, ValueError)
"""What :func:`b64decode_line` raises for a line that is not plain base64."""


def _decoder() -> Callable[[bytes], bytes]:
    from functools import partial

    try:
        import pybase64
    except ImportError:  # the light install: the standard library's (slower, the same answers on valid lines)
        import base64

        return partial(base64.b64decode, validate=True)
    return partial(pybase64.b64decode, validate=True)


b64decode_line: Callable[[bytes], bytes] = _decoder()
"""A line's payload; raises one of :data:`B64Error` if the line is not plain base64."""


class DecodedLines:
    """The payloads of a chunk's lines (``payloads[i]`` is line ``i``'s, which lies at ``line_starts[i]:line_ends[i]``
    of the chunk), and the same back to back (:meth:`joined`)."""

    __slots__ = ("payloads", "line_starts", "line_ends")

    def __init__(self, payloads: list[bytes], line_starts: Any, line_ends: Any) -> None:
        """``line_starts``, ``line_ends``: numpy arrays (the light install, which has no numpy, reads lines one by one
        through :func:`b64decode_line` and never builds one)."""
        self.payloads, self.line_starts, self.line_ends = payloads, line_starts, line_ends

    def __len__(self) -> int:
        return len(self.payloads)


def decode_lines(data: bytes) -> DecodedLines | None:
    """Every line of ``data`` decoded; None if one is empty, holds a ``\\r`` or is not plain base64 (the record path
    then says which)."""
    if b"\r" in data:
        return None
    lines = data.split(b"\n")
    if lines and not lines[-1]:
        lines.pop()
    try:
        payloads = list(map(b64decode_line, lines))
    except B64Error:
        return None
    import numpy as np

    sizes = np.fromiter(map(len, lines), dtype=np.int64, count=len(lines))
    if not len(sizes) or sizes.min() == 0:
        return None
    ends = np.cumsum(sizes + 1) - 1
    return DecodedLines(payloads, ends - sizes, ends)
