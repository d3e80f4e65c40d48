#!/usr/bin/env python3
"""Fields added to a C struct start at or past its previous sizeof (docs/abi.md, rule 1).

    scripts/abi_tail_check.py BASELINE.abi CURRENT.abi

abidiff counts a data member added after the last one as appended, even when it sits in the
old struct's tail padding: a program built with the older header passes a struct whose padding
the library would then read as the new field. This compares the two abidw dumps and fails
(exit 1, naming the struct and field) on a new field that starts below the baseline's size.
"""

import sys
import xml.etree.ElementTree as ET


def structs(path: str) -> dict:
    """name -> (size in bits, {field name: offset in bits}) of every defined struct."""
    out = {}
    for decl in ET.parse(path).getroot().iter("class-decl"):
        name, size = decl.get("name"), decl.get("size-in-bits")
        if not name or size is None or decl.get("is-declaration-only") == "yes":
            continue
        fields = {}
        for member in decl.iter("data-member"):
            var = member.find("var-decl")
            if var is not None:
                fields[var.get("name")] = int(member.get("layout-offset-in-bits", "0"))
        out[name] = (int(size), fields)
    return out


def main(argv: list) -> int:
    if len(argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    old, new = structs(argv[1]), structs(argv[2])
    bad = []
    for name, (size, fields) in sorted(new.items()):
        if name not in old:
            continue
        old_size, old_fields = old[name]
        for field, offset in sorted(fields.items(), key=lambda f: f[1]):
            if field not in old_fields and offset < old_size:
                bad.append(f"{name}.{field} starts at byte {offset // 8}, inside the previous "
                           f"sizeof {old_size // 8} (its tail padding)")
    for line in bad:
        print(f"abi-check: {line}: a new field goes past the previous sizeof (docs/abi.md)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
