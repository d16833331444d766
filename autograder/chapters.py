"""Which chapter a submission belongs to, decided from its file name, never its contents."""
from __future__ import annotations

from pathlib import Path

from coursebuild import paths


def chapter_of(path: Path, chapter: str | None = None) -> str:
    """The slug of the chapter to grade ``path`` against.

    ``chapter`` (a slug or its two-digit number) wins; otherwise the file name must start
    with a chapter's number or slug, as the released notebooks are named.
    """
    present = paths.present_slugs()
    if chapter is not None:
        return paths.resolve_slugs([chapter])[0]
    name = path.name
    matches = [slug for slug in present if name.startswith(slug) or name.startswith(slug[:3])]
    if len(matches) != 1:
        raise ValueError(
            f"cannot tell the chapter of {name!r} from its name; pass --chapter (one of {present})"
        )
    return matches[0]
