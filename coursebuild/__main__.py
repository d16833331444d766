"""``python -m coursebuild COMMAND [CHAPTER ...]``: build the course from its sources.

Commands: ``notebooks`` (sources → solution notebooks, executed for outputs),
``package``, ``release``, ``manifest``, ``all`` (the four in order), ``check`` (exit 1 when
a committed file differs from what the build writes), ``bundle --upto NN [--due MM]`` (a
student bundle in --out, see coursebuild/bundle.py), ``gradescope NN`` (the chapter's
Gradescope autograder zip in --out, see coursebuild/gradescope.py). CHAPTER is a slug or
its number.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import nbformat
from tqdm.auto import tqdm

from . import bundle, execute, gradescope, manifest, notebooks, package, paths, release


def build_notebooks(slugs, run: bool) -> None:
    if run:
        build_package()  # the notebooks import the package: it must match their sources first
    for slug in tqdm(slugs, desc="notebooks", disable=len(slugs) < 2):
        notebook = notebooks.build_notebook(slug)
        target = paths.solution_notebook(slug)
        if run:
            with tempfile.TemporaryDirectory() as tmp:
                execute.execute(notebook, Path(tmp), quick=False)
        elif target.exists():
            old = nbformat.read(target, as_version=4)
            if notebooks.sources_of(old) == notebooks.sources_of(notebook):
                continue
            print(f"{slug}: sources changed; outputs dropped (run with --execute)")
        notebooks.write(notebook, target)
        print(f"wrote {target.relative_to(paths.ROOT)}")


def build_package() -> None:
    texts = package.modules(paths.present_slugs())
    for stale in package.generated_on_disk() - texts.keys():
        (paths.ROOT / stale).unlink()
        print(f"removed {stale} (no notebook exports it)")
    for target, text in texts.items():
        path = paths.ROOT / target
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {target}")


def build_release(slugs) -> None:
    for slug, notebook in release.release(slugs).items():
        notebooks.write(notebook, paths.release_notebook(slug))
        print(f"wrote {paths.release_notebook(slug).relative_to(paths.ROOT)}")


def build_manifest() -> None:
    paths.MANIFEST.write_text(manifest.dumps(manifest.build(paths.present_slugs())), encoding="utf-8")
    print(f"wrote {paths.MANIFEST.relative_to(paths.ROOT)}")


def check(slugs) -> list[str]:
    """Every difference between the committed files and what the build would write."""
    problems = []
    for slug in slugs:
        target = paths.solution_notebook(slug)
        if not target.exists():
            problems.append(f"{target.name} missing: run make notebooks")
            continue
        committed = nbformat.read(target, as_version=4)
        if notebooks.sources_of(committed) != notebooks.sources_of(notebooks.build_notebook(slug)):
            problems.append(f"{target.name} differs from {slug}.py: run make notebooks")
    for target, text in package.modules(paths.present_slugs()).items():
        path = paths.ROOT / target
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            problems.append(f"{target} differs from its notebook: run make package")
    for stale in package.generated_on_disk() - package.modules(paths.present_slugs()).keys():
        problems.append(f"{stale} is generated but no notebook exports it: run make package")
    for slug, notebook in release.release(slugs).items():
        path = paths.release_notebook(slug)
        expected = nbformat.writes(notebook, version=4) + "\n"
        if not path.exists() or path.read_text(encoding="utf-8") != expected:
            problems.append(f"{path.relative_to(paths.ROOT)} differs from nbgrader's release: run make release")
    if manifest.load() != manifest.build(paths.present_slugs()):
        problems.append("autograder/manifest.json is out of date: run make manifest")
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m coursebuild", description=__doc__)
    parser.add_argument("command", choices=["notebooks", "package", "release", "manifest", "all", "check", "bundle",
                                            "gradescope"])
    parser.add_argument("chapters", nargs="*", help="slugs or numbers (default: every chapter)")
    parser.add_argument("--execute", action="store_true", help="notebooks: run them for outputs")
    parser.add_argument("--upto", help="bundle: the last chapter handed out (slug or number)")
    parser.add_argument("--catch-up", action="store_true",
                        help="bundle: a latecomer's, every chapter before --upto complete (folder catch-up-NN)")
    parser.add_argument("--due", help="bundle: the last chapter already due (default: the one before --upto; 'none')")
    parser.add_argument("--out", type=Path, default=paths.ROOT / "dist", help="bundle, gradescope: where it goes (default: dist/)")
    args = parser.parse_intermixed_args(argv)
    if args.command == "bundle":
        if not args.upto:
            parser.error("bundle needs --upto NN")
        try:
            folder = bundle.build(args.upto, args.out, args.due, catch_up=args.catch_up)
        except (ValueError, FileExistsError) as error:
            parser.error(str(error))
        print(f"wrote {folder} and {folder.with_suffix('.zip').name}")
        return 0
    if args.command == "gradescope":
        if len(args.chapters) != 1:
            parser.error("gradescope needs one chapter: python -m coursebuild gradescope NN")
        try:
            archive = gradescope.build(args.chapters[0], args.out)
        except (ValueError, FileExistsError) as error:
            parser.error(str(error))
        print(f"wrote {archive}: upload it as the assignment's autograder (it holds the solutions: keep it private)")
        return 0
    slugs = paths.resolve_slugs(args.chapters)
    if args.command in ("notebooks", "all"):
        build_notebooks(slugs, run=args.execute)
    if args.command in ("package", "all"):
        build_package()
    if args.command in ("release", "all"):
        build_release(slugs)
    if args.command in ("manifest", "all"):
        build_manifest()
    if args.command == "check":
        problems = check(slugs)
        print("\n".join(problems) or "in sync")
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
