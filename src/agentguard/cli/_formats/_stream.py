"""The JSON values of a trace file, streamed: JSONL lines, a JSON array's items, or one document.

Linear in the file's size whatever its shape: a JSONL line is decoded once; a JSON array spread
over many lines is decoded item by item (an item that does not decode yet is retried only once
the buffer has doubled); a document spread over many lines that is no array (an ATIF
trajectory, a SWE-agent ``.traj``) is read whole and decoded once.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Iterator
from typing import IO, Any

from ._base import InputError, only_objects

__all__ = ["Batch", "items", "open_counted"]

_CHUNK = 1 << 16
#: what may come between a JSON array's items: whitespace and the commas
_BETWEEN = re.compile(r"[ \t\r\n,]*")


class _Counting:
    """How many bytes of the file have been read so far, for a progress bar: the file's own
    position, read when asked. (No Python layer between the reader and the file: a read stays
    in C, and Ctrl-C interrupts it as it interrupts any blocking read.)"""

    def __init__(self, raw: io.BufferedReader) -> None:
        self._raw = raw

    @property
    def count(self) -> int:
        try:
            return int(self._raw.raw.tell())
        except (OSError, ValueError):  # a pipe has no position; a closed file none either
            return 0


def open_counted(path: str) -> tuple[IO[str], _Counting]:
    """Open ``path`` as UTF-8 text, with a counter of the bytes read so far."""
    try:
        raw = open(path, "rb")  # noqa: SIM115 - owned by the returned stream
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
    return io.TextIOWrapper(raw, encoding="utf-8"), _Counting(raw)


# -- JSON items ------------------------------------------------------------------------------


def items(stream: IO[str], path: str) -> Iterator[tuple[int, Any]]:
    """Yield ``(line number, JSON value)``: JSONL lines, or the items of a top-level array."""
    first = stream.readline()
    line_no = 1
    while first and not first.strip():
        first = stream.readline()
        line_no += 1
    if not first:
        return
    try:
        value = _loads(first, path, line_no)
    except InputError:
        head = first.lstrip()[:1]
        if head == "[":
            yield from _array_items(first, stream, path, line_no)
            return
        if head != "{":
            raise
        # one document over many lines (a pretty-printed trajectory): decoded once, whole
        yield line_no, _document(first + stream.read(), path, line_no)
        return
    messages = isinstance(value, list) and all(isinstance(v, dict) and "role" in v for v in value)
    if (
        isinstance(value, list)
        and value
        and not messages
        and all(isinstance(v, (list, dict)) for v in value)
    ):
        # one line holding transcripts or events: each let go once read (taken from the end
        # of the reversed list), so that its memory serves the next ones' audits
        value.reverse()
        while value:
            yield line_no, value.pop()
    else:
        yield line_no, value
    scan = _scan_once
    for line in stream:
        line_no += 1
        # the common line, one JSON value and its newline, decoded here: a call of
        # :func:`_loads` per line costs a tenth of reading a short message
        try:
            value, end = scan(line, 0)
        except (StopIteration, ValueError, RecursionError):
            pass
        else:
            if line[end:] == "\n":  # (the value ends at the line's end: one comparison)
                yield line_no, value
                continue
        if line.isspace():  # a line read from a file is never empty: this is ``not strip()``
            continue
        yield line_no, _loads(line, path, line_no)


#: the C scanner ``json.loads`` runs, called directly: a JSONL line of one short message spends
#: as long in ``loads``'s Python layers (and its whitespace regexes) as in the scanner
#: (``scan_once`` is set by ``JSONDecoder.__init__``; typeshed does not declare it)
_scan_once: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _loads(text: str, path: str, line_no: int) -> Any:
    """One JSON value, or an :class:`InputError` naming the line (too deep included)."""
    try:
        value, end = _scan_once(text, 0)
    except (StopIteration, ValueError, RecursionError):
        pass  # leading whitespace, or no JSON: json.loads decides, and words the error
    else:
        if end == len(text) or not text[end:].strip(" \t\n\r"):  # JSON's own whitespace
            return value
    try:
        return json.loads(text)
    except RecursionError:
        raise InputError(f"{path}:{line_no}: JSON nested too deep to read") from None
    except ValueError as exc:
        raise InputError(f"{path}:{line_no}: invalid JSON ({exc})") from None


def _document(text: str, path: str, line_no: int) -> Any:
    """A JSON document of many lines; an error names the line it is on."""
    try:
        return json.loads(text)
    except RecursionError:
        raise InputError(f"{path}:{line_no}: JSON nested too deep to read") from None
    except json.JSONDecodeError as exc:
        where = f"{path}:{line_no + exc.lineno - 1}"
        raise InputError(f"{where}: invalid JSON ({exc.msg}: column {exc.colno})") from None
    except ValueError as exc:  # a number too long to read
        raise InputError(f"{path}:{line_no}: invalid JSON ({exc})") from None


def _array_items(  # noqa: PLR0915 - one pass per item, kept flat: a helper call is per item
    head: str, stream: IO[str], path: str, line_no: int
) -> Iterator[tuple[int, Any]]:
    """Decode a JSON array spread over many lines item by item; an array of messages that
    keeps its items whole on their lines, a buffer's whole lines at a time (:func:`_objects`).

    Linear in the file's size however its items are laid out: an item that does not decode
    yet is retried only after the buffer has grown by twice its size (so an item is decoded at
    most a few times over, not once per chunk read), and the buffer is read by position, not
    sliced after every item; the first run of lines that is not whole items ends the reading
    by lines (so no text is decoded that way twice). The buffer holds at most a few times the
    largest item.
    """
    decoder = json.JSONDecoder()
    buf = head[head.index("[") + 1 :]
    pos = 0
    counted = 0  # the buffer's newlines before this position are counted in line_no
    eof = False
    as_messages: bool | None = None
    pending: list[Any] = []
    whole_lines = True  # whether the messages are still read a run of whole lines at a time
    skip = _BETWEEN.match
    while True:
        pos = skip(buf, pos).end()  # type: ignore[union-attr]  # (it matches "" at least)
        head = buf[pos : pos + 1]  # ("" at the buffer's end: one slice for both tests)
        if head == "]":
            break
        if not head:
            line_no += buf.count("\n", counted, pos)
            if eof:
                raise InputError(f"{path}:{line_no}: unterminated JSON array")
            chunk = stream.read(_CHUNK)
            eof = not chunk
            buf, pos, counted = chunk, 0, 0
            continue
        if as_messages and whole_lines and (cut := buf.rfind("\n", pos)) > pos:
            # the messages up to the buffer's last line break, decoded in one call
            run = _objects(buf, pos, cut)
            if run is None:
                whole_lines = False  # the lines cut items (or the array ends): item by item
            else:
                pending += run
                if len(pending) >= _BATCH:
                    # (batches of _BATCH messages still: a batch that holds an item that is no
                    # object, read item by item, is numbered by its last item's line as before;
                    # these hold objects alone, numbered by the run's first line)
                    line_no += buf.count("\n", counted, pos)
                    counted = pos
                    while len(pending) >= _BATCH:
                        yield line_no, Batch(pending[:_BATCH])
                        del pending[:_BATCH]
                pos = cut
                continue
        try:
            # the C scanner itself (``raw_decode`` without its Python layer); a failure is
            # decoded again by ``raw_decode``, for its words
            try:
                item, end = _scan_once(buf, pos)
            except (StopIteration, ValueError):
                item, end = decoder.raw_decode(buf, pos)
        except RecursionError:
            line_no += buf.count("\n", counted, pos)
            raise InputError(f"{path}:{line_no}: JSON nested too deep to read") from None
        except ValueError as exc:
            line_no += buf.count("\n", counted, pos)
            if eof:
                raise InputError(f"{path}:{line_no}: invalid JSON ({exc})") from None
            chunk = stream.read(max(_CHUNK, 2 * (len(buf) - pos)))
            eof = not chunk
            buf, pos, counted = buf[pos:] + chunk, 0, 0
            continue
        if as_messages is None:
            as_messages = isinstance(item, dict) and "role" in item
        if as_messages:
            pending.append(item)  # one transcript: feed messages in bounded batches
            if len(pending) < _BATCH:
                pos = end
                continue
            item, pending = Batch(pending), []
        line_no += buf.count("\n", counted, pos)  # (counted when a line number is given)
        counted = pos
        yield line_no, item
        pos = end
    line_no += buf.count("\n", counted, pos)
    if pending or as_messages:
        yield line_no, Batch(pending)


def _objects(buf: str, start: int, end: int) -> list[Any] | None:
    """The JSON objects between ``start`` (where an item of the array starts) and ``end`` (a
    line break), decoded as one array by json's C scanner; ``None`` unless that text is whole
    items, each an object.

    The items of a JSON array of messages come one or a few to a line, as ``json.dump`` writes
    them: decoding a run of lines in one call costs about half as much as an item at a time (one
    call, and the keys made once: the scanner remembers them within a call). A line break is
    never inside a JSON string, so text that decodes so is a list of whole items, each what the
    item-by-item scan would have read; text that does not (a line break inside an item, the
    array's end, anything that is no JSON) is read item by item, which words any error.
    """
    text = buf[start:end].rstrip(" \t\r\n")
    if text.endswith(","):
        text = text[:-1]
    text = f"[{text}]"
    try:
        run, stop = _scan_once(text, 0)
    except (StopIteration, ValueError, RecursionError):
        return None
    if stop != len(text) or not only_objects(run):
        return None
    return run  # type: ignore[no-any-return]


#: messages fed to the audit at a time from a JSON array file
_BATCH = 256


class Batch(list[Any]):
    """Consecutive messages of the single transcript held by a JSON array file."""
