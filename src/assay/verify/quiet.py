"""Keep the torch profiler's kineto markers out of the logs, and nothing else.

Every ``torch.autograd.profiler.profile`` / ``torch.profiler.profile`` session makes libkineto
write two lines straight to the process's stderr (std::cerr, not Python's logging)::

    USDT:2026-11-25 06:04:26 10988:10988 SyncActivityProfilerHandler.cpp:52] profiler_start
    USDT:2026-11-25 06:04:26 10988:10988 SyncActivityProfilerHandler.cpp:59] profiler_stop

They are tracing markers, not messages. ``KINETO_LOG_LEVEL`` cannot drop them alone: libkineto
ranks USDT above ERROR, so the level that hides them hides kineto's real errors too. Hence
``no_kineto_markers``: around a profiled block, file descriptor 2 goes to a temporary file, and
afterwards everything written there goes back to stderr except those two marker lines.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

# Bound at import, before a candidate's code can patch os (the worker imports this first).
_DUP, _DUP2, _CLOSE, _WRITE = os.dup, os.dup2, os.close, os.write
# libkineto's marker lines, exactly: anything else written meanwhile is passed on
MARKER = re.compile(rb"USDT:[^\n]*\] profiler_(start|stop)\r?\n?")


def drop_markers(data: bytes) -> bytes:
    """``data`` without libkineto's profiler_start / profiler_stop lines."""
    return b"".join(line for line in data.splitlines(keepends=True)
                    if not MARKER.fullmatch(line))


@contextmanager
def no_kineto_markers() -> Iterator[None]:
    """Run the block with fd 2 captured; on the way out (exceptions included) write what it
    wrote, less the kineto markers, to the real stderr."""
    try:
        sys.stderr.flush()
        saved = _DUP(2)
    except (OSError, ValueError, AttributeError):  # no usable stderr: nothing to clean
        yield
        return
    with tempfile.TemporaryFile() as tmp:
        _DUP2(tmp.fileno(), 2)
        try:
            yield
        finally:
            try:
                sys.stderr.flush()
            except (OSError, ValueError):
                pass
            _DUP2(saved, 2)
            _CLOSE(saved)
            tmp.seek(0)
            kept = drop_markers(tmp.read())
            while kept:
                kept = kept[_WRITE(2, kept):]
