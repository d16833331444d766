"""One pytest-xdist worker per ``xdist_group``, as `--dist loadgroup` promises.

Tests marked ``xdist_group(name)`` share something costly (a module fixture, a chapter's
grading), so each group should run on one worker: the other worker then neither builds it
again nor waits for it. pytest-xdist 3.8 marks a group by rewriting the item's node id, which
pytest 9.2 no longer reads, so every group was split between the workers. Here each worker
writes the group of every marked test it collected to a file the controller named, and the
controller's scheduler (pytest-xdist's load-scope scheduling, one scope per group and one per
ungrouped test) reads it. The root conftest.py loads this plugin.
"""
import json
import os
import tempfile
from pathlib import Path

GROUPS_KEY = "minillm_xdist_groups"


def _group(item) -> str | None:
    names = sorted({str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                    for mark in item.iter_markers("xdist_group")})
    return "_".join(names) or None


def _groups_path() -> Path:
    """Where the controller (this process, when it asks) wants the groups written."""
    return Path(tempfile.gettempdir()) / f"minillm-xdist-groups-{os.getpid()}.json"


def pytest_configure_node(node):
    node.workerinput[GROUPS_KEY] = str(_groups_path())


def pytest_collection_modifyitems(config, items):
    path = getattr(config, "workerinput", {}).get(GROUPS_KEY)
    if path:
        groups = {item.nodeid: group for item in items if (group := _group(item))}
        partial = Path(f"{path}.{os.getpid()}")
        partial.write_text(json.dumps(groups))
        partial.replace(path)  # the workers collect the same tests: whichever lands last is whole


def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        groups: dict | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:  # first asked once every worker has collected
                path = _groups_path()
                self.groups = json.loads(path.read_text())
                path.unlink()
            group = self.groups.get(nodeid)
            return f"group:{group}" if group else nodeid

    return GroupScheduling(config, log)
