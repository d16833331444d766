"""The test cells of a chapter, built from its source, for tests that run them on wrong answers."""
import pytest

from coursebuild import notebooks


def cell_sources(slug: str) -> dict[str, str]:
    """grade_id -> source of each visible and hidden test cell of ``slug``'s chapter source."""
    return {cell.metadata["nbgrader"]["grade_id"]: cell.source for cell in notebooks.build_notebook(slug).cells
            if cell.metadata.get("nbgrader", {}).get("grade_id", "").endswith(("_visible", "_hidden"))}


def failure_of(run_cell, *args, **answers) -> str:
    """The message with which ``run_cell(*args, **answers)`` fails a check."""
    with pytest.raises(AssertionError) as caught:  # CheckFailed is an AssertionError
        run_cell(*args, **answers)
    return str(caught.value)
