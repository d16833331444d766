"""The hostile corpus, round 2: attacks from other students and from the batch around them.

One class, graded in one run of the command line on the fixture chapter: nbgrader's
``submitted/<student>/<chapter>/<chapter>.ipynb`` beside a flat folder of
``<student>__<chapter>.ipynb``. One student (mallory) ships nested copies under another
student's name, a stray notebook, a symbolic link and a ``summary.csv``; others ship a
symbolic link to the master, a folder that is a link, a duplicate, a stray named like the
grader's own output, an answer that makes the source analysis recurse, a written answer
full of markup with a doctored image, and a notebook of thousands of cells with unknown
grade ids. Every honest student is graded right, the rest is flagged, and the run exits 0.

Cheaper cases (no learner's code runs) sit below the batch: the layouts the planner
accepts, files it must not read, bounded source analysis, formgrader-safe written answers
and re-encoded images.
"""
import base64
import csv
import html.parser
import io
import json
import os
import sqlite3
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import nbformat
import pytest

from autograder.chapters import Chapter

from . import grading_fixture as fx

pytestmark = [pytest.mark.grading, pytest.mark.xdist_group(name="hostile-batch")]

ROOT = Path(__file__).resolve().parent.parent
RIGHT_SCALE = "def scale(x, factor):\n    return x * factor\n"
WRONG_SCALE = "def scale(x, factor):\n    return x + factor\n"
RIGHT_COUNT = "def count_weights(d_in, d_out, bias=True):\n    return d_in * d_out + (d_out if bias else 0)\n"
WRONG_COUNT = "def count_weights(d_in, d_out, bias=True):\n    return d_in * d_out\n"
# An expression the parser nests once per term: building its syntax tree recurses.
RECURSING = RIGHT_SCALE + "bomb = (\n" + "1 +\n" * 3000 + "1)\n"
HOSTILE_WRITTEN = (
    "A bias <script>alert('w1')</script> shifts <img src=x onerror=alert('w2')> the output.\n\n"
    "```\n</code></pre><script>alert('w3')</script>\n```\n\n"
    "~~~\n<svg onload=alert('w4')></svg>\n~~~\n\n"
    "    <iframe src=javascript:alert('w5')></iframe>\n\n"
    "<details open ontoggle=alert('w6')>x</details>\n"
)
MARKUP_WORDS = ("alert('w1')", "alert('w2')", "alert('w3')", "alert('w4')", "alert('w5')", "alert('w6')")
PAYLOAD = "PAYLOAD-9e1f"


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def doctored_png() -> bytes:
    """A valid 1x1 PNG that carries a text chunk with markup (a polyglot's payload)."""
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
            + _chunk(b"tEXt", f"Comment\x00{PAYLOAD}<script>alert('png')</script>".encode())
            + _chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00")) + _chunk(b"IEND", b""))


def _displays_images() -> str:
    clean = base64.b64encode(doctored_png()).decode()
    broken = clean + "\"><script>alert('src')</script>"
    return ("from IPython.display import display\n"
            f"display({{'image/png': {clean!r}}}, raw=True)\n"
            f"display({{'image/png': {broken!r}}}, raw=True)\n"
            f"display({{'image/png': 'PGltZyBzcmM9eCBvbmVycm9yPWFsZXJ0KDEpPg=='}}, raw=True)\n")


def _many_cells(data: dict) -> dict:
    for index in range(5000):
        data["cells"].append({"cell_type": "markdown", "id": f"junk{index}", "source": "junk",
                              "metadata": {"nbgrader": {"grade_id": f"junk_{index}", "grade": False,
                                                        "solution": False, "locked": False}}})
    return data


