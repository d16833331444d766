"""Build chain of the course (infrastructure, taught by no chapter).

One source of truth: each chapter is written once, as a jupytext percent-format file
``solutions/NN_slug/NN_slug.py``. From it the build derives, in order:

1. ``notebooks``: the solution notebook ``solutions/NN_slug/NN_slug.ipynb`` (the nbgrader
   source), with nbgrader metadata and deterministic cell ids, executed for its outputs;
2. ``package``: the ``minillm`` modules written by the notebooks' export cells;
3. ``release``: the learner's notebook ``chapters/NN_slug/NN_slug.ipynb``, by nbgrader;
4. ``manifest``: ``autograder/manifest.json``, every graded cell with its points.

``python -m coursebuild check`` says whether the committed files match what the build
would write; the test suite runs it.
"""
