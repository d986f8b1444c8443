"""Notes beside a replay's answer, typed by what they are about.

A replay collects notes from several places (the file's sidecar, the capacity decision, the
trace's shape, the ranking). Each carries a :class:`NoteKind`, so a consumer keeps one note per
kind and topic, or leaves a kind out, by its kind and never by matching its words.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass


class NoteKind(enum.Enum):
    """What a note is about."""

    SOURCE = "source"  # where the replay's facts came from (a sidecar, an option)
    CAPACITY = "capacity"  # the device's memory, the memory outside PyTorch, the limit
    SETTINGS = "settings"  # the settings a row replays, or why one is not ranked
    START = "start"  # where the replay starts (a trace recorded mid-run)
    PARTIAL = "partial"  # the trace lost its oldest entries
    WINDOW = "window"  # the recording ends at the OOM that ended the program
    EMPTY_CACHE = "empty cache"  # empty_cache() calls inferred or ambiguous
    TIMING = "timing"  # GPU timing and the recorded CPU's pace
    MODEL = "model"  # how far the replay reproduces the recording
    ESTIMATE = "estimate"  # a dry run's gaps


@dataclass(frozen=True)
class Note:
    """One note: its kind and its sentence."""

    kind: NoteKind
    text: str

    def __str__(self) -> str:
        return self.text


def unique(notes: Iterable[Note]) -> tuple[Note, ...]:
    """``notes`` in order, each sentence once."""
    seen: set[str] = set()
    out: list[Note] = []
    for note in notes:
        if note.text not in seen:
            seen.add(note.text)
            out.append(note)
    return tuple(out)