def _build_class(root: Path) -> dict:
    master = fx.write_master(root / "master")
    chapter = Chapter.from_master(master, fx.SLUG)
    slug = fx.SLUG
    submitted, uploads = root / "class" / "submitted", root / "class" / "uploads"

    def put(path: Path, answers=None, solved=False, edit=None) -> Path:
        data = fx.submission(chapter, answers, solved=solved)
        return fx.write(edit(data) if edit else data, path)

    def own(student: str) -> Path:
        return submitted / student / slug / f"{slug}.ipynb"

    put(own("alice"), {"scale": WRONG_SCALE, "count_weights": RIGHT_COUNT})
    put(own("bob"), solved=True)
    put(submitted / "bob" / slug / "Untitled.ipynb")                 # a stray, untouched
    put(submitted / "bob" / slug / "old" / f"{slug}.ipynb")          # an old copy, deeper
    put(own("mallory"), {"scale": WRONG_SCALE, "count_weights": WRONG_COUNT})
    nested = submitted / "mallory" / slug
    put(nested / "submitted" / "alice" / slug / f"{slug}.ipynb", solved=True)
    put(nested / "alice" / slug / f"{slug}.ipynb", solved=True)
    put(nested / "Untitled.ipynb", solved=True)
    fx.write("student,score\nalice,0\nmallory,100\n", nested / "summary.csv")
    (nested / "link.ipynb").symlink_to(own("bob"))
    (submitted / "frank" / slug).mkdir(parents=True)
    own("frank").symlink_to(master)                                   # points outside: the master
    (submitted / "erin").mkdir()
    (submitted / "erin" / slug).symlink_to(submitted / "bob" / slug, target_is_directory=True)
    put(own("grace"), {"scale": RECURSING, "count_weights": RIGHT_COUNT})
    put(own("heidi"), {"scale": _displays_images() + RIGHT_SCALE, "count_weights": RIGHT_COUNT,
                       "why_bias": HOSTILE_WRITTEN})
    put(own("ivan"), solved=True, edit=_many_cells)
    put(own("dave"))                                                  # dave twice: here and in uploads
    put(uploads / f"carol__{slug}.ipynb", solved=True)
    put(uploads / f"dave__{slug}.ipynb", solved=True)
    put(uploads / "summary.csv.ipynb", solved=True)                   # named like the grader's output
    out = root / "out"
    scratch = root / "scratch"
    scratch.mkdir()
    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "autograder", "grade", str(submitted), str(uploads), "--out", str(out),
         "--master", str(master), "--jobs", "2", "--cell-timeout", "10", "--notebook-timeout", "120",
         "--memory-gib", "1", "--quiet"],
        cwd=ROOT, capture_output=True, text=True, timeout=900, env={**os.environ, "TMPDIR": str(scratch)})
    return {"returncode": run.returncode, "stdout": run.stdout[-20000:], "stderr": run.stderr[-20000:],
            "out": str(out), "master": str(master), "submitted": str(submitted), "uploads": str(uploads),
            "seconds": time.monotonic() - started}


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    graded = fx.once(tmp_path_factory, "hostile-batch", _build_class)
    out = Path(graded["out"])
    results: dict[str, list[dict]] = {}
    for page in out.rglob("results.json"):
        try:
            outcome = json.loads(page.read_text())
        except ValueError:
            continue
        outcome["_path"] = str(page)
        results.setdefault(outcome["extra_data"]["submission"].get("student"), []).append(outcome)
    summary = []
    if (out / "summary.csv").is_file():
        with open(out / "summary.csv") as stream:
            summary = list(csv.DictReader(stream))
    return {**graded, "out": out, "results": results, "summary": summary,
            "submitted": Path(graded["submitted"]), "uploads": Path(graded["uploads"]),
            "gradebook": _gradebook(out / "nbgrader" / "gradebook.db")}


def _gradebook(path: Path) -> dict[str, float]:
    if not path.exists():
        return {}
    with sqlite3.connect(path) as db:
        return dict(db.execute(
            "SELECT student.id, SUM(grade.auto_score) FROM grade JOIN submitted_notebook ON grade.notebook_id = "
            "submitted_notebook.id JOIN submitted_assignment ON submitted_notebook.assignment_id = "
            "submitted_assignment.id JOIN student ON submitted_assignment.student_id = student.id GROUP BY student.id"))


def only(batch, student: str) -> dict:
    found = batch["results"].get(student, [])
    assert len(found) == 1, f"{student}: {len(found)} results ({[r['_path'] for r in found]})"
    return found[0]


def row_of(batch, path: Path) -> dict:
    rows = [row for row in batch["summary"] if row["file"] == str(path)]
    assert len(rows) == 1, f"summary.csv has {len(rows)} rows for {path}"
    return rows[0]


def flag_kinds(outcome) -> set:
    return {f["kind"] for f in outcome["extra_data"]["flags"]}


HONEST = {"alice": 3, "bob": 6, "carol": 6, "heidi": 6, "ivan": 6}


