"""A failed run's traceback as stored text, and the frame of it that a person looks at first.

The worker formats the exception that ended a run (`format_traceback`: Python's own format,
chained exceptions included, made storable and cut to MAX_TRACEBACK_LENGTH characters around
the middle, so that the innermost frames, at the end, are always kept). The service reads the
stored text back (`innermost_frame`) to say where the run failed: the innermost frame that is
neither a library's (the standard library, site-packages) nor seedgrid's own run plumbing (the
worker's task, the trainers' runtime), that is the line of the trainer's code that raised or
called what raised. Both sides import this module, which needs nothing but the standard library
and api_schemas.
"""

from __future__ import annotations

import re
import traceback
from dataclasses import dataclass

from api_schemas import storable_text

# A stored traceback's length bound: the first TRACEBACK_HEAD characters and the last
# MAX_TRACEBACK_LENGTH - TRACEBACK_HEAD are kept (the innermost frames are the last ones).
MAX_TRACEBACK_LENGTH = 20_000
TRACEBACK_HEAD = 4_000

_FRAME = re.compile(r'^  File "(?P<file>.+)", line (?P<line>\d+), in (?P<function>.+)$')
_LIBRARY = re.compile(r"([/\\](site|dist)-packages[/\\])|([/\\]lib[/\\]python3\.\d+[/\\])")
# seedgrid's run plumbing between the worker and a trainer's own code (by module path)
_PLUMBING = (
    "workers/task.py",
    "trainers/runtime.py",
    "trainers/functional.py",
)


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}, in {self.function}"


def format_traceback(exc: BaseException) -> str:
    """The exception's full traceback (Python's format, chained exceptions included), storable
    and at most MAX_TRACEBACK_LENGTH characters: when longer, its middle is cut and says so."""
    text = storable_text("".join(traceback.format_exception(exc)), max_length=None)
    if len(text) <= MAX_TRACEBACK_LENGTH:
        return text
    tail = MAX_TRACEBACK_LENGTH - TRACEBACK_HEAD
    cut = len(text) - TRACEBACK_HEAD - tail
    return f"{text[:TRACEBACK_HEAD]}\n[... {cut} characters cut ...]\n{text[-tail:]}"


def frames(text: str) -> list[Frame]:
    """The frames of the last traceback in `text` (the exception that ended the run, after any
    it was raised while handling), outermost first."""
    last = text.rsplit("Traceback (most recent call last):", 1)[-1]
    found = []
    for line in last.splitlines():
        match = _FRAME.match(line)
        if match:
            found.append(Frame(match["file"], int(match["line"]), match["function"]))
    return found


def is_library(file: str) -> bool:
    """A frame of the standard library, an installed package or Python's frozen modules."""
    return file.startswith("<") or _LIBRARY.search(file) is not None


def innermost_frame(text: str | None) -> Frame | None:
    """The innermost frame of the trainer's code in a stored traceback: the last one that is
    neither a library's nor seedgrid's run plumbing. None: no such frame (no traceback, or an
    error raised by seedgrid itself or inside an installed package only)."""
    for frame in reversed(frames(text or "")):
        normal = frame.file.replace("\\", "/")
        if not is_library(frame.file) and not normal.endswith(_PLUMBING):
            return frame
    return None
