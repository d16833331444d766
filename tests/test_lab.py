"""`make lab` copies the chapters into the learner's folder and serves JupyterLab without
nbgrader's instructor tools; `make instructor-lab` serves them. The student bundle's lab and
Binder's (the repository's `start` script) are the same learner's lab, seen in a browser."""
import json
import os
import re
import sys
from pathlib import Path

import pytest

from coursebuild import bundle, paths

from . import browser, labserver

# nbgrader 0.9's JupyterLab plugins and server extensions that a learner must not see.
INSTRUCTOR_PLUGINS = ("@jupyter/nbgrader:formgrader", "@jupyter/nbgrader:create-assignment",
                      "@jupyter/nbgrader:course-list", "@jupyter/nbgrader:validate-assignment")
# Served by the formgrader, course list and validate server extensions (validate answers
# POST only: a GET there is 405 when it is served, 404 when it is not).
INSTRUCTOR_PAGES = ("/formgrader", "/formgraders", "/assignments/validate")
# nbgrader's assignment list (fetch and submit through an exchange folder): the course has no
# exchange, so its menu would only open an error.
ASSIGNMENT_LIST = "@jupyter/nbgrader:assignment-list"
NBGRADER_MENU = "Nbgrader"  # the menu bar entry of nbgrader's lab extension


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


def _learner_view(command, cwd, env) -> tuple[list[str], list[str]]:
    """The lab's menu bar and its file browser's first folder, as a learner's browser shows
    them; ``command(server_args)`` starts the server."""
    port = labserver.free_port()
    with labserver.serving(command(labserver.server_args(port)), port, cwd=cwd, env=env), browser.page() as tab:
        tab.goto(f"http://127.0.0.1:{port}/lab?token={labserver.TOKEN}")
        tab.wait_for_selector(".jp-DirListing-itemText", timeout=90_000)
        tab.wait_for_timeout(1500)  # every plugin's menu has been added by then
        menus = tab.locator("#jp-MainMenu .lm-MenuBar-itemLabel").all_inner_texts()
        files = tab.locator(".jp-DirListing-itemText").all_inner_texts()
    assert "File" in menus, menus
    return menus, files


@pytest.mark.skipif(browser.MISSING is not None, reason=browser.MISSING or "")
@pytest.mark.parametrize("route", ["make lab", "student bundle", "binder start"])
def test_every_route_opens_a_learners_lab_on_the_learners_own_copy(route, tmp_path):
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "config"), "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("JUPYTER_CONFIG_PATH", None)
    if route == "make lab":
        cwd, work = paths.ROOT, tmp_path / "work"
        command = lambda args: ["make", "--no-print-directory", "lab", f"WORK={work}", f"LAB_ARGS={args}"]  # noqa: E731
    elif route == "student bundle":
        # what the bundle's `make lab` runs once its .venv is installed: only its own package importable
        cwd = bundle.build("00", tmp_path / "dist")
        env["PYTHONPATH"], work = str(cwd), cwd / "work"
        command = lambda args: [sys.executable, "-m", "autograder", "lab", "--work", "work", *args.split()]  # noqa: E731
    else:
        # repo2docker runs `start SERVER-COMMAND` in the repository's folder, as a user (here root)
        cwd = tmp_path / "binder"
        cwd.mkdir()
        work = cwd / "work"
        command = lambda args: ["bash", str(paths.ROOT / "start"), sys.executable, "-m", "jupyter", "lab",  # noqa: E731
                                *args.split(), "--allow-root"]
    menus, files = _learner_view(command, cwd, env)
    assert NBGRADER_MENU not in menus, f"{route}: the learner's lab shows nbgrader's menu: {menus}"
    assert (work / "00_history" / "00_history.ipynb").is_file(), f"{route}: no copy of the chapters in {work}"
    assert ("work" if route == "binder start" else "00_history") in files, f"{route}: the lab opens {files}"
