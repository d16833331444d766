"""minillm.registry: one rule for replacing, forward references resolved at lookup time."""
import sys
import types

import pytest

from minillm.registry import Registry


def test_object_entries_and_options():
    registry = Registry("widget")
    registry.register("plain", dict)
    registry.register("sized", dict, size=3)
    assert registry.get("plain") is dict
    assert registry.get("sized")() == {"size": 3}
    assert registry.names() == ("plain", "sized")
    assert "plain" in registry and "other" not in registry


def test_one_rule_for_replacing():
    registry = Registry("widget")
    registry.register("a", dict)
    registry.register("a", dict)  # the same entry again: nothing happens
    with pytest.raises(ValueError, match="widget 'a' is already registered.*replace=True"):
        registry.register("a", list)
    registry.register("a", list, replace=True)
    assert registry.get("a") is list


def test_unknown_name_lists_the_known_ones():
    registry = Registry("widget")
    registry.register("a", dict)
    with pytest.raises(ValueError, match="unknown widget 'b'; known: a"):
        registry.get("b")


def test_bad_entries_are_refused():
    registry = Registry("widget")
    with pytest.raises(TypeError, match="target must be callable"):
        registry.register("a", 3)
    with pytest.raises(ValueError, match="module:attribute"):
        registry.register("a", "no_colon")
    with pytest.raises(ValueError, match="non-empty str"):
        registry.register("", dict)


def test_forward_reference_reads_the_attribute_at_lookup(monkeypatch):
    module = types.ModuleType("fake_registry_target")
    module.thing = dict
    monkeypatch.setitem(sys.modules, "fake_registry_target", module)
    registry = Registry("widget")
    registry.register("t", "fake_registry_target:thing")
    assert registry.get("t") is dict
    module.thing = list  # what a student bundle does when it installs a learner's answer
    assert registry.get("t") is list


def test_forward_reference_to_a_missing_chapter_names_it():
    registry = Registry("attention backend")
    registry.register("later", "minillm.no_such_chapter_module:backend", chapter="99_future")
    assert "later" in registry  # declaring the name imports nothing
    with pytest.raises(ValueError, match=r"'later' comes from chapter 99_future \(minillm.no_such_chapter_module\), "
                                         "which this installation of minillm does not have"):
        registry.get("later")


def test_forward_reference_with_a_missing_dependency_names_the_package(monkeypatch, tmp_path):
    (tmp_path / "needs_missing_dep.py").write_text("import no_such_dependency_xyz\nthing = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = Registry("widget")
    registry.register("t", "needs_missing_dep:thing", chapter="10")
    with pytest.raises(ValueError, match="needs the package 'no_such_dependency_xyz'"):
        registry.get("t")


def test_forward_reference_to_a_missing_attribute():
    registry = Registry("widget")
    registry.register("t", "minillm.registry:NoSuchName")
    with pytest.raises(ValueError, match="defines no 'NoSuchName'"):
        registry.get("t")
