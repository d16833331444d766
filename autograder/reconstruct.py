"""Trusted reconstruction: the graded notebook is rebuilt from the master.

Only the learner's answer cells (code answers and written answers) are taken from the
submission, looked up by ``grade_id``. Everything else, the test cells, their points, the
notebook's metadata and every output, comes from the master. A deleted, edited or re-typed
test cell, a duplicated or renamed ``grade_id`` or inflated points therefore change
nothing, and each is reported as a flag.
"""
from __future__ import annotations

import copy
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from .bounded import bounded
from .chapters import Chapter

MAX_NOTEBOOK_BYTES = 32 * 2**20
MAX_ANSWER_CHARS = 200_000
MAX_CELLS = 2000  # 20 times the longest chapter: cells past these are not read
PARSE_SECONDS = 30.0  # a 32 MiB notebook parses in about a second


class SubmissionError(ValueError):
    """The submission cannot be graded at all; the message says why, for the learner."""


def flag(kind: str, detail: str, cell: str | None = None) -> dict:
    entry = {"kind": kind, "detail": detail}
    if cell:
        entry["cell"] = cell
    return entry


def _text(value) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "".join(value)
    return None


def read_submission(path: Path) -> bytes:
    """The bytes of a submitted file, which must be a regular file (never a link followed,
    a pipe that blocks, or more than :data:`MAX_NOTEBOOK_BYTES` read)."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as error:
        why = "it is a symbolic link" if path.is_symlink() else error.strerror
        raise SubmissionError(f"{path.name} cannot be read: {why}") from None
    with os.fdopen(fd, "rb") as stream:
        info = os.fstat(stream.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise SubmissionError(f"{path.name} is not a regular file, so it was not read")
        data = stream.read(MAX_NOTEBOOK_BYTES + 1)
    if len(data) > MAX_NOTEBOOK_BYTES:
        raise SubmissionError(f"{path.name} is more than {MAX_NOTEBOOK_BYTES // 2**20} MiB; a notebook may be at "
                              "most that (clear large outputs and submit again)")
    return data


def read_cells(data: bytes, name: str) -> tuple[list[dict], int]:
    """The cells of a submitted notebook, read leniently but safely, and how many it has.

    Only what grading needs is read: each cell's type, source and ``grade_id``, of the first
    :data:`MAX_CELLS` cells. Anything else in the file is ignored. The file is parsed in a
    bounded child (:func:`autograder.bounded.bounded`, :data:`PARSE_SECONDS` and a memory
    limit): parsed, 32 MiB of small JSON objects take a gigabyte, which must never be the
    grader's. Raises :class:`SubmissionError` with a reason.
    """
    [(ok, read)] = bounded({"cells": lambda: _parse_cells(data, name)}, seconds=PARSE_SECONDS).values()
    if not ok:
        raise SubmissionError(f"{name} is not a readable notebook: {read}")
    if "error" in read:
        raise SubmissionError(read["error"])
    return read["cells"], read["total"]


def _parse_cells(data: bytes, name: str) -> dict:
    """In the bounded child: ``{"cells": [...], "total": N}``, or ``{"error": why}``."""
    try:
        cells, total = _cells_of(data, name)
    except SubmissionError as error:
        return {"error": str(error)}
    return {"cells": cells, "total": total}


def _cells_of(data: bytes, name: str) -> tuple[list[dict], int]:
    if len(data) > MAX_NOTEBOOK_BYTES:
        raise SubmissionError(f"{name} is {len(data) / 2**20:.0f} MiB; a notebook may be at most "
                              f"{MAX_NOTEBOOK_BYTES // 2**20} MiB (clear large outputs and submit again)")
    try:
        notebook = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise SubmissionError(f"{name} is not a readable notebook: it is not UTF-8 text ({error.reason} "
                              f"at byte {error.start})") from None
    except json.JSONDecodeError as error:
        raise SubmissionError(f"{name} is not a readable notebook: its JSON is malformed ({error.msg} at "
                              f"line {error.lineno}, column {error.colno})") from None
    except RecursionError:
        raise SubmissionError(f"{name} is not a readable notebook: its JSON is nested too deeply") from None
    if not isinstance(notebook, dict) or not isinstance(notebook.get("cells"), list):
        raise SubmissionError(f"{name} is not a readable notebook: it has no list of cells "
                              "(is it a Jupyter notebook in format 4?)")
    cells = []
    for position, cell in enumerate(notebook["cells"][:MAX_CELLS]):
        if not isinstance(cell, dict):
            continue
        source = _text(cell.get("source", ""))
        meta = cell.get("metadata") if isinstance(cell.get("metadata"), dict) else {}
        nbgrader = meta.get("nbgrader") if isinstance(meta.get("nbgrader"), dict) else {}
        grade_id = nbgrader.get("grade_id") if isinstance(nbgrader.get("grade_id"), str) else None
        cells.append({
            "position": position,
            "cell_type": cell.get("cell_type") if isinstance(cell.get("cell_type"), str) else None,
            "source": source,
            "grade_id": grade_id,
            "points": nbgrader.get("points"),
        })
    return cells, len(notebook["cells"])


@dataclass
class Reconstruction:
    """The graded notebook and what was taken from the submission."""

    chapter: Chapter
    notebook: nbformat.NotebookNode  # the learner's view with the learner's answers
    answers: dict[str, str | None]   # grade_id → the learner's source (None: missing)
    status: dict[str, str]           # grade_id → answered | unanswered | missing
    flags: list[dict] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)  # grade_id → why it scores nothing

    def answered(self, grade_id: str) -> bool:
        return self.status.get(grade_id) == "answered"

    def exported(self) -> dict[str, str]:
        """The answers the grader exports into the package its kernels see: those given and
        not withheld (:mod:`autograder.view`)."""
        return {grade_id: source for grade_id, source in self.answers.items()
                if source and self.answered(grade_id) and grade_id not in self.reasons}


def _normal(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


def reconstruct(chapter: Chapter, data: bytes, name: str = "the notebook") -> Reconstruction:
    """Rebuild ``chapter``'s notebook with the answers found in ``data`` (a submission)."""
    cells, total = read_cells(data, name)
    flags: list[dict] = []
    if total > len(cells):
        flags.append(flag("too-many-cells", f"the notebook has {total:,} cells; only the first {len(cells):,} are "
                          "read"))
    by_id: dict[str, list[dict]] = {}
    for cell in cells:
        if cell["grade_id"]:
            by_id.setdefault(cell["grade_id"], []).append(cell)
    master_ids = set(chapter.by_id)
    answer_ids = [c.grade_id for c in chapter.cells if c.kind in ("answer", "written")]

    for grade_id, found in by_id.items():
        if len(found) > 1:
            flags.append(flag("duplicate-grade-id", f"{len(found)} cells carry grade_id {grade_id!r}; "
                              "only the first is read", grade_id))
        if grade_id not in master_ids:
            flags.append(flag("unknown-grade-id", f"a cell carries grade_id {grade_id!r}, which this chapter "
                              "does not have; it is ignored", grade_id))
    known = {_normal(c.learner_source) for c in chapter.cells if c.cell_type == "code" and not c.grade_id}
    extra = sum(1 for c in cells if not c["grade_id"] and c["cell_type"] == "code"
                and (c["source"] or "").strip() and _normal(c["source"] or "") not in known)
    if extra:
        flags.append(flag("extra-cells-ignored", f"{extra} code cell(s) you added or changed outside the answer "
                          "cells are not graded: only the answer cells are read, so put helper code inside an "
                          "answer cell"))

    answers: dict[str, str | None] = {}
    status: dict[str, str] = {}
    reasons: dict[str, str] = {}
    for cell in chapter.cells:
        gid = cell.grade_id
        if cell.is_test:
            found = by_id.get(gid, [])
            if not found:
                flags.append(flag("test-cell-missing", f"test cell {gid!r} is missing from the submission; "
                                  "the master's test is run", gid))
            else:
                if found[0]["source"] is None or _normal(found[0]["source"]) != _normal(cell.learner_source):
                    flags.append(flag("test-cell-edited", f"test cell {gid!r} was edited; the master's "
                                      "test is run", gid))
                if found[0]["points"] is not None and found[0]["points"] != cell.points and not (
                        isinstance(found[0]["points"], (int, float)) and float(found[0]["points"]) == cell.points):
                    flags.append(flag("points-altered", f"test cell {gid!r} claims {found[0]['points']!r} "
                                      f"points; it is worth {cell.points:g}", gid))
            continue
        if gid not in answer_ids:
            continue
        found = [c for c in by_id.get(gid, []) if c["cell_type"] == cell.cell_type]
        if not found:
            answers[gid], status[gid] = None, "missing"
            wrong_type = by_id.get(gid)
            reasons[gid] = (f"answer cell {gid!r} is missing from the submission"
                            + (f" (a {wrong_type[0]['cell_type']} cell carries its grade_id; it must be a "
                               f"{cell.cell_type} cell)" if wrong_type else " (deleted, or its grade_id changed)"))
            flags.append(flag("missing-answer", reasons[gid], gid))
            continue
        source = found[0]["source"]
        if source is None:
            answers[gid], status[gid] = None, "missing"
            reasons[gid] = f"answer cell {gid!r} has no readable source"
            flags.append(flag("missing-answer", reasons[gid], gid))
        elif len(source) > MAX_ANSWER_CHARS:
            answers[gid], status[gid] = None, "missing"
            reasons[gid] = f"answer cell {gid!r} holds {len(source):,} characters; at most {MAX_ANSWER_CHARS:,} are read"
            flags.append(flag("answer-too-large", reasons[gid], gid))
        else:
            answers[gid] = source
            unanswered = _normal(source) == _normal(cell.learner_source)
            status[gid] = "unanswered" if unanswered else "answered"
            if unanswered:
                reasons[gid] = (f"not answered yet: answer cell {gid!r} still holds the starting code"
                                if cell.kind == "answer" else f"written answer {gid!r} is not answered yet")

    if not any(status.get(g) in ("answered", "unanswered") for g in answer_ids):
        elsewhere = sorted(g for g in by_id if g not in master_ids)
        flags.append(flag("wrong-chapter", f"none of {chapter.slug}'s answer cells is in this notebook"
                          + (f"; its cells carry grade_ids of another notebook ({', '.join(elsewhere[:4])})"
                             if elsewhere else "")))

    _check_reference_use(chapter, answers, status, flags, reasons)

    notebook = copy.deepcopy(chapter.learner)
    for cell, master_cell in zip(notebook.cells, chapter.cells):
        if master_cell.grade_id in answers and answers[master_cell.grade_id] is not None:
            cell.source = answers[master_cell.grade_id]
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return Reconstruction(chapter, notebook, answers, status, flags, reasons)


