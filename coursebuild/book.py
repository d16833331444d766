"""The textbook website (``make book``): a Jupyter Book built from the chapters' stored outputs.

``python -m coursebuild.book [--out DIR]`` writes the book's source folder (``DIR/src``: the
chapter pages, ``_config.yml``, ``_toc.yml``, the extra pages) and runs ``jupyter-book
build`` on it, into ``DIR/src/_build/html`` (``DIR`` defaults to ``build/book``). Nothing is
executed at build time.

A chapter page is the learner's notebook (``chapters/NN_slug``: exercise text, stubs, no
hidden test, no model answer) with the outputs of the solution notebook
(``solutions/NN_slug``) put back, matched by cell id, on every cell that is neither an
answer nor a test; the cells that only say hidden tests exist are left out. The chapter
list is :data:`minillm.coursemap.CHAPTERS`: a chapter appears once its notebooks exist.

The other pages are generated too (:mod:`coursebuild.book_pages`): the Tech Band index (from
:data:`minillm.coursemap.TECH_BAND`, each term with the first test under ``tests/`` that
exercises its symbol), the tee errata (each chapter's "Tee check" section and what its
cells measured), the instructor guide (each ``INSTRUCTOR.md`` without its grading guides
for written questions), and docs/grading.md, whose JupyterHub section is the workshop page.

``python -m coursebuild.book --course-map`` prints README's course map table, links to
Colab and Binder included; a test checks that README holds exactly that table. Every link
to the repository is made from ``[project.urls] Repository`` in pyproject.toml.
"""
from __future__ import annotations

import argparse
import copy
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat

from course_runtime import marks
from minillm.coursemap import CHAPTERS, Chapter

from . import colab, paths
from .book_pages import instructor_page, present, tech_band_page, tee_errata_page, workshop_page

OUT = paths.ROOT / "build" / "book"
MATHJAX = paths.ROOT / "autograder" / "vendor" / "mathjax"
GRADING = paths.ROOT / "docs" / "grading.md"
TEMPLATES = Path(__file__).with_name("book_templates")
# The branch whose notebooks Colab and Binder open.
BRANCH = "main"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
HIDDEN_ONLY = "# Hidden tests: they run when your notebook is graded."
# Sections of INSTRUCTOR.md that hold model answers: never on the site.


# ---------------------------------------------------------------- links
def github(root: Path | None = None) -> tuple[str, str]:
    """(owner, name) of the repository, from pyproject.toml's ``[project.urls] Repository``."""
    url = colab.repository(root)
    match = re.fullmatch(r"https://github\.com/([\w.-]+)/([\w.-]+?)(?:\.git)?/?", url)
    if not match:
        raise ValueError(f"[project.urls] Repository must be a https://github.com/OWNER/NAME address, not {url!r}")
    return match.group(1), match.group(2)


def colab_url(slug: str, root: Path | None = None) -> str:
    """Colab opening the learner notebook of ``slug`` from the repository."""
    owner, name = github(root)
    return f"https://colab.research.google.com/github/{owner}/{name}/blob/{BRANCH}/chapters/{slug}/{slug}.ipynb"


def binder_url(slug: str, root: Path | None = None) -> str:
    """Binder building the repository's environment.yml and opening the learner notebook of ``slug``."""
    owner, name = github(root)
    return f"https://mybinder.org/v2/gh/{owner}/{name}/{BRANCH}?labpath=work%2F{slug}%2F{slug}.ipynb"


def launch_links(slug: str) -> str:
    """The Markdown links that open ``slug`` in Colab and in Binder."""
    return f"[Colab]({colab_url(slug)}) · [Binder]({binder_url(slug)})"




def course_map_table() -> str:
    """README's course map: one row per chapter of :data:`CHAPTERS`; Colab and Binder links
    only once the repository has a real address."""
    links = colab.published()
    head = ["ch", "notebook", "topic", "on the tee", "adds to `minillm`", "time"] + ["open in"] * links + ["status"]
    rows = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for entry in CHAPTERS:
        modules = ", ".join(f"`{m.removeprefix('minillm.')}`" for m in entry.modules)
        ready = present(entry)
        cells = [entry.slug[:2], f"`{entry.slug}`", entry.title, entry.tee, modules, f"{entry.minutes} min"]
        cells += [launch_links(entry.slug) if ready else ""] * links + ["ready" if ready else "in preparation"]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


