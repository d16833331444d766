"""The book's pages beside the chapters: the Tech Band index, the tee errata, the
instructor guide and the workshop page, each generated from the course's own files."""
from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

from minillm.coursemap import CHAPTERS, TECH_BAND, Chapter

from . import paths

TESTS = paths.ROOT / "tests"
GRADING_GUIDE = re.compile(r"^##\s+Written questions?\b", re.I)


def present(entry: Chapter) -> bool:
    """Whether the chapter is written: its learner and solution notebooks exist."""
    return paths.release_notebook(entry.slug).exists() and paths.solution_notebook(entry.slug).exists()



# ---------------------------------------------------------------- Tech Band index
@functools.cache
def _test_functions(path: Path) -> tuple[tuple[str, str], ...]:
    """(name, source) of every test function of a test file, classes' methods as Class::name."""
    text = path.read_text(encoding="utf-8")
    found = []
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
            found.append((node.name, ast.get_source_segment(text, node)))
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            found.extend((f"{node.name}::{item.name}", ast.get_source_segment(text, item)) for item in node.body
                         if isinstance(item, ast.FunctionDef) and item.name.startswith("test"))
    return tuple(found)


def tests_of(symbol: str) -> list[str]:
    """``tests/file.py::test`` of every test that uses ``symbol``'s name, in files that import
    its module (``from minillm.attention import ...``, ``from minillm import attention``).
    Most direct first: tests in the module's own test file (``tests/test_attention.py``),
    then those whose name holds every word of the symbol's name."""
    module, _, attribute = symbol.rpartition(".")
    package, _, leaf = module.rpartition(".")
    imports = re.compile(rf"^\s*(from {re.escape(module)} import|import {re.escape(module)}\b|"
                         rf"from {re.escape(package)} import .*\b{re.escape(leaf)}\b)", re.M)
    uses = re.compile(rf"\b{re.escape(attribute)}\b")
    found = []
    for path in sorted(TESTS.glob("test_*.py")):
        if not imports.search(path.read_text(encoding="utf-8")):
            continue
        found.extend(f"tests/{path.name}::{name}" for name, body in _test_functions(path) if uses.search(body))
    words = [w.lower() for w in re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+", attribute)]

    def directness(test: str) -> tuple[bool, bool]:
        path, _, name = test.partition("::")
        return path != f"tests/test_{leaf}.py", not all(w in name.lower() for w in words)

    return sorted(found, key=directness)


def tech_band_page() -> str:
    lines = ["# The Tech Band index", "",
             "The twenty terms the tee's Tech Band prints: for each, the chapter and section that teach "
             "it, where it lives in `minillm`, and a test of the course's suite that checks it "
             "(the first that uses the symbol, and how many more do).", "",
             "| term | chapter | section | symbol | checked by |", "| --- | --- | --- | --- | --- |"]
    for term in TECH_BAND:
        entry = next(e for e in CHAPTERS if e.slug == term.slug)
        if present(entry):
            chapter = f"[{term.slug[:2]}](chapters/{term.slug}.ipynb \"{entry.title}\")"
            section = f"[{term.section}](chapters/{term.slug}.ipynb#{slugify(term.section)})"
        else:
            chapter, section = f"{term.slug[:2]} (in preparation)", term.section
        tests = tests_of(term.symbol)
        checked = f"`{tests[0]}`" + (f" and {len(tests) - 1} more" if len(tests) > 1 else "") if tests else "no test yet"
        lines.append(f"| {term.term} | {chapter} | {section} | `{term.symbol}` | {checked} |")
    return "\n".join(lines) + "\n"


def slugify(heading: str) -> str:
    """The anchor MyST gives a heading (``myst_heading_anchors``: GitHub's rule)."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


# ---------------------------------------------------------------- tee errata
def tee_checks(page) -> list[tuple[str, str, list[str]]]:
    """A chapter page's "Tee check" sections, wherever in a cell their heading stands: (the
    heading, the text under it, the text its code cells printed), in order."""
    found, current = [], None
    for cell in page.cells:
        if cell.cell_type == "code":
            if current is not None:
                current[2].extend("".join(o.get("text", "")) for o in cell.get("outputs", [])
                                  if o.get("output_type") == "stream")
            continue
        if cell.cell_type != "markdown":
            continue
        for line in cell.source.split("\n"):
            heading = re.match(r"^##\s+(.+)$", line)
            if heading:
                current = None
                if heading.group(1).strip().lower().startswith("tee check"):
                    current = (heading.group(1).strip(), [], [])
                    found.append(current)
            elif current is not None:
                current[1].append(line)
        if current is not None:
            current[1].append("")  # a cell ends a paragraph
    return [(heading, "\n".join(text).strip(), printed) for heading, text, printed in found]


def tee_errata_page(pages: dict[str, object]) -> str:
    lines = ["# Tee errata", "",
             "Where the shirt is loose: each chapter's tee check, the claim on the tee, what is right and "
             "what is not, and what the chapter measured to say so.", ""]
    for entry in CHAPTERS:
        if entry.slug not in pages:
            continue
        for heading, body, printed in tee_checks(pages[entry.slug]):
            lines += [f"## {entry.slug[:2]} · {entry.title}", "", body, ""]
            printed = "".join(printed).strip()
            if printed:
                lines += ["Measured in the chapter:", "", "```text", printed, "```", ""]
            lines += [f"[The tee check in chapter {entry.slug[:2]}](chapters/{entry.slug}.ipynb#{slugify(heading)})", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------- instructor guide
def instructor_notes(slug: str) -> str:
    """``INSTRUCTOR.md`` of a chapter without its grading guides of written questions, its
    headings one level down."""
    kept, skipping = [], False
    for line in (paths.SOLUTIONS / slug / "INSTRUCTOR.md").read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            skipping = bool(GRADING_GUIDE.match(line))
        if skipping:
            continue
        kept.append("#" + line if line.startswith("#") else line)
    return "\n".join(kept).strip() + "\n"


def instructor_page() -> str:
    lines = ["# Instructor guide", "",
             "Per chapter: the session's time, what to demo, where learners get stuck and what to discuss, "
             "from the chapter's `INSTRUCTOR.md`.", "",
             "**Solutions.** The repository is public, solutions included (`solutions/`): in a workshop "
             "learners may peek. For a graded class hand out `make student-bundle`, which holds no "
             "solution of a chapter not yet due, and grade as [the grading guide](grading.md) says. The "
             "grading guides of the written questions, which hold their model answers, stay in each "
             "chapter's `INSTRUCTOR.md` and are not on this site.", ""]
    for entry in CHAPTERS:
        if present(entry) and (paths.SOLUTIONS / entry.slug / "INSTRUCTOR.md").exists():
            lines += [instructor_notes(entry.slug),
                      f"The chapter: [{entry.slug[:2]} · {entry.title}](chapters/{entry.slug}.ipynb).", ""]
    return "\n".join(lines)


def workshop_page() -> str:
    return ("# Running a workshop on JupyterHub\n\n"
            "A workshop on a JupyterHub needs the course's environment, each learner's own copy of the "
            "chapters, and the learners' self-check: the steps are in the grading guide, "
            "[Workshop on JupyterHub](grading.md#workshop-on-jupyterhub). For a graded class, the same "
            "page describes [nbgrader's route](grading.md#running-a-graded-course-with-nbgrader).\n")