def test_the_batch_exits_0_and_grades_every_honest_student(batch):
    assert batch["returncode"] == 0, batch["stderr"][-3000:]
    for student, score in HONEST.items():
        outcome = only(batch, student)
        assert outcome["score"] == score, (student, [(t["name"], t["output"][:200]) for t in outcome["tests"]])
        assert batch["gradebook"].get(student) == score, (student, batch["gradebook"])
    assert set(batch["gradebook"]) == set(HONEST) | {"mallory", "grace", "frank", "dave"}, batch["gradebook"]


def test_each_gradebook_row_says_which_file_it_came_from(batch):
    submitted, uploads, slug = batch["submitted"], batch["uploads"], fx.SLUG
    expected = {"alice": (submitted / "alice" / slug / f"{slug}.ipynb", "nbgrader"),
                "bob": (submitted / "bob" / slug / f"{slug}.ipynb", "nbgrader"),
                "carol": (uploads / f"carol__{slug}.ipynb", "flat")}
    for student, (path, layout) in expected.items():
        submission = only(batch, student)["extra_data"]["submission"]
        assert (submission["file"], submission["layout"]) == (str(path), layout), submission
        row = row_of(batch, path)
        assert (row["student"], row["status"], row["layout"]) == (student, "graded", layout)


def test_a_nested_copy_under_another_students_name_is_flagged_not_graded(batch):
    alice = only(batch, "alice")
    assert alice["score"] == 3 and batch["gradebook"]["alice"] == 3
    nested = batch["submitted"] / "mallory" / fx.SLUG
    for path in (nested / "submitted" / "alice" / fx.SLUG / f"{fx.SLUG}.ipynb",
                 nested / "alice" / fx.SLUG / f"{fx.SLUG}.ipynb"):
        row = row_of(batch, path)
        assert row["status"] == "not-graded" and row["student"] == "" and row["reason"], row


def test_stray_and_deeper_notebooks_never_replace_a_grade(batch):
    assert only(batch, "bob")["score"] == 6 and batch["gradebook"]["bob"] == 6
    assert only(batch, "mallory")["score"] == 0
    for path in (batch["submitted"] / "bob" / fx.SLUG / "Untitled.ipynb",
                 batch["submitted"] / "bob" / fx.SLUG / "old" / f"{fx.SLUG}.ipynb",
                 batch["submitted"] / "mallory" / fx.SLUG / "Untitled.ipynb"):
        row = row_of(batch, path)
        assert row["status"] == "not-graded" and "stray-notebook" in row["flags"], row


def test_symbolic_links_are_never_followed(batch):
    frank = only(batch, "frank")
    assert frank["score"] == 0 and "symbolic link" in frank["output"], frank["output"]
    assert not frank["extra_data"].get("grader_error")
    link = row_of(batch, batch["submitted"] / "mallory" / fx.SLUG / "link.ipynb")
    assert link["status"] == "not-graded" and "symlink" in link["flags"]
    folder = row_of(batch, batch["submitted"] / "erin" / fx.SLUG)
    assert folder["status"] == "not-graded" and "symlink" in folder["flags"]
    assert "erin" not in batch["results"] and "erin" not in batch["gradebook"]


def test_a_file_named_like_a_grader_output_collides_with_nothing(batch):
    assert (batch["out"] / "summary.csv").is_file()
    row = row_of(batch, batch["uploads"] / "summary.csv.ipynb")
    assert row["status"] == "not-graded" and "stray-notebook" in row["flags"]
    assert (batch["submitted"] / "mallory" / fx.SLUG / "summary.csv").read_text().startswith("student,score")


def test_a_duplicate_is_flagged_and_neither_copy_is_graded(batch):
    dave = only(batch, "dave")
    assert dave["score"] == 0 and "duplicate" in dave["output"]
    for path in (batch["submitted"] / "dave" / fx.SLUG / f"{fx.SLUG}.ipynb", batch["uploads"] / f"dave__{fx.SLUG}.ipynb"):
        assert str(path) in dave["output"]
        assert row_of(batch, path)["status"] == "not-graded"
    assert batch["gradebook"]["dave"] == 0


def test_an_answer_that_makes_the_analysis_recurse_is_the_submissions_fault(batch):
    grace = only(batch, "grace")
    assert not grace["extra_data"].get("grader_error"), grace["extra_data"].get("grader_error")
    assert "not-analyzable" in flag_kinds(grace)
    scale = [t for t in grace["tests"] if t["name"].startswith("scale")]
    assert all(t["score"] == 0 and "could not be analyzed" in t["output"] for t in scale), scale
    # Her own kernel may choke on the cell too (a cell timeout): that costs her, never the batch.
    assert batch["gradebook"]["grace"] == grace["score"]


