"""HTML feedback for a graded notebook: never hidden test code, outputs sanitized.

The page shows a table of the checks (points and the reason for each lost point), the
flags, then the learner's notebook as it ran in the sandbox. Test cells show the learner's
view (a hidden test is only its comment) and the verdict the judge reached, never what
the learner's own kernel printed for them. Outputs keep plain text and PNG images only;
HTML, JavaScript, SVG and the like are dropped (text is escaped by nbconvert's templates),
and the learner's written answers are shown as plain text, never rendered as HTML.
"""
from __future__ import annotations

import base64
import binascii
import copy
import functools
import html
import io
import re
import warnings
from pathlib import Path

import nbformat

from course_runtime import marks

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
HIDDEN = re.compile(rf"{re.escape(marks.HIDDEN_BEGIN)}.*?({re.escape(marks.HIDDEN_END)}\n?|\Z)", re.S)
MAX_TEXT = 20_000
MAX_IMAGE = 2 * 2**20          # base64 characters of one submitted image
MAX_PIXELS = 4096 * 4096       # an image larger than this is dropped, never decoded


def _text(value) -> str:
    if isinstance(value, list):
        value = "".join(str(v) for v in value)
    return ANSI.sub("", str(value))[:MAX_TEXT]


def reencoded_image(value) -> str | None:
    """A submitted ``image/png`` or ``image/jpeg`` output (base64) decoded, parsed and
    encoded again as a fresh PNG (base64); None when it is not a valid, reasonably sized
    PNG or JPEG. Nothing of the submitted bytes but the pixels survives."""
    from PIL import Image

    data = ("".join(str(v) for v in value) if isinstance(value, list) else str(value)).strip()
    if len(data) > MAX_IMAGE:
        return None
    try:
        raw = base64.b64decode(data.replace("\n", ""), validate=True)
    except (binascii.Error, ValueError):
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(raw), formats=["PNG", "JPEG"]) as image:
                if image.width * image.height > MAX_PIXELS:
                    return None
                image.load()
                pixels = image.convert("RGBA" if "A" in image.getbands() or "transparency" in image.info else "RGB")
        encoded = io.BytesIO()
        pixels.save(encoded, format="PNG")
    except Exception:  # noqa: BLE001 - whatever the decoder makes of it, it is not an image we show
        return None
    return base64.b64encode(encoded.getvalue()).decode("ascii")


def sanitize_outputs(outputs) -> list:
    kept = []
    for output in outputs or []:
        kind = output.get("output_type")
        if kind == "error":
            kept.append(nbformat.v4.new_output("stream", name="stderr",
                                               text=f"{_text(output.get('ename'))}: {_text(output.get('evalue'))}\n"))
        elif kind == "stream":
            kept.append(nbformat.v4.new_output("stream", name="stderr" if output.get("name") == "stderr" else "stdout",
                                               text=_text(output.get("text", ""))))
        elif kind in ("display_data", "execute_result"):
            data = output.get("data", {})
            keep = {}
            image = next((reencoded_image(data[kind]) for kind in ("image/png", "image/jpeg") if kind in data), None)
            if image is not None:
                keep["image/png"] = image
            elif "text/plain" in data:
                keep["text/plain"] = _text(data["text/plain"])
            if keep:
                kept.append(nbformat.v4.new_output("display_data", data=keep))
    return kept


def _verdict_outputs(test: dict, verdict: dict | None, visible: bool) -> list:
    outputs = []
    if visible and verdict and verdict.get("stdout"):
        outputs.append(nbformat.v4.new_output("stream", name="stdout", text=_text(verdict["stdout"])))
    mark = (f"✓ {test['name']}: passed ({test['score']:g} / {test['max_score']:g})" if test["status"] == "passed"
            else f"✗ {test['name']}: {test['score']:g} / {test['max_score']:g}: {test['output']}")
    outputs.append(nbformat.v4.new_output("stream", name="stdout" if test["status"] == "passed" else "stderr",
                                          text=_text(mark) + "\n"))
    return outputs


def as_plain_text(text: str, heading: str = "", limit: int = MAX_TEXT) -> str:
    """Markdown that shows ``text`` verbatim, never as HTML: a fenced code block whose fence
    is longer than any run of backticks in ``text``, so nothing in it can close the block.
    ``heading`` (trusted markdown) goes above it; past ``limit`` characters ``text`` is cut."""
    text = ANSI.sub("", str(text))[:limit].replace("\x00", "\ufffd")
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    block = f"{fence}text\n{text}\n{fence}"
    return f"{heading}\n\n{block}" if heading else block


def display_notebook(chapter, notebook, results: dict, verdicts: dict | None) -> nbformat.NotebookNode:
    """The learner's notebook as shown in the feedback (learner's view, judge's verdicts)."""
    shown = copy.deepcopy(notebook)
    tests = {t["name"]: t for t in results["tests"]}
    for cell, master in zip(shown.cells, chapter.cells):
        cell.metadata = nbformat.from_dict({k: v for k, v in cell.metadata.items() if k in ("nbgrader", "tags")})
        if master.is_test:
            cell.source = HIDDEN.sub("", master.learner_source).rstrip()
            cell.outputs = _verdict_outputs(tests[master.grade_id], (verdicts or {}).get(master.index),
                                            master.kind == "visible")
        elif cell.cell_type == "code":
            cell.outputs = sanitize_outputs(cell.get("outputs"))
        elif master.kind == "written":
            cell.source = as_plain_text(cell.source, f"**Your written answer ({master.grade_id}):**")
            cell.pop("attachments", None)
        else:
            cell.source = master.learner_source
        if cell.cell_type == "code":
            cell.execution_count = None
    shown.metadata = nbformat.from_dict({"kernelspec": chapter.master.metadata.get("kernelspec", {}),
                                         "language_info": {"name": "python"}})
    return shown


