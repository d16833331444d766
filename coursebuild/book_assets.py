"""A Sphinx extension of the textbook website (coursebuild/book.py): each script once.

Jupyter Book 1.0.4 with Sphinx 7.4 lists some scripts twice on a page: the inline settings
of sphinx-thebe and sphinx-togglebutton, and MathJax, once from ``html_js_files`` (before
MathJax's settings) and once from Sphinx's mathjax extension (deferred, after them). In a
browser the second copies fail ("Identifier 'THEBE_JS_URL' has already been declared";
MathJax's "Cannot set property Package"). This keeps the first copy of an inline script,
and the last copy of a file, so that MathJax loads once, after its settings.
"""
from __future__ import annotations


def _once(app, pagename, templatename, context, doctree) -> None:
    scripts = list(context.get("script_files", []))
    last = {script.filename: i for i, script in enumerate(scripts) if script.filename}
    seen, kept = set(), []
    for i, script in enumerate(scripts):
        if script.filename:
            if last[script.filename] == i:
                kept.append(script)
        elif script.attributes.get("body") not in seen:
            seen.add(script.attributes.get("body"))
            kept.append(script)
    context["script_files"] = kept


def setup(app):
    app.connect("html-page-context", _once, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
