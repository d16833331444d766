"""formgrader on the course directory the autograder fills: listing, rendering, manual grades.

The autograder writes scores into an nbgrader gradebook instead of running ``nbgrader
autograde``; an instructor then grades written answers and overrides scores in formgrader.
Here a real Jupyter server runs nbgrader's formgrader extension on that course directory
and is driven through formgrader's own HTTP API, as its pages do.
"""
import csv
import datetime
import html
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from autograder.chapters import Chapter
from autograder.grade import grade_files

from . import browser
from . import grading_fixture as fx

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "formgrader-test-token"
WRITTEN = "why_bias"
ALICE_WRITES = "ALICE-WRITTEN-7c1e: a bias lets each output move off zero; d_out numbers."
BOB_WRITES = "BOB-WRITTEN-42d9: it shifts things."
SOLUTION_TEXT = "A bias shifts the output"          # the master's answer to the written question
SCALE_SOLUTION = "return x * factor"                 # the master's answer to exercise 1
COUNT_WEIGHTS = "def count_weights(d_in, d_out, bias=True):\n    return d_in * d_out + (d_out if bias else 0)\n"


@pytest.fixture(scope="module")
def fixture_chapter(tmp_path_factory):
    master = fx.write_master(tmp_path_factory.mktemp("formgrader-master"))
    return master, Chapter.from_master(master, fx.SLUG)


def _env(tmp_path: Path) -> dict:
    jupyter = tmp_path / "jupyter"
    return {**os.environ,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "JUPYTER_CONFIG_DIR": str(jupyter / "config"), "JUPYTER_RUNTIME_DIR": str(jupyter / "runtime"),
            "JUPYTER_DATA_DIR": str(jupyter / "data")}


