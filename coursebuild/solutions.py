"""The solutions as read-only web pages (``make solutions``): ``build/solutions/index.html``.

Each chapter's solution notebook, shown with the outputs it was executed with (nothing
runs), as one page; an index links them in course order. MathJax is the repository's copy,
beside the pages, so they open from the file system with no network. A learner's lab is
rooted at ``work/``, where no solution lies: these pages are how a learner reads one.

``python -m coursebuild.solutions [--out DIR]`` builds them and prints the index's path.
"""
from __future__ import annotations

import argparse
import html
import shutil
from pathlib import Path

import nbformat

from autograder import feedback
from minillm.coursemap import CHAPTERS

from . import paths

OUT = paths.ROOT / "build" / "solutions"
MATHJAX = "mathjax/tex-svg.js"


def page(slug: str) -> str:
    """The HTML of one chapter's solution notebook, from its stored outputs."""
    notebook = nbformat.read(paths.solution_notebook(slug), as_version=4)
    body, _ = feedback.exporter().from_notebook_node(notebook, resources={"metadata": {"name": f"{slug} (solutions)"}})
    return feedback.with_vendored_mathjax(body, src=MATHJAX)


def index(slugs: list[str]) -> str:
    titles = {entry.slug: entry.title for entry in CHAPTERS}
    items = "\n".join(f'<li><a href="{slug}.html">{slug[:2]} · {html.escape(titles.get(slug, slug))}</a></li>'
                      for slug in slugs)
    return ("<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>minillm: solutions</title></head>\n"
            "<body><h1>Solutions</h1>\n<p>Each chapter's solution notebook, as it was executed. "
            "Try the exercises first: your own notebooks are in <code>work/</code>.</p>\n"
            f"<ol>\n{items}\n</ol></body></html>\n")


def build(out: Path = OUT, slugs: list[str] | None = None) -> Path:
    """Write the pages of ``slugs`` (default: every chapter present) into ``out``; returns the index."""
    slugs = paths.present_slugs() if slugs is None else slugs
    out = Path(out)
    (out / "mathjax").mkdir(parents=True, exist_ok=True)
    for name in ("tex-svg.js", "LICENSE"):
        shutil.copyfile(feedback.MATHJAX.with_name(name), out / "mathjax" / name)
    for slug in slugs:
        (out / f"{slug}.html").write_text(page(slug), encoding="utf-8")
    target = out / "index.html"
    target.write_text(index(slugs), encoding="utf-8")
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m coursebuild.solutions", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help="the folder to write (default: build/solutions)")
    args = parser.parse_args(argv)
    print(f"solutions: open {build(args.out)} in a browser")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
