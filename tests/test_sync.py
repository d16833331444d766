"""The committed notebooks, package, chapters and manifest are what the build writes."""
import nbformat
import pytest

from coursebuild import manifest, notebooks, package, paths, release

from .conftest import SLUGS


@pytest.mark.parametrize("slug", SLUGS)
def test_solution_notebook_matches_its_source(slug):
    committed = nbformat.read(paths.solution_notebook(slug), as_version=4)
    assert notebooks.sources_of(committed) == notebooks.sources_of(notebooks.build_notebook(slug)), (
        f"{slug}.ipynb differs from {slug}.py: run `make notebooks CHAPTERS={slug}`")


@pytest.mark.parametrize("slug", SLUGS)
def test_solution_notebook_was_executed(slug):
    committed = nbformat.read(paths.solution_notebook(slug), as_version=4)
    code = [c for c in committed.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code), f"{slug}: run `make notebooks` to store outputs"


def test_package_matches_the_notebooks():
    texts = package.modules(SLUGS)
    for target, text in texts.items():
        assert (paths.ROOT / target).read_text(encoding="utf-8") == text, f"{target}: run `make package`"
    assert package.generated_on_disk() == set(texts), "stale generated modules: run `make package`"


def test_release_matches_nbgrader():
    for slug, notebook in release.release(SLUGS).items():
        expected = nbformat.writes(notebook, version=4) + "\n"
        assert paths.release_notebook(slug).read_text(encoding="utf-8") == expected, (
            f"chapters/{slug} differs from nbgrader's release: run `make release`")


def test_manifest_matches_the_solutions():
    assert manifest.load() == manifest.build(SLUGS), "run `make manifest`"


def test_chapters_folder_holds_only_released_chapters():
    released = {p.name for p in paths.CHAPTERS.iterdir()}
    assert released == set(SLUGS)
