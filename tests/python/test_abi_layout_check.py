"""scripts/abi_layout_check.py fails on each break of docs/abi.md's rules 1-2 and on renumbered
enumerators, on edited copies of the committed baseline abi/libembrope.abi, and passes the
baseline against itself and a field appended past the previous sizeof."""

import copy
import pathlib
import sys
import xml.etree.ElementTree as ET

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import abi_layout_check  # noqa: E402

BASELINE = ROOT / "abi" / "libembrope.abi"
STRUCT = "embrope_rope_options_t"


def dump(tree, tmp_path, name="current.abi"):
    path = tmp_path / name
    tree.write(path)
    return abi_layout_check.Dump(str(path))


def struct(tree, name=STRUCT):
    return next(d for d in tree.getroot().iter("class-decl")
                if d.get("name") == name and d.get("size-in-bits"))


def member(decl, field):
    return next(m for m in decl.findall("data-member") if m.find("var-decl").get("name") == field)


def type_id_named(tree, name):
    return next(e.get("id") for e in tree.getroot().iter("typedef-decl") if e.get("name") == name)


def breaks(edit, tmp_path):
    tree = ET.parse(BASELINE)
    edit(tree)
    return abi_layout_check.breaks(abi_layout_check.Dump(str(BASELINE)), dump(tree, tmp_path))


def test_the_baseline_against_itself_passes(tmp_path):
    assert breaks(lambda tree: None, tmp_path) == []


def test_a_field_appended_past_the_previous_sizeof_passes(tmp_path):
    def append(tree):
        decl = struct(tree)
        size = int(decl.get("size-in-bits"))
        new = copy.deepcopy(member(decl, "inverse"))
        new.set("layout-offset-in-bits", str(size))
        new.find("var-decl").set("name", "appended")
        decl.append(new)
        decl.set("size-in-bits", str(size + 64))

    assert breaks(append, tmp_path) == []


def test_a_retyped_field_fails(tmp_path):
    def retype(tree):
        member(struct(tree), "inverse").find("var-decl").set("type-id",
                                                             type_id_named(tree, "int64_t"))

    found = breaks(retype, tmp_path)
    assert len(found) == 1 and f"{STRUCT}.inverse changed type" in found[0]
    assert "int32_t" in found[0] and "int64_t" in found[0]


def test_a_moved_field_fails(tmp_path):
    def move(tree):
        member(struct(tree), "rotary_dim").set("layout-offset-in-bits", "192")

    assert breaks(move, tmp_path) == [f"{STRUCT}.rotary_dim moved from byte 16 to 24"]


def test_a_removed_field_fails(tmp_path):
    def remove(tree):
        decl = struct(tree)
        decl.remove(member(decl, "deferred"))

    assert breaks(remove, tmp_path) == [f"{STRUCT}.deferred (byte 64) is gone"]


def test_a_field_in_the_old_tail_padding_fails(tmp_path):
    def into_padding(tree):
        decl = struct(tree)
        size = int(decl.get("size-in-bits"))
        new = copy.deepcopy(member(decl, "inverse"))
        new.set("layout-offset-in-bits", str(size - 32))
        new.find("var-decl").set("name", "in_padding")
        decl.append(new)
        decl.set("size-in-bits", str(size + 64))

    found = breaks(into_padding, tmp_path)
    assert len(found) == 1 and f"{STRUCT}.in_padding starts at byte" in found[0]


@pytest.mark.parametrize("change", ["renumbered", "removed"])
def test_an_enumerator_renumbered_or_removed_fails(tmp_path, change):
    def edit(tree):
        decl = next(d for d in tree.getroot().iter("enum-decl")
                    if d.get("name") == "embrope_rope_layout_t")
        e = next(n for n in decl.iter("enumerator") if n.get("name") == "EMBROPE_ROPE_INTERLEAVED")
        if change == "renumbered":
            e.set("value", "2")
        else:
            decl.remove(e)

    want = ("embrope_rope_layout_t::EMBROPE_ROPE_INTERLEAVED changed from 1 to 2"
            if change == "renumbered" else
            "embrope_rope_layout_t::EMBROPE_ROPE_INTERLEAVED (= 1) is gone")
    assert breaks(edit, tmp_path) == [want]