# ---------------------------------------------------------------- chapter pages
def _is_answer_or_test(cell) -> bool:
    meta = cell.metadata.get("nbgrader", {})
    return bool(meta.get("solution") or meta.get("grade"))


def _without_widgets(outputs: list) -> list:
    """Outputs with widget views dropped (their text fallback stays): a widget would need
    JavaScript from a CDN, and a progress bar is no content."""
    kept = []
    for output in outputs:
        output = copy.deepcopy(output)
        data = output.get("data")
        if data is not None:
            data.pop(WIDGET_VIEW, None)
            if not data:
                continue
        kept.append(output)
    return kept


def chapter_page(entry: Chapter):
    """The page of one chapter: the learner's notebook with the outputs of the cells that are
    neither answers nor tests, and the links that open it in Colab and Binder."""
    release = nbformat.read(paths.release_notebook(entry.slug), as_version=4)
    solution = {cell.id: cell for cell in nbformat.read(paths.solution_notebook(entry.slug), as_version=4).cells}
    cells = []
    for cell in release.cells:
        cell = copy.deepcopy(cell)
        if cell.cell_type == "code":
            # The Colab set-up cell clones the repository's address: none to show until it is real.
            if cell.source.strip() == HIDDEN_ONLY or (cell.id == marks.COLAB_SETUP_ID and not colab.published()):
                continue
            source = solution.get(cell.id)
            if source is not None and not _is_answer_or_test(cell) and not _is_answer_or_test(source):
                cell.outputs = _without_widgets(source.outputs)
                cell.execution_count = source.get("execution_count")
        cells.append(cell)
    where = "" if not colab.published() else f"*Open this chapter in* {launch_links(entry.slug)} *(it sets itself up there), or* "
    note = f"{where or '*'}{'r' if where else 'R'}*un it locally with `make lab`.* Time: about {entry.minutes} minutes."
    # Under the chapter's title: the title line of its first cell, or the page's top.
    title, _, rest = cells[0].source.partition("\n") if cells and cells[0].cell_type == "markdown" else ("", "", "")
    if title.startswith("# "):
        cells[0].source = f"{title}\n\n{note}\n{rest}"
    else:
        cells.insert(0, nbformat.v4.new_markdown_cell(note, id="book-launch-links"))
    page = nbformat.v4.new_notebook(cells=cells, metadata={k: v for k, v in release.metadata.items() if k != "widgets"})
    return page


def index_page(pages: dict[str, object]) -> str:
    links = colab.published()
    lines = ["# The Transformer, one component at a time", "",
             "A Jupyter textbook and exercise course on how large language models work, from the 2017 "
             "Transformer to DPO. Each chapter teaches one component, with the maths, the code, figures "
             "and graded exercises; the code a learner writes becomes part of `minillm`, a small, real, "
             "tested LLM package. These pages show each chapter as a learner gets it, with the outputs of "
             "a full run: the exercises are left for you.", "",
             "| ch | chapter | on the tee | time |" + " open in |" * links, "|" + " --- |" * (4 + links)]
    for entry in CHAPTERS:
        if entry.slug in pages:
            lines.append(f"| {entry.slug[:2]} | [{entry.title}](chapters/{entry.slug}.ipynb) | {entry.tee} | "
                         f"{entry.minutes} min |" + f" {launch_links(entry.slug)} |" * links)
        else:
            lines.append(f"| {entry.slug[:2]} | {entry.title} (in preparation) | {entry.tee} | {entry.minutes} min |"
                         + " |" * links)
    lines += ["", "Also here: [the Tech Band index](tech_band.md), [the tee errata](tee_errata.md), "
              "[the instructor guide](instructor.md), [running a workshop](workshop.md) and "
              "[grading](grading.md).", ""]
    return "\n".join(lines)


