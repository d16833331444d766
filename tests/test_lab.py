"""`make lab` copies the chapters into the learner's folder and serves JupyterLab without
nbgrader's instructor tools; `make instructor-lab` serves them."""
import json
import os
import re

from coursebuild import paths

from . import labserver

# nbgrader 0.9's JupyterLab plugins and server extensions that a learner must not see.
INSTRUCTOR_PLUGINS = ("@jupyter/nbgrader:formgrader", "@jupyter/nbgrader:create-assignment",
                      "@jupyter/nbgrader:course-list", "@jupyter/nbgrader:validate-assignment")
# Served by the formgrader, course list and validate server extensions (validate answers
# POST only: a GET there is 405 when it is served, 404 when it is not).
INSTRUCTOR_PAGES = ("/formgrader", "/formgraders", "/assignments/validate")
# nbgrader's assignment list (fetch and submit through an exchange folder): the course has no
# exchange, so its menu would only open an error.
ASSIGNMENT_LIST = "@jupyter/nbgrader:assignment-list"


def _lab(target: str, tmp_path, *make_args):
    port = labserver.free_port()
    command = ["make", "--no-print-directory", target, *make_args, f"LAB_ARGS={labserver.server_args(port)}"]
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "config"), "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt")}
    env.pop("JUPYTER_CONFIG_PATH", None)
    return labserver.serving(command, port, cwd=paths.ROOT, env=env)


def _disabled_plugins(server) -> set[str]:
    status, page = server.get("/lab")
    assert status == 200, page[:500]
    config = json.loads(re.search(rb'id="jupyter-config-data"[^>]*>(.*?)</script>', page, re.S).group(1))
    return set(config.get("disabledExtensions", []))


def test_make_lab_serves_the_course_without_instructor_tools_and_keeps_the_learners_work(tmp_path):
    work = tmp_path / "work"
    mine = work / "00_history"
    mine.mkdir(parents=True)
    (mine / "00_history.ipynb").write_text("my answers")
    with _lab("lab", tmp_path, f"WORK={work}") as server:
        assert "started" in server.json("/api/status")
        assert set(INSTRUCTOR_PLUGINS) <= _disabled_plugins(server), "the learner's lab shows instructor menus"
        assert ASSIGNMENT_LIST in _disabled_plugins(server), "the learner's lab shows nbgrader's Assignment List"
        for page in (*INSTRUCTOR_PAGES, "/assignments"):
            assert server.get(page)[0] == 404, f"{page} is served in the learner's lab"
    assert (mine / "00_history.ipynb").read_text() == "my answers", "make lab overwrote the learner's work"
    for slug in paths.present_slugs():
        assert (work / slug / f"{slug}.ipynb").exists(), f"make lab did not copy {slug}"


def test_make_instructor_lab_keeps_nbgraders_tools(tmp_path):
    course = tmp_path / "course"
    course.mkdir()
    with _lab("instructor-lab", tmp_path, f"LAB_DIR={course}") as server:
        assert not set(INSTRUCTOR_PLUGINS) & _disabled_plugins(server)
        for page in INSTRUCTOR_PAGES:
            assert server.get(page)[0] != 404, f"{page} is not served in the instructor's lab"
