"""Grading toolkit around nbgrader: ``python -m autograder grade PATH... --out DIR``.

A submitted notebook is rebuilt from the chapter's master notebook (only the learner's
answer cells are taken from it, by ``grade_id``); the learner's cells run in a sandboxed
kernel with limits; the checks run in a separate judge process where the learner's answers
are proxies that return data only. Each submission gets ``results.json`` in Gradescope's
shape and ``feedback.html`` that never shows hidden test code; scores go into an nbgrader
gradebook. ``python -m autograder check`` is the learner's own report. See
``docs/grading.md`` for running a course and for the threat model.

The pipeline of one submission, a module per stage: ``collect`` (which files of a batch
are submissions, and whose), ``reconstruct`` (the notebook rebuilt from the master),
``plan`` (which kernels run and what each checks), ``run`` (the learner's cells in a
sandboxed ``kernel`` through a ``capped`` client, the checks in a ``judge`` that ``judges``
starts, all within one deadline of ``wall``), ``score`` and ``report``, driven by
``grade`` (batches), ``gradebook`` and ``final``. Beside it: ``chapters`` and ``course``
(the master and the course, read), ``analysis`` (a cell's names), ``references`` (an answer's
use of the reference) and ``bounded`` (untrusted
input handled in a limited child), ``sandbox``, ``_launch``, ``isolation``, ``processes`` and
``cpu`` (isolation and limits), ``remote``, ``server``, ``proxies`` and ``wire`` (calls
across the sandbox's wall), ``view`` (the package a kernel sees), ``failures`` and
``feedback`` (what a learner reads), and the learner's commands ``check``, ``export``,
``lab`` and ``workspace``; ``gradescope`` runs inside Gradescope's container.
"""
import sys

# nbformat imports jsonschema, which builds rfc3987-syntax's parsers at import when that
# package is installed (jupyter-events requires it): 1.4 s of every grader process, for an
# "iri" format check that nbformat's validation never runs. Without it jsonschema skips
# that one format.
sys.modules.setdefault("rfc3987_syntax", None)
