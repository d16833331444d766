"""Grading toolkit around nbgrader: ``python -m autograder grade PATH... --out DIR``.

Submitted chapter notebooks are graded against the course's solution notebooks (the
nbgrader source) in a temporary course directory, with no set-up by the user. Each
submission gets ``results.json`` in Gradescope's shape and ``feedback.html`` that never
shows hidden test code.
"""