def _check_reference_use(chapter: Chapter, answers: dict, status: dict, flags: list, reasons: dict) -> None:
    """Flag answers that reach the chapter's reference; withhold an exercise whose answer is
    the reference, or whose source cannot be analyzed within the analysis's bounds (then
    nothing shows that it is the learner's own)."""
    todo = {cell.grade_id: answers[cell.grade_id] for cell in chapter.answers
            if answers.get(cell.grade_id) and status[cell.grade_id] == "answered"}
    chapter.reference_uses(chapter.answers[0].grade_id, "")  # the master's side, analyzed once, before forking
    found = bounded({gid: (lambda gid=gid, source=source: chapter.reference_uses(gid, source))
                              for gid, source in todo.items()})
    for gid in todo:
        ok, value = found[gid]
        if not ok:
            reasons[gid] = (f"answer cell {gid!r} could not be analyzed ({value}): nothing shows that it is your own "
                            "code rather than the course's reference, so its checks score nothing; simplify the cell")
            flags.append(flag("not-analyzable", reasons[gid], gid))
            continue
        for own, detail in value:
            flags.append(flag("reference-use" if own else "reference-nearby", f"answer cell {gid!r} {detail}", gid))
            if own and gid not in reasons:
                reasons[gid] = (f"answer cell {gid!r} {detail}: it uses the course's reference implementation "
                                "instead of your own code, so its checks score nothing")
