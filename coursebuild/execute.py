"""Execute a notebook with nbclient, in full or quick mode."""
from __future__ import annotations

import copy
import os
from contextlib import contextmanager
from pathlib import Path

import nbclient


@contextmanager
def _environment(quick: bool):
    saved = os.environ.get("COURSE_QUICK")
    if quick:
        os.environ["COURSE_QUICK"] = "1"
    else:
        os.environ.pop("COURSE_QUICK", None)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("COURSE_QUICK", None)
        else:
            os.environ["COURSE_QUICK"] = saved


def execute(notebook, workdir: Path, *, quick: bool, timeout: int = 600):
    """Run every cell of ``notebook`` (in place) with ``workdir`` as the current directory.

    Cells tagged ``raises-exception`` may fail; any other error stops with
    ``nbclient.exceptions.CellExecutionError``.
    """
    metadata = copy.deepcopy(notebook.metadata)
    with _environment(quick):
        client = nbclient.NotebookClient(
            notebook,
            timeout=timeout,
            kernel_name="python3",
            record_timing=False,
            resources={"metadata": {"path": str(workdir)}},
        )
        client.execute()
    # The kernel's language_info and the widget state (tqdm's bars) vary from run to run
    # and are of no use once the kernel is gone: keep the notebook's own metadata.
    notebook.metadata = metadata
    return notebook