class Formgrader:
    """A Jupyter server with formgrader, serving ``course`` (its root and its config)."""

    def __init__(self, course: Path, tmp_path: Path):
        self.env = _env(tmp_path)
        self.runtime = Path(self.env["JUPYTER_RUNTIME_DIR"])
        self.log = tmp_path / "jupyter-server.log"
        self.process = None
        self.course = course

    def __enter__(self):
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "jupyter_server", "--no-browser", "--allow-root", "--ip=127.0.0.1",
                 "--port=0", "--ServerApp.port_retries=0", f"--IdentityProvider.token={TOKEN}",
                 f"--ServerApp.root_dir={self.course}",
                 "--ServerApp.jpserver_extensions=nbgrader.server_extensions.formgrader=True"],
                cwd=self.course, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            self._wait()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _wait(self, seconds: float = 90) -> None:
        """Wait until the server writes its address (port 0: no port race) and answers."""
        deadline = time.monotonic() + seconds
        info = self.runtime / f"jpserver-{self.process.pid}.json"
        self.base = None
        while time.monotonic() < deadline and self.process.poll() is None:
            if self.base is None and info.exists():
                try:
                    self.base = f"http://127.0.0.1:{json.loads(info.read_text())['port']}"
                except (ValueError, KeyError):
                    pass                                    # written but not yet complete
            if self.base is not None:
                try:
                    if self.get("/api/status").get("started"):
                        return
                except OSError:
                    pass
            time.sleep(0.2)
        raise AssertionError(f"the Jupyter server did not answer (exit {self.process.poll()}):\n"
                             f"{self.log.read_text(errors='replace')[-4000:]}")

    def __exit__(self, *exc):
        if self.process is not None and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=20)
            except ProcessLookupError:
                pass
        return False

    def request(self, path: str, method: str = "GET", data=None) -> tuple[int, str]:
        body = json.dumps(data).encode() if data is not None else (b"" if method in ("PUT", "POST") else None)
        request = urllib.request.Request(self.base + path, data=body, method=method,
                                         headers={"Authorization": f"token {TOKEN}",
                                                  "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode(errors="replace")

    def get(self, path: str):
        status, text = self.request(path)
        assert status == 200, f"GET {path}: {status}\n{text[-2000:]}"
        return json.loads(text)

    def put(self, path: str, data: dict):
        status, text = self.request(path, "PUT", data)
        assert status == 200, f"PUT {path}: {status}\n{text[-2000:]}"
        return json.loads(text)


def _export(course: Path, tmp_path: Path) -> dict[str, float]:
    target = tmp_path / "grades.csv"
    export = subprocess.run([sys.executable, "-m", "nbgrader", "export", "--to", str(target)], cwd=course,
                            env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert export.returncode == 0, export.stderr
    with open(target) as stream:
        return {row["student_id"]: float(row["raw_score"]) for row in csv.DictReader(stream)}


@pytest.mark.grading
def test_formgrader_lists_renders_and_keeps_manual_grades(tmp_path, fixture_chapter):
    master, chapter = fixture_chapter
    subs = tmp_path / "subs"
    # nbgrader's layout names the students: submitted/<student>/<chapter>/<notebook>.
    alice = fx.write(fx.submission(chapter, {WRITTEN: ALICE_WRITES}, solved=True),
                     subs / "submitted" / "alice" / fx.SLUG / f"{fx.SLUG}.ipynb")
    bob = fx.write(fx.submission(chapter, {WRITTEN: BOB_WRITES, "count_weights": COUNT_WEIGHTS}),
                   subs / "submitted" / "bob" / fx.SLUG / f"{fx.SLUG}.ipynb")
    out = tmp_path / "out"
    batch = grade_files([subs], out, master=master)
    assert [(job.student, r["score"]) for job, r in batch.rows] == [("alice", 6.0), ("bob", 3.0)]
    auto = {job.student: {t["name"]: t["score"] for t in r["tests"]} for job, r in batch.rows}
    course = out / "nbgrader"

    with Formgrader(course, tmp_path) as fg:
        # 1. The assignment and the graded submissions, with the grader's scores.
        assignments = fg.get("/formgrader/api/assignments")
        assert [(a["name"], a["max_score"], a["num_submissions"]) for a in assignments] == [(fx.SLUG, 7.0, 2)]
        submissions = {s["student"]: s for s in fg.get(f"/formgrader/api/submissions/{fx.SLUG}")}
        assert {k: (s["score"], s["autograded"], s["needs_manual_grade"]) for k, s in submissions.items()} == {
            "alice": (6.0, True, True), "bob": (3.0, True, True)}, "the written answers await a manual grade"
        for student in ("alice", "bob"):
            # The per-student views: nbgrader shows "not submitted, 0" unless submitted/…/timestamp.txt
            # matches the gradebook's time.
            one = fg.get(f"/formgrader/api/submission/{fx.SLUG}/{student}")
            assert (one["autograded"], one["submitted"], one["score"]) == (True, True, submissions[student]["score"])
            [mine] = fg.get(f"/formgrader/api/student_submissions/{student}")
            assert (mine["autograded"], mine["score"]) == (True, submissions[student]["score"])

        # 2. The submitted notebooks, each with its grades, and formgrader's page for each.
        notebooks = {n["student"]: n for n in fg.get(f"/formgrader/api/submitted_notebooks/{fx.SLUG}/{fx.SLUG}")}
        assert set(notebooks) == {"alice", "bob"}
        assert (notebooks["alice"]["failed_tests"], notebooks["bob"]["failed_tests"]) == (False, True)
        grades, comments = {}, {}
        for student, notebook in notebooks.items():
            grades[student] = {g["name"]: g for g in fg.get(f"/formgrader/api/grades?submission_id={notebook['id']}")}
            comments[student] = {c["name"]: c for c in
                                 fg.get(f"/formgrader/api/comments?submission_id={notebook['id']}")}
            assert {name: g["auto_score"] for name, g in grades[student].items() if name != WRITTEN} == auto[student]
            written = grades[student][WRITTEN]
            assert (written["auto_score"], written["manual_score"], written["needs_manual_grade"],
                    written["max_score"]) == (None, None, True, 1.0)
        pages = {}
        for student, notebook in notebooks.items():
            status, page = fg.request(f"/formgrader/submissions/{notebook['id']}/")
            assert status == 200, page[-2000:]
            pages[student] = html.unescape(re.sub(r"<[^>]*>", "", page))   # the text, highlighting aside
        assert ALICE_WRITES in pages["alice"] and BOB_WRITES in pages["bob"], "the learner's written answer is shown"
        assert SOLUTION_TEXT not in pages["alice"] + pages["bob"], "the master's written answer is not shown"
        assert "def count_weights(d_in, d_out, bias=True):" in pages["bob"]
        assert SCALE_SOLUTION not in pages["bob"], "bob left exercise 1 as the stub: no solution shown in its place"

        # 3. Manual grades through the API: the written answers, and an override of a failed check.
        fg.put(f"/formgrader/api/grade/{grades['alice'][WRITTEN]['id']}", {"manual_score": 0.5})
        fg.put(f"/formgrader/api/grade/{grades['bob'][WRITTEN]['id']}", {"manual_score": 0.75})
        override = fg.put(f"/formgrader/api/grade/{grades['bob']['scale_hidden']['id']}", {"manual_score": 1.0})
        assert (override["auto_score"], override["manual_score"]) == (0.0, 1.0)
        fg.put(f"/formgrader/api/comment/{comments['bob'][WRITTEN]['id']}", {"manual_comment": "Say which numbers."})
        fg.put(f"/formgrader/api/comment/{comments['bob']['count_weights']['id']}",
               {"manual_comment": "The bias adds d_out."})  # a comment on the learner's code
        expected = {"alice": 6.5, "bob": 3.0 + 1.0 + 0.75}
        submissions = {s["student"]: s for s in fg.get(f"/formgrader/api/submissions/{fx.SLUG}")}
        assert {k: (s["score"], s["needs_manual_grade"]) for k, s in submissions.items()} == {
            k: (v, False) for k, v in expected.items()}
        assert submissions["bob"]["written_score"] == 0.75

        # formgrader's own "autograde" button would run nbgrader autograde (the learner's code in
        # the grading kernel): the grader leaves no notebook under submitted/ for it to run, so it
        # refuses, and nothing is lost.
        status, text = fg.request(f"/formgrader/api/submission/{fx.SLUG}/alice/autograde", "POST")
        assert status == 200 and json.loads(text)["success"] is False
        assert fg.get(f"/formgrader/api/submission/{fx.SLUG}/alice")["score"] == 6.5
        assert (course / "autograded" / "alice" / fx.SLUG / f"{fx.SLUG}.ipynb").exists()

        # 4. The autograder grades bob again (--force), from a single file named for him:
        # the instructor's grades stay.
        alone = fx.write(json.loads(bob.read_text()), tmp_path / "again" / f"bob__{fx.SLUG}.ipynb")
        [again] = grade_files([alone], out, master=master, force=True).outcomes
        assert again["score"] == 3.0
        fresh = fg.get(f"/formgrader/api/grades?submission_id={notebooks['bob']['id']}")
        assert {g["name"]: (g["auto_score"], g["manual_score"]) for g in fresh} == {
            **{name: (score, None) for name, score in auto["bob"].items()}, "scale_hidden": (0.0, 1.0),
            WRITTEN: (None, 0.75)}
        fresh_comments = {c["name"]: c for c in fg.get(f"/formgrader/api/comments?submission_id={notebooks['bob']['id']}")}
        assert fresh_comments[WRITTEN]["manual_comment"] == "Say which numbers."
        assert fg.get(f"/formgrader/api/submission/{fx.SLUG}/bob")["score"] == expected["bob"]
        assert {s["student"]: s["score"] for s in fg.get(f"/formgrader/api/submissions/{fx.SLUG}")} == expected

    # nbgrader export reflects the manual grades, after the re-grade.
    assert _export(course, tmp_path) == expected

    # The learner's final feedback: results and page written anew from the gradebook.
    from autograder.final import refresh

    [folder] = refresh(out)
    final = json.loads((folder / "results.json").read_text())
    assert (final["score"], final["max_score"]) == (expected["bob"], 7.0) and final["output"].endswith("final")
    tests = {t["name"]: t for t in final["tests"]}
    assert tests["scale_hidden"]["score"] == 1.0 and tests["scale_hidden"]["output"].startswith("score set by hand")
    first_check = next(t for t in final["tests"] if t["tags"][-1] == "count_weights")
    assert first_check["output"].startswith("comment on your answer count_weights: The bias adds d_out.")
    [written] = final["extra_data"]["manual_grading"]
    assert (written["score"], written["comment"]) == (0.75, "Say which numbers.")
    page = (folder / "feedback.html").read_text()
    assert f"{expected['bob']:g} / 7 points, final" in page and "Say which numbers." in page
    assert "The bias adds d_out." in page, "the comment on the learner's code is not on the feedback page"
    assert BOB_WRITES in page, "the learner's notebook is still on the page"


@pytest.mark.grading
def test_a_folder_nbgrader_collect_filled_keeps_its_submission_time(tmp_path, fixture_chapter):
    """Grading ``course/submitted`` in place: collect's timestamp.txt is the submission's time
    (as for ``nbgrader autograde``), kept as it is; elsewhere the grader writes the file."""
    from nbgrader.apps import NbGraderAPI

    from autograder import score
    from autograder.gradebook import CourseGradebook
    from coursebuild.release import course_config

    _, chapter = fixture_chapter
    course = tmp_path / "course"
    collected = course / "submitted" / "carol" / fx.SLUG
    fx.write(fx.submission(chapter), collected / f"{fx.SLUG}.ipynb")
    stamp = "2026-01-02 03:04:05.000006 UTC"
    (collected / "timestamp.txt").write_text(stamp)
    book = CourseGradebook(course)
    outcome = score.unreadable(chapter, "not graded in this test")
    book.record(chapter, "carol", outcome, None, timestamp=time.time())
    book.record(chapter, "dave", outcome, None, timestamp=1_700_000_000.25)
    assert (collected / "timestamp.txt").read_text() == stamp, "collect's file is left as it is"
    written = (course / "submitted" / "dave" / fx.SLUG / "timestamp.txt").read_text()
    assert written == "2023-11-14 22:13:20.250000 UTC"

    config = course_config(book.root)
    config.CourseDirectory.db_url = book.db_url
    api = NbGraderAPI(config=config)
    with book.gradebook() as gb:
        assert gb.find_submission(fx.SLUG, "carol").timestamp == datetime.datetime(2026, 1, 2, 3, 4, 5, 6)
    assert {s["student"]: s["autograded"] for s in api.get_submissions(fx.SLUG)} == {"carol": True, "dave": True}
    for student in ("carol", "dave"):
        assert api.get_submission(fx.SLUG, student)["autograded"], f"formgrader would show {student} as not graded"


def _graded_written_answer(tmp_path, fixture_chapter, student: str, written: str):
    """The folder where the grader put a solved submission of ``student`` whose written answer is ``written``."""
    master, chapter = fixture_chapter
    subs = tmp_path / "subs"
    fx.write(fx.submission(chapter, {WRITTEN: written}, solved=True),
             subs / "submitted" / student / fx.SLUG / f"{fx.SLUG}.ipynb")
    out = tmp_path / "graded"
    grade_files([subs], out, master=master)
    return out


@pytest.mark.grading
def test_a_moved_gradebook_exports_and_opens_where_it_now_is(tmp_path, fixture_chapter):
    first = _graded_written_answer(tmp_path, fixture_chapter, "alice", ALICE_WRITES)
    config = (first / "nbgrader" / "nbgrader_config.py").read_text()
    assert str(tmp_path) not in config, "the course directory's settings name no absolute path"
    moved = tmp_path / "elsewhere" / "graded"
    moved.parent.mkdir()
    first.rename(moved)                            # the old folder is gone: nothing can read it
    course = moved / "nbgrader"
    assert _export(course, tmp_path) == {"alice": 6.0}

    # A second copy with other scores proves that each folder reads its own gradebook.
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-a", str(moved), str(copy)], check=True)
    with __import__("sqlite3").connect(copy / "nbgrader" / "gradebook.db") as db:
        db.execute("UPDATE grade SET manual_score = 0.0")
    assert _export(copy / "nbgrader", tmp_path) == {"alice": 0.0}
    assert _export(course, tmp_path) == {"alice": 6.0}

    with Formgrader(course, tmp_path) as fg:
        assert [a["name"] for a in fg.get("/formgrader/api/assignments")] == [fx.SLUG]
        students = {s["id"]: (s["first_name"], s["last_name"]) for s in fg.get("/formgrader/api/students")}
        assert students == {"alice": ("alice", "alice")}, "a student is named by their folder, not None, None"
        status, page = fg.request("/formgrader/manage_assignments")
        assert status == 200 and "formgrader" in page.lower()
        assert "does not exist" not in page, "formgrader warns that the exchange directory is missing"
        time.sleep(6)                                # formgrader's assignment list polls every few seconds
    log = fg.log.read_text(errors="replace")
    assert "Unwritable directory" not in log, log[-2000:]


HOSTILE_WRITTEN = (f"<script>window.{browser.MARK} = 'script'; alert('script')</script>\n"
                   f"<img src=x onerror=\"window.{browser.MARK} = 'onerror'\">\n"
                   f"<a href=\"javascript:window.{browser.MARK}='link'\" id=hostile-link>a link</a>\n"
                   f"<svg onload=\"window.{browser.MARK} = 'svg'\"></svg> HOSTILE-TEXT-91b2")


@pytest.mark.grading
@pytest.mark.skipif(browser.MISSING is not None, reason=str(browser.MISSING))
def test_a_hostile_written_answer_runs_no_script_in_formgrader(tmp_path, fixture_chapter):
    """formgrader renders the stored written answer on the instructor's logged-in origin:
    the answer is shown as text and none of its markup runs, in a real browser."""
    out = _graded_written_answer(tmp_path, fixture_chapter, "mallory", HOSTILE_WRITTEN)
    with Formgrader(out / "nbgrader", tmp_path) as fg:
        [notebook] = fg.get(f"/formgrader/api/submitted_notebooks/{fx.SLUG}/{fx.SLUG}")
        with browser.page() as tab:
            tab.goto(f"{fg.base}/formgrader/submissions/{notebook['id']}/?token={TOKEN}", wait_until="load")
            assert browser.hostile_marks(tab) == []
            assert "HOSTILE-TEXT-91b2" in tab.inner_text("body"), "the written answer is shown"
            assert "<script>" in tab.inner_text("body"), "its markup is shown as text"
            assert tab.locator("#hostile-link").count() == 0, "its link is not a link"
