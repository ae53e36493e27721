"""A failed run's stored traceback (api_schemas.tracebacks): Python's own format, bounded with
its innermost frames kept, and the frame of the trainer's code it failed at, past library
frames and seedgrid's run plumbing."""

from __future__ import annotations

import importlib.util
import json
import traceback
from pathlib import Path
from types import ModuleType

import pytest

from api_schemas.tracebacks import (
    MAX_TRACEBACK_LENGTH,
    Frame,
    format_traceback,
    frames,
    innermost_frame,
)

USER_CODE = """\
import json


def parse(text):
    return json.loads(text)


def nested(depth):
    if depth == 0:
        raise ValueError("shapes (64,) and (65,) not aligned")
    return nested(depth - 1)


def train():
    try:
        parse("{not json")
    except ValueError as exc:
        raise RuntimeError("could not read the config") from exc
"""


def user_module(tmp_path: Path) -> ModuleType:
    """The user's code, in a file outside the package, imported as a worker would."""
    path = tmp_path / "user_helpers.py"
    path.write_text(USER_CODE)
    spec = importlib.util.spec_from_file_location("user_helpers", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def caught(call) -> BaseException:  # type: ignore[no-untyped-def]
    with pytest.raises(Exception) as info:
        call()
    return info.value


def line_of(text: str) -> int:
    return USER_CODE.splitlines().index(text) + 1


def test_the_stored_text_is_pythons_format_and_the_frame_is_the_users_helper(
    tmp_path: Path,
) -> None:
    module = user_module(tmp_path)
    exc = caught(lambda: module.nested(3))
    text = format_traceback(exc)
    assert text == "".join(traceback.format_exception(exc))
    file = str(tmp_path / "user_helpers.py")
    raised = line_of('        raise ValueError("shapes (64,) and (65,) not aligned")')
    assert innermost_frame(text) == Frame(file, raised, "nested")
    assert str(innermost_frame(text)) == f"{file}:{raised}, in nested"
    # outermost first: this test's lambda, then the four calls of nested
    assert [f.function for f in frames(text)][-4:] == ["nested"] * 4


def test_library_frames_are_passed_over_and_a_chained_exception_counts_by_its_last_traceback(
    tmp_path: Path,
) -> None:
    """json.loads raised inside the standard library, and the user's code raised another
    error while handling it: the frame is the line of the user's code that raised last."""
    module = user_module(tmp_path)
    text = format_traceback(caught(module.train))
    assert "During handling of the above exception" not in text  # `from exc`: the direct cause
    assert "The above exception was the direct cause" in text
    innermost = innermost_frame(text)
    assert innermost is not None
    assert innermost.line == line_of(
        '        raise RuntimeError("could not read the config") from exc'
    )
    assert innermost.function == "train"
    # the cause's own traceback ends inside json (a library): its user frame is `parse`
    cause = text.split("The above exception was the direct cause")[0]
    frame = innermost_frame(cause)
    assert frame is not None and frame.function == "parse"
    assert frames(cause)[-1].file == json.decoder.__file__


def test_seedgrid_plumbing_and_installed_packages_are_not_the_trainers_code() -> None:
    text = (
        "Traceback (most recent call last):\n"
        '  File "/srv/seedgrid/workers/task.py", line 240, in _train\n'
        '  File "/srv/seedgrid/trainers/runtime.py", line 381, in run\n'
        '  File "/home/me/mlp.py", line 12, in train\n'
        '  File "/home/me/.venv/lib/python3.11/site-packages/numpy/core/numeric.py", '
        "line 3, in dot\n"
        '  File "<frozen importlib._bootstrap>", line 1, in _call\n'
        "ValueError: shapes (64,) and (65,) not aligned\n"
    )
    assert innermost_frame(text) == Frame("/home/me/mlp.py", 12, "train")
    only_plumbing = (
        "Traceback (most recent call last):\n"
        '  File "/srv/seedgrid/workers/task.py", line 240, in _train\n'
        "KeyError: 'x'\n"
    )
    assert innermost_frame(only_plumbing) is None
    assert innermost_frame(None) is None and innermost_frame("") is None


def test_a_long_traceback_is_cut_in_the_middle_and_keeps_its_innermost_frames(
    tmp_path: Path,
) -> None:
    """A cause with an enormous message (a config quoted whole, say) comes first in the text;
    the exception that ended the run, with its frames, comes last and is kept."""
    module = user_module(tmp_path)

    def fail() -> None:
        try:
            raise KeyError("x" * (3 * MAX_TRACEBACK_LENGTH))
        except KeyError:
            module.nested(2)

    exc = caught(fail)
    full = "".join(traceback.format_exception(exc))
    assert len(full) > 3 * MAX_TRACEBACK_LENGTH
    text = format_traceback(exc)
    assert len(text) <= MAX_TRACEBACK_LENGTH + 100
    assert text.startswith("Traceback (most recent call last):\n")
    assert "characters cut ...]" in text
    assert text.endswith("ValueError: shapes (64,) and (65,) not aligned\n")
    raised = line_of('        raise ValueError("shapes (64,) and (65,) not aligned")')
    innermost = innermost_frame(text)
    assert innermost is not None and (innermost.line, innermost.function) == (raised, "nested")


def test_unstorable_characters_in_the_message_are_replaced() -> None:
    text = format_traceback(caught(lambda: (_ for _ in ()).throw(ValueError("nul \x00 here"))))
    assert "\x00" not in text and "nul \ufffd here" in text
