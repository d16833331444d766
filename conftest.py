"""Settings for every test, the solution notebooks (nbval) included."""
import os

# Experiments shrink in quick mode; the kernels nbval starts inherit this environment.
os.environ["COURSE_QUICK"] = "1"
# The Triton interpreter must be on before any kernel is defined.
os.environ.setdefault("TRITON_INTERPRET", "1")

# `--dist loadgroup` runs each xdist_group on one worker (tests/xdist_groups.py).
pytest_plugins = ["tests.xdist_groups"]
