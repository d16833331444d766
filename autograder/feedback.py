"""HTML feedback for a graded notebook that never shows hidden test code."""
from __future__ import annotations

import html
import re

import nbformat
from nbconvert import HTMLExporter

HIDDEN = re.compile(r"### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS\n?", re.S)
KEPT_OUTPUT_TYPES = ("text/plain", "image/png")


def _sanitize(cell, hidden: bool) -> None:
    if hidden:
        cell.source = HIDDEN.sub("", cell.source).rstrip()
    if cell.cell_type != "code":
        return
    kept = []
    for output in cell.outputs:
        if output.output_type == "error":
            # No traceback: it would quote the hidden test's code.
            kept.append(nbformat.v4.new_output("stream", name="stderr", text=f"{output.ename}: {output.evalue}\n"))
        elif output.output_type == "stream":
            kept.append(output)
        elif "data" in output:
            data = {k: v for k, v in output.data.items() if k in KEPT_OUTPUT_TYPES}
            if data:
                kept.append(nbformat.v4.new_output("display_data", data=data))
    cell.outputs = kept


def render(notebook, results: dict) -> str:
    """The feedback page: a score table, then the notebook with hidden tests removed."""
    notebook = nbformat.from_dict(notebook)
    for cell in notebook.cells:
        _sanitize(cell, hidden="### BEGIN HIDDEN TESTS" in cell.source)
    exporter = HTMLExporter(template_name="lab", sanitize_html=True, exclude_input_prompt=True)
    body, _ = exporter.from_notebook_node(notebook)
    rows = "".join(
        f"<tr><td>{html.escape(t['name'])}</td><td>{t['score']:g} / {t['max_score']:g}</td>"
        f"<td>{html.escape(t['status'])}</td><td><pre>{html.escape(t['output'])}</pre></td></tr>"
        for t in results["tests"]
    )
    summary = (
        f"<section id='grading-summary'><h1>{html.escape(results['output'])}</h1>"
        f"<table border='1' cellpadding='4'><tr><th>check</th><th>points</th><th>status</th>"
        f"<th>why</th></tr>{rows}</table></section>"
    )
    return _insert(body, summary)


def _insert(page: str, summary: str) -> str:
    match = re.search(r"<body[^>]*>", page)
    if not match:
        return summary + page
    return page[: match.end()] + summary + page[match.end():]