def summary_html(results: dict) -> str:
    """The page's summary: the score, a row per check, the written answers, the flags."""
    rows = "".join(
        f"<tr><td>{html.escape(t.get('number', ''))}</td><td>{html.escape(t['name'])}</td>"
        f"<td>{t['score']:g} / {t['max_score']:g}</td><td>{html.escape(t['status'])}</td>"
        f"<td><pre>{html.escape(t['output'])}</pre></td></tr>"
        for t in results["tests"]
    )
    flags = "".join(f"<li><b>{html.escape(str(f.get('kind')))}</b>: {html.escape(str(f.get('detail', '')))}</li>"
                    for f in results["extra_data"].get("flags", []))
    manual = "".join(_manual_line(m) for m in results["extra_data"].get("manual_grading", []))
    return (
        f"<section id='grading-summary' class='learner-text'><h1>{html.escape(results['output'])}</h1>"
        f"<table border='1' cellpadding='4'><tr><th>#</th><th>check</th><th>points</th><th>status</th>"
        f"<th>why</th></tr>{rows}</table>"
        + (f"<h2>Written answers</h2><ul>{manual}</ul>" if manual else "")
        + (f"<h2>Notes from the grader</h2><ul>{flags}</ul>" if flags else "")
        + "</section>"
    )


def _manual_line(item: dict) -> str:
    if item.get("score") is None:
        return f"<li>{html.escape(item['name'])}: {item['max_score']:g} points, graded by hand</li>"
    comment = f"<pre>{html.escape(item['comment'])}</pre>" if item.get("comment") else ""
    return f"<li>{html.escape(item['name'])}: {item['score']:g} / {item['max_score']:g}, graded by hand{comment}</li>"


SUMMARY_SECTION = re.compile(r"<section id='grading-summary'.*?</section>", re.S)


def with_summary(page: str, results: dict) -> str:
    """``page`` (a feedback page this module wrote) with its summary written anew from ``results``."""
    return SUMMARY_SECTION.sub(lambda _: summary_html(results), page, count=1)


def render(chapter, notebook, results: dict, verdicts: dict | None = None) -> str:
    """The feedback page."""
    shown = display_notebook(chapter, notebook, results, verdicts) if notebook is not None else None
    summary = summary_html(results)
    if shown is None:
        return (f"<!DOCTYPE html><html><head><meta charset='utf-8'>{SUMMARY_STYLE}</head>"
                f"<body>{summary}</body></html>")
    body, _ = exporter().from_notebook_node(shown)
    return _insert(with_vendored_mathjax(body), summary)


MATHJAX = Path(__file__).resolve().parent / "vendor" / "mathjax" / "tex-svg.js"
NBCONVERT_MATHJAX = re.compile(r"<!-- Load mathjax -->.*?<!-- End of mathjax configuration -->", re.S)
# Math is typeset in the course's own text only (the master's markdown cells): the summary,
# code and every output are skipped, and MathJax never looks inside <pre> or <code>, where
# written answers are shown.
MATHJAX_CONFIG = """<script>
window.MathJax = {
  tex: {inlineMath: [["$", "$"], ["\\(", "\\)"]], displayMath: [["$$", "$$"], ["\\[", "\\]"]],
        processEscapes: true},
  options: {ignoreHtmlClass: "learner-text|jp-OutputArea|jp-InputArea", processHtmlClass: "jp-RenderedMarkdown"},
  svg: {fontCache: "global"}
};
</script>"""
SUMMARY_STYLE = ("<style>#grading-summary pre {white-space: pre-wrap; overflow-wrap: anywhere; margin: 0}"
                 " #grading-summary td {vertical-align: top}</style>")


@functools.cache
def _mathjax_head() -> str:
    """The vendored MathJax (2 MB), its configuration and the summary's style: read once a process."""
    script = MATHJAX.read_text(encoding="utf-8").replace("</script", "<\\/script")
    return f"{MATHJAX_CONFIG}\n<script>{script}</script>\n{SUMMARY_STYLE}"


def with_vendored_mathjax(page: str, src: str | None = None) -> str:
    """``page`` (nbconvert's HTML) with its MathJax (a CDN) replaced by the vendored copy, and
    without its require.js (a CDN too, which nothing here uses), so that it works offline:
    inline, so the file works on its own, or loaded from ``src``, a path beside the page."""
    page = re.sub(r"<script src=\"https?://[^\"]*require[^\"]*\"></script>", "", page)
    head = _mathjax_head() if src is None else f'{MATHJAX_CONFIG}\n<script src="{html.escape(src)}"></script>'
    page, found = NBCONVERT_MATHJAX.subn(lambda _: head, page, count=1)
    return page if found else page.replace("</head>", head + "</head>", 1)


_EXPORTER = None


def exporter():
    """The notebook-to-HTML exporter of the course's pages (JupyterLab's look, no prompts)."""
    global _EXPORTER
    if _EXPORTER is None:
        from nbconvert import HTMLExporter

        _EXPORTER = HTMLExporter(template_name="lab", exclude_input_prompt=True, exclude_output_prompt=True)
    return _EXPORTER


def _insert(page: str, summary: str) -> str:
    match = re.search(r"<body[^>]*>", page)
    if not match:
        return summary + page
    return page[: match.end()] + summary + page[match.end():]
