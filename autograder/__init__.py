"""Grading toolkit around nbgrader: ``python -m autograder grade PATH... --out DIR``.

A submitted notebook is rebuilt from the chapter's master notebook (only the learner's
answer cells are taken from it, by ``grade_id``); the learner's cells run in a sandboxed
kernel with limits; the checks run in a separate judge process where the learner's answers
are proxies that return data only. Each submission gets ``results.json`` in Gradescope's
shape and ``feedback.html`` that never shows hidden test code; scores go into an nbgrader
gradebook. ``python -m autograder check`` is the learner's own report. See
``docs/grading.md`` for running a course and for the threat model.

Modules: ``marks`` (the cell marks, shared with the build chain), ``collect`` (which files
of a batch are submissions, and whose), ``chapters`` and ``analysis`` (the master, read; a
learner's source, analyzed in a bounded child), ``reconstruct``, ``sandbox`` and ``_launch``
(isolation and limits), ``kernel`` (the learner's kernel), ``judge``, ``server`` and ``wire``
(checks outside the learner's process), ``execute``, ``results``, ``feedback``,
``gradebook``, ``grade`` (batches), ``check``.
"""
