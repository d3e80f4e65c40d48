#!/usr/bin/env python3
"""The C structs and enums of a baseline keep their layout and values (docs/abi.md, rules 1-3).

    scripts/abi_layout_check.py BASELINE.abi CURRENT.abi

Compares two abidw dumps, for every struct and enum the baseline defines, and fails (exit 1,
naming each break) where
  - a field of the baseline is gone, or sits at another offset, or has another type (its size
    or its name: int32_t for int64_t, an enum for another, a pointer to another type);
  - a new field starts below the baseline's sizeof (in its old tail padding: a program built
    with the older header passes a struct whose padding the library would read as the field);
  - an enumerator of the baseline is gone or has another value.
abidiff's compatible mode (abi/compare.suppr) lets a struct that only grew through: with
libabigail 2.2 the suppression also hides a retyped, resized or reordered field and a
renumbered enumerator inside such a struct, so these rules are checked here.
"""

import re
import sys
import xml.etree.ElementTree as ET

# The C header's types (embrope.h's and DLPack's): the dump also holds the C++ types behind the
# opaque handles, whose internals are not part of the C ABI (abi/opaque.suppr), and whose names
# repeat (every std::vector's _Vector_impl_data).
C_TYPE = re.compile(r"^(embrope_\w*_t|DL\w+)$")


class Dump:
    """The types of one abidw dump, by id."""

    def __init__(self, path: str):
        self.root = ET.parse(path).getroot()
        self.by_id = {e.get("id"): e for e in self.root.iter() if e.get("id")}

    def describe(self, type_id: str, depth: int = 0) -> str:
        """A type as text that differs when its layout or meaning does."""
        e = self.by_id.get(type_id)
        if e is None or depth > 16:
            return f"?{type_id}"
        tag, size = e.tag, e.get("size-in-bits", "")
        inner = lambda: self.describe(e.get("type-id"), depth + 1)  # noqa: E731
        if tag == "type-decl":
            return f"{e.get('name')}/{size}"
        if tag == "typedef-decl":
            return f"{e.get('name')}={inner()}"
        if tag == "pointer-type-def":
            return f"{inner()}*"
        if tag == "reference-type-def":
            return f"{inner()}&"
        if tag == "qualified-type-def":
            quals = [q for q in ("const", "volatile", "restrict") if e.get(q) == "yes"]
            return " ".join(quals + [inner()])
        if tag == "array-type-def":
            lengths = [s.get("length") for s in e.iter("subrange")]
            return f"{inner()}[{']['.join(lengths)}]"
        if tag in ("class-decl", "union-decl", "enum-decl"):
            name = e.get("name") or ""
            if not name and e.get("naming-typedef-id"):
                name = self.by_id.get(e.get("naming-typedef-id"), e).get("name", "")
            return f"{tag.split('-')[0]} {name}/{size}"
        if tag == "function-type":
            parts = [self.describe(p.get("type-id"), depth + 1) for p in e.iter("parameter")]
            ret = e.find("return")
            back = self.describe(ret.get("type-id"), depth + 1) if ret is not None else "void"
            return f"{back}({', '.join(parts)})"
        return f"{tag}/{size}"

    def structs(self) -> dict:
        """name -> (size in bits, {field: (offset in bits, type)}) of every defined struct."""
        out = {}
        for decl in self.root.iter("class-decl"):
            name, size = decl.get("name"), decl.get("size-in-bits")
            if (not name or not C_TYPE.match(name) or size is None
                    or decl.get("is-declaration-only") == "yes"):
                continue
            fields = {}
            for member in decl.findall("data-member"):
                var = member.find("var-decl")
                if var is not None:
                    fields[var.get("name")] = (int(member.get("layout-offset-in-bits", "0")),
                                               self.describe(var.get("type-id")))
            out[name] = (int(size), fields)
        return out

    def enums(self) -> dict:
        """name -> {enumerator: value} of every named enum."""
        out = {}
        for decl in self.root.iter("enum-decl"):
            name = decl.get("name")
            if name and C_TYPE.match(name) and decl.get("is-declaration-only") != "yes":
                out[name] = {n.get("name"): int(n.get("value")) for n in decl.iter("enumerator")}
        return out


def breaks(old: Dump, new: Dump) -> list:
    bad = []
    new_structs = new.structs()
    for name, (old_size, old_fields) in sorted(old.structs().items()):
        if name not in new_structs:
            continue  # a type no longer reached: abidiff reports what dropped it
        _, fields = new_structs[name]
        for field, (offset, type_) in sorted(old_fields.items(), key=lambda f: f[1][0]):
            if field not in fields:
                bad.append(f"{name}.{field} (byte {offset // 8}) is gone")
                continue
            new_offset, new_type = fields[field]
            if new_offset != offset:
                bad.append(f"{name}.{field} moved from byte {offset // 8} to {new_offset // 8}")
            if new_type != type_:
                bad.append(f"{name}.{field} changed type from {type_} to {new_type}")
        for field, (offset, _) in sorted(fields.items(), key=lambda f: f[1][0]):
            if field not in old_fields and offset < old_size:
                bad.append(f"{name}.{field} starts at byte {offset // 8}, inside the previous "
                           f"sizeof {old_size // 8} (its tail padding)")
    new_enums = new.enums()
    for name, values in sorted(old.enums().items()):
        if name not in new_enums:
            continue
        for enumerator, value in sorted(values.items(), key=lambda v: v[1]):
            now = new_enums[name].get(enumerator)
            if now is None:
                bad.append(f"{name}::{enumerator} (= {value}) is gone")
            elif now != value:
                bad.append(f"{name}::{enumerator} changed from {value} to {now}")
    return bad


def main(argv: list) -> int:
    if len(argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    bad = breaks(Dump(argv[1]), Dump(argv[2]))
    for line in bad:
        print(f"abi-check: {line}: not compatible within a SONAME (docs/abi.md)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