CONFIG = """\
# Generated by `make book` (coursebuild/book.py).
title: "The Transformer, one component at a time"
author: "minillm-course"
copyright: "2026"
only_build_toc_files: true
execute:
  execute_notebooks: "off"
parse:
  myst_enable_extensions: [colon_fence, dollarmath]
html:
  use_repository_button: false
  use_edit_page_button: false
  use_issues_button: false
sphinx:
  local_extensions:
    book_assets: {extensions}
  config:
    # MathJax from the repository's copy (autograder/vendor/mathjax), under _static/.
    mathjax_path: mathjax/tex-svg.js
    html_static_path: [_static]
    # Links to a chapter's sections (the Tech Band index) name the heading's anchor.
    myst_heading_anchors: 4
    # $$...$$ inside a paragraph or a list item, as JupyterLab renders it.
    myst_dmath_double_inline: true
    # Text as written: no curly quotes, so the pages say what the notebooks say.
    smartquotes: false
    # Long names in code (a test's full name) wrap inside a table's cell.
    html_css_files: [book.css]
    # Two of the theme's buttons, named as axe's WCAG 2.1 checks ask (coursebuild/book_templates).
    templates_path: [{templates}]
    # Widgets would need JavaScript from a CDN; their outputs are dropped.
    nb_ipywidgets_js: {{}}
    # Without a default colour mode the theme logs an error on every page (its layout reads
    # this template variable; sphinx-book-theme does not take it as a theme option).
    html_context:
      default_mode: light
    html_theme_options:
      use_download_button: false
      use_fullscreen_button: false
"""


CSS = (
    # A long name or address in code (a test's full name, a URL) wraps inside the column.
    "code.literal, code.literal span.pre { white-space: normal; overflow-wrap: anywhere; }\n"
    # A display equation wider than the column scrolls in its own box (the theme's overflow:
    # auto on both axes would also show a vertical scrollbar); its tabindex reaches it by keyboard.
    'mjx-container[display="true"] { max-width: 100%; overflow-x: auto; overflow-y: hidden; }\n'
)


def toc(pages: dict[str, object]) -> str:
    lines = ["# Generated by `make book` (coursebuild/book.py).", "format: jb-book", "root: index", "parts:",
             "  - caption: Chapters", "    chapters:"]
    lines += [f"      - file: chapters/{slug}" for slug in pages]
    lines += ["  - caption: Reference", "    chapters:"]
    lines += [f"      - file: {name}" for name in ("tech_band", "tee_errata", "instructor", "workshop", "grading")]
    return "\n".join(lines) + "\n"


def write_source(src: Path) -> dict[str, object]:
    """Write the book's source folder; the chapter pages by slug."""
    if src.exists():
        shutil.rmtree(src)
    (src / "chapters").mkdir(parents=True)
    pages = {entry.slug: chapter_page(entry) for entry in CHAPTERS if present(entry)}
    for slug, page in pages.items():
        nbformat.write(page, src / "chapters" / f"{slug}.ipynb")
    texts = {"index.md": index_page(pages), "tech_band.md": tech_band_page(), "tee_errata.md": tee_errata_page(pages),
             "instructor.md": instructor_page(), "workshop.md": workshop_page(),
             "grading.md": GRADING.read_text(encoding="utf-8"), "_config.yml": CONFIG.format(extensions=json.dumps(str(Path(__file__).parent)),
                                                                   templates=json.dumps(str(TEMPLATES))), "_toc.yml": toc(pages)}
    for name, text in texts.items():
        (src / name).write_text(text, encoding="utf-8")
    shutil.copytree(MATHJAX, src / "_static" / "mathjax")
    (src / "_static" / "book.css").write_text(CSS, encoding="utf-8")
    return pages


def jupyter_book() -> str:
    """The ``jupyter-book`` of this Python's environment."""
    script = Path(sys.executable).with_name("jupyter-book")
    if not script.exists():
        raise FileNotFoundError(f"{script} not found: jupyter-book is a test dependency (make venv installs it)")
    return str(script)


def build(out: Path = OUT) -> Path:
    """Write the source into ``out/src`` and build the site; the folder of its HTML. Sphinx's
    warnings are printed and kept in ``out/warnings.txt``."""
    src = out / "src"
    write_source(src)
    run = subprocess.run([jupyter_book(), "build", "--quiet", "--keep-going", str(src)],
                         capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"jupyter-book build failed:\n{run.stdout[-4000:]}\n{run.stderr[-4000:]}")
    warnings = [line for line in (run.stdout + run.stderr).splitlines() if "WARNING" in line or "ERROR" in line]
    (out / "warnings.txt").write_text("".join(f"{line}\n" for line in warnings), encoding="utf-8")
    for line in warnings:
        print(line, file=sys.stderr)
    return src / "_build" / "html"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m coursebuild.book", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help="where to build (default build/book)")
    parser.add_argument("--course-map", action="store_true", help="print README's course map table and stop")
    args = parser.parse_args(argv)
    if args.course_map:
        print(course_map_table(), end="")
        return 0
    start = time.perf_counter()
    html = build(args.out.resolve())
    print(f"built {html / 'index.html'} in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