def test_flags_and_cells_read_are_capped(batch):
    ivan = only(batch, "ivan")
    assert Path(ivan["_path"]).stat().st_size < 64 * 1024
    kinds = [f["kind"] for f in ivan["extra_data"]["flags"]]
    assert "too-many-cells" in kinds
    assert kinds.count("unknown-grade-id") <= 21
    assert any(f["kind"] == "unknown-grade-id" and "more" in f["detail"] for f in ivan["extra_data"]["flags"])


class Tags(html.parser.HTMLParser):
    """Every element and attribute of an HTML fragment."""

    def __init__(self):
        super().__init__()
        self.tags, self.attributes, self.text = [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attributes += [name for name, _ in attrs]

    def handle_data(self, data):
        self.text.append(data)


def parsed(fragment: str) -> Tags:
    tags = Tags()
    tags.feed(fragment)
    return tags


def assert_inert(fragment: str) -> None:
    tags = parsed(fragment)
    assert not {"script", "img", "svg", "iframe", "details"} & set(tags.tags), tags.tags
    assert not [a for a in tags.attributes if a.startswith("on")], tags.attributes
    text = "".join(tags.text)
    for word in MARKUP_WORDS:
        assert word in text, f"{word} is not shown as text"


def test_written_answers_are_stored_so_that_formgrader_renders_no_markup(batch):
    from nbconvert.filters.markdown_mistune import markdown2html_mistune

    path = batch["out"] / "nbgrader" / "autograded" / "heidi" / fx.SLUG / f"{fx.SLUG}.ipynb"
    notebook = nbformat.read(path, as_version=4)
    [written] = [c for c in notebook.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "why_bias"]
    assert_inert(markdown2html_mistune(written.source))


def _images(page: str) -> list[bytes]:
    found = []
    for source in parsed_images(page):
        assert source.startswith("data:image/png;base64,"), source[:80]
        found.append(base64.b64decode(source.split(",", 1)[1], validate=True))
    return found


def parsed_images(page: str) -> list[str]:
    class Images(html.parser.HTMLParser):
        sources: list = []

        def handle_starttag(self, tag, attrs):
            if tag == "img":
                self.sources.append(dict(attrs).get("src", ""))

    parser = Images()
    parser.sources = []
    parser.feed(page)
    return parser.sources


def test_images_in_feedback_and_formgrader_are_decoded_and_encoded_again(batch):
    from PIL import Image

    page = Path(only(batch, "heidi")["_path"]).with_name("feedback.html").read_text()
    assert PAYLOAD not in page and "alert('src')" not in page and "alert(&#x27;src&#x27;)" not in page
    images = _images(page)
    assert len(images) == 1, "the doctored but valid image is kept, the two that are not images are dropped"
    for raw in images:
        assert b"tEXt" not in raw and PAYLOAD.encode() not in raw
        assert Image.open(io.BytesIO(raw)).size == (1, 1)
    instructor = batch["out"] / "nbgrader" / "autograded" / "heidi" / fx.SLUG / f"{fx.SLUG}.ipynb"
    outputs = [o for c in nbformat.read(instructor, as_version=4).cells if c.cell_type == "code" for o in c.outputs]
    pngs = [o["data"]["image/png"] for o in outputs if "image/png" in o.get("data", {})]
    assert len(pngs) == 1 and PAYLOAD.encode() not in base64.b64decode(pngs[0])


def test_the_batch_costs_what_it_should(batch):
    print(f"hostile batch graded in {batch['seconds']:.0f} s")
    assert batch["seconds"] < 240
    scratch = Path(batch["out"]).parent / "scratch"
    assert not list(scratch.glob("m[gj]-*")) and not fx.processes_mentioning(scratch)


# --------------------------------------------------------------------------- no learner code runs
def _cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "autograder", "grade", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def test_a_stray_notebook_whose_chapter_cannot_be_told_does_not_stop_the_batch(tmp_path):
    folder = tmp_path / "submitted"
    fx.write(b'{"cells": [', folder / "alice" / "00_history" / "00_history.ipynb")
    fx.write(b"{}", folder / "alice" / "homework.ipynb")
    fx.write(b"{}", folder / "Untitled.ipynb")
    run = _cli(folder, "--out", tmp_path / "out", "--no-gradebook", "--quiet")
    assert run.returncode == 0, run.stderr[-3000:]
    with open(tmp_path / "out" / "summary.csv") as stream:
        rows = {Path(row["file"]).name: row for row in csv.DictReader(stream)}
    assert rows["00_history.ipynb"]["status"] == "unreadable" and rows["00_history.ipynb"]["student"] == "alice"
    for name in ("homework.ipynb", "Untitled.ipynb"):
        assert rows[name]["status"] == "not-graded" and rows[name]["reason"], rows[name]


def test_a_notebook_that_is_not_a_regular_file_is_never_read(tmp_path):
    master = fx.write_master(tmp_path / "master")
    folder = tmp_path / "submitted"
    (folder / "alice" / fx.SLUG).mkdir(parents=True)
    os.mkfifo(folder / "alice" / fx.SLUG / f"{fx.SLUG}.ipynb")      # reading it would block for ever
    (folder / "bob" / fx.SLUG).mkdir(parents=True)
    os.mkfifo(folder / "bob" / fx.SLUG / "extra.ipynb")
    run = _cli(folder, "--out", tmp_path / "out", "--master", master, "--no-gradebook", "--quiet", timeout=60)
    assert run.returncode == 0, run.stderr[-3000:]
    with open(tmp_path / "out" / "summary.csv") as stream:
        rows = {Path(row["file"]).name: row for row in csv.DictReader(stream)}
    alice = rows[f"{fx.SLUG}.ipynb"]
    assert (alice["student"], alice["status"], alice["score"]) == ("alice", "unreadable", "0")
    assert "not a regular file" in alice["reason"]
    assert rows["extra.ipynb"]["status"] == "not-graded"


@pytest.fixture(scope="module")
def chapter(tmp_path_factory):
    return Chapter.from_master(fx.write_master(tmp_path_factory.mktemp("analysis-master")), fx.SLUG)


SLOW_SOURCES = {
    # IPython turns each magic into a call, scanning the whole cell each time: quadratic.
    "magics": RIGHT_SCALE + "%time x = 1\n" * 4000,
    "recursion": RECURSING,
    "memory": RIGHT_SCALE + "y = " + "-" * 150_000 + "1\n",
}


@pytest.mark.parametrize("case", sorted(SLOW_SOURCES))
def test_source_analysis_is_bounded_and_never_the_graders_failure(chapter, case):
    from autograder.reconstruct import reconstruct

    data = fx.submission(chapter, {"scale": SLOW_SOURCES[case], "count_weights": RIGHT_COUNT})
    started = time.monotonic()
    rebuilt = reconstruct(chapter, json.dumps(data).encode(), "slow.ipynb")
    assert time.monotonic() - started < 20
    flagged = [f for f in rebuilt.flags if f["kind"] == "not-analyzable"]
    assert [f.get("cell") for f in flagged] == ["scale"], rebuilt.flags
    assert "scale" in rebuilt.reasons and "count_weights" not in rebuilt.reasons


def test_any_failure_to_read_a_submission_is_its_own_zero_not_a_grader_error(chapter, tmp_path, monkeypatch):
    from autograder import collect, grade, reconstruct
    from autograder.sandbox import Limits

    path = fx.write(fx.submission(chapter, solved=True), tmp_path / f"alice__{fx.SLUG}.ipynb")
    [job] = collect.batch([path], master=Path(chapter.origin)).jobs

    def broken(*args, **kwargs):
        raise KeyError("a part of the notebook the reader did not expect")

    monkeypatch.setattr(reconstruct, "read_cells", broken)
    outcome = grade.grade_submission(job, Limits())["results"]
    assert outcome["score"] == 0 and not outcome["extra_data"].get("grader_error")
    assert "KeyError" in outcome["output"] and "unreadable" in flag_kinds(outcome)


FENCES = ["```", "````", "~~~", "   ```", "```text", "`" * 12, "\t```", "```\r", "~~~~~~"]
MARKUP = ["<script>alert('w1')</script>", "<img src=x onerror=alert('w2')>"]


@pytest.mark.parametrize("fence", FENCES)
def test_written_answers_in_the_graded_notebook_render_as_plain_text(chapter, fence):
    """Generated answers that try to close the fence around them; each renders to no markup."""
    from nbconvert.filters.markdown_mistune import markdown2html_mistune

    from autograder.gradebook import instructor_notebook
    from autograder.reconstruct import reconstruct
    from autograder.score import unreadable

    answer = f"{MARKUP[0]}\n{fence}\n{MARKUP[1]}\n{fence}\n</pre></div>{MARKUP[0]}\n{fence}{fence}\n{MARKUP[1]}"
    data = fx.submission(chapter, {"why_bias": answer})
    rebuilt = reconstruct(chapter, json.dumps(data).encode(), "markup.ipynb")
    notebook = instructor_notebook(chapter, rebuilt, None, unreadable(chapter, "not run"))
    [written] = [c for c in notebook.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "why_bias"]
    tags = parsed(markdown2html_mistune(written.source))
    assert not {"script", "img"} & set(tags.tags) and not [a for a in tags.attributes if a.startswith("on")]
    assert "alert('w1')" in "".join(tags.text) and "alert('w2')" in "".join(tags.text)


def test_the_judges_socket_drops_foreign_messages_unread_and_refuses_large_ones(tmp_path):
    """A kernel that floods the judge's shell socket: hundreds of messages that answer other
    requests, then the reply (only the reply is decoded); then a message far over the size
    limit (the connection is dropped: the message is never held, nor decoded)."""
    import zmq
    from jupyter_client.session import Session

    from autograder.remote import kernel_client, shell_reply
    from autograder.wall import MAX_MESSAGE

    ip = str(tmp_path / "k")
    info = {"transport": "ipc", "ip": ip, "key": "k3y", "signature_scheme": "hmac-sha256",
            **{f"{name}_port": index + 1 for index, name in enumerate(("shell", "iopub", "stdin", "control", "hb"))}}
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.bind(f"ipc://{ip}-1")
    kernel = Session(key=b"k3y")
    kc = kernel_client(info)
    kc.start_channels(shell=True, iopub=False, stdin=False, hb=False, control=False)
    decoded = []
    deserialize = kc.session.deserialize
    kc.session.deserialize = lambda *a, **k: decoded.append(1) or deserialize(*a, **k)

    def request():
        msg_id = kc.execute("None")
        ident, frames = kernel.feed_identities(router.recv_multipart())
        return msg_id, ident, kernel.deserialize(frames)

    try:
        msg_id, ident, parent = request()
        for index in range(300):
            other = {**parent["header"], "msg_id": f"other-{index}"}
            kernel.send(router, "execute_reply", {"status": "ok", "junk": "y" * 1000}, parent={"header": other},
                        ident=ident)
        kernel.send(router, "execute_reply", {"status": "ok", "n": 1}, parent=parent, ident=ident)
        reply = shell_reply(kc, msg_id, 10)
        assert reply is not None and reply["content"] == {"status": "ok", "n": 1}
        assert len(decoded) == 1, f"{len(decoded)} messages decoded"

        msg_id, ident, parent = request()
        kernel.send(router, "execute_reply", {"status": "ok", "junk": "x" * (2 * MAX_MESSAGE)}, parent=parent,
                    ident=ident)
        kernel.send(router, "execute_reply", {"status": "ok", "n": 2}, parent=parent, ident=ident)
        assert shell_reply(kc, msg_id, 2) is None, "a peer that sends an oversized message is cut off"
        assert len(decoded) == 1
    finally:
        kc.stop_channels()
        router.close(linger=0)
        context.term()


def test_the_judge_cannot_grow_past_its_memory_limit():
    """The judge caps its own address space when it starts (what a learner's replies or a
    check's data could make it hold): past the cap, an allocation fails in the judge."""
    code = ("from autograder.judge import limit_memory\nlimit_memory(256 * 2**20)\n"
            "try:\n    hog = bytearray(2**30)\nexcept MemoryError:\n    print('refused')\n")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == "refused", run.stderr[-2000:]


def test_a_notebook_of_small_json_objects_is_parsed_outside_the_graders_memory():
    """Parsed, 20 MiB of tiny JSON objects take hundreds of MiB: the parse runs in the
    bounded child, and the grader's own peak memory does not move."""
    script = (
        "import json, resource\n"
        "from autograder import reconstruct\n"
        "junk = json.dumps({'cells': [{'cell_type': 'code', 'source': 'x', 'metadata': {'j': [[0]] * 4_000_000}}],"
        " 'nbformat': 4}).encode()\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "cells, total = reconstruct.read_cells(junk, 'junk.ipynb')\n"
        "print(len(junk) >> 20, total, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) >> 10)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    size, total, growth = map(int, done.stdout.split())
    assert size >= 18 and total == 1
    assert growth < 64, f"parsing a {size} MiB notebook grew the grader's peak memory by {growth} MiB"
