#!/usr/bin/env python3
"""Holds the CUDA kernels to the committed thresholds of the GPU memory model.

    check_gpu_model.py REPORT THRESHOLDS            check; exit 1 on any miss
    check_gpu_model.py REPORT THRESHOLDS --update   rewrite THRESHOLDS' numbers from REPORT
                                                    where a kernel got better (a ratchet),
                                                    keeping every reason

REPORT is the report.md of the emulated device's coalescing profiler (profile.sh; see
scripts/gpu-model-check.sh). THRESHOLDS is benchmarks/model/thresholds.md: one line per case
and kernel, each number a bound the model's figure must meet:

  Little bound          >= : bytes in flight per SM against Little's law (100% at most)
  load / store sect-eff >= : bytes used of the 32-byte sectors a warp's request touches
  L1 per DRAM           <= : L1 sectors requested per distinct DRAM sector
  footprint / minimum   <= : the case's DRAM sectors against the bytes the op must move

"-" leaves a figure unchecked (a launch-bound shape's Little bound, a kernel that stores
nothing). A case and kernel in the report without a line, or a line without a report row,
fails too: every kernel the model sees has a line, and a renamed one is re-examined.

The model is a model: it cannot see caches, instruction issue or latency chains, so meeting
it is necessary, not sufficient (docs/performance.md compares it with an H100).
"""
import argparse
import re
import sys

COLUMNS = ["case", "kernel", "Little bound", "load sect-eff", "store sect-eff", "L1 per DRAM",
           "footprint / minimum", "why"]
# column -> (direction, how to print)
CHECKS = {
    "Little bound": (">=", "{:.0f}%"),
    "load sect-eff": (">=", "{:.0f}%"),
    "store sect-eff": (">=", "{:.0f}%"),
    "L1 per DRAM": ("<=", "{:.2f}"),
    "footprint / minimum": ("<=", "{:.3f}"),
}


# The targets of docs/performance.md's model (issue-free kernels meet them); the section
# efficiencies have none, their thresholds are each kernel's present figure.
TARGETS = {"Little bound": 100.0, "L1 per DRAM": 2.0, "footprint / minimum": 1.02}


def misses(column, bound, target):
    """Whether a threshold `bound` is looser than `target`."""
    return bound < target if CHECKS[column][0] == ">=" else bound > target


def table_rows(lines, first_header):
    """The rows (lists of cells) of the markdown table whose header starts with first_header."""
    header, rows = None, []
    for line in lines:
        if header is None:
            if line.startswith("| " + first_header):
                header = [c.strip() for c in line.strip().strip("|").split("|")]
            continue
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if set("".join(cells)) <= set("-: "):
            continue  # the separator line
        rows.append(dict(zip(header, cells)))
    if header is None:
        raise SystemExit("check_gpu_model: no table starting '| %s' in the report" % first_header)
    return header, rows


def number(text):
    m = re.match(r"\s*([0-9.]+)", text)
    return float(m.group(1)) if m else None


def read_report(path):
    """{(case, kernel): {figure: value}} from the profiler's report.md."""
    lines = open(path).read().splitlines()
    header, kernels = table_rows(lines, "case | kernel |")
    for need in ("sect-eff ld/st", "L1 sectors per DRAM sector", "Little bound"):
        if need not in header:
            raise SystemExit("check_gpu_model: the report has no '%s' column" % need)
    _, cases = table_rows(lines, "case | kernels |")
    footprint = {r["case"]: number(r["footprint / minimum"]) for r in cases}
    out = {}
    for r in kernels:
        ld, _, st = r["sect-eff ld/st"].partition("/")
        little = r["Little bound"]
        if not little or not little[0].isdigit():
            raise SystemExit("check_gpu_model: no Little bound for %s | %s (is nvdisasm there?)"
                             % (r["case"], r["kernel"]))
        figures = {
            "Little bound": number(little),
            "load sect-eff": number(ld),
            "store sect-eff": number(st),
            "L1 per DRAM": number(r["L1 sectors per DRAM sector"]),
            "footprint / minimum": footprint.get(r["case"]),
        }
        key = (r["case"], r["kernel"])
        if key in out:  # the same kernel launched twice in a case: the worse figures
            for k, (direction, _) in CHECKS.items():
                a, b = out[key][k], figures[k]
                if a is not None and b is not None:
                    figures[k] = min(a, b) if direction == ">=" else max(a, b)
        out[key] = figures
    return out


def read_thresholds(path):
    text = open(path).read()
    lines = text.splitlines()
    header, rows = table_rows(lines, "case | kernel |")
    if header != COLUMNS:
        raise SystemExit("check_gpu_model: %s: the table's columns must be %s" % (path, COLUMNS))
    return text, rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("report")
    ap.add_argument("thresholds")
    ap.add_argument("--update", action="store_true")
    args = ap.parse_args()
    report = read_report(args.report)
    text, rows = read_thresholds(args.thresholds)

    failures, seen, improved = [], set(), []
    for row in rows:
        key = (row["case"], row["kernel"])
        if key not in report:
            failures.append("%s | %s: a threshold line, but the report has no such kernel "
                            "(renamed or gone? update the table)" % key)
            continue
        seen.add(key)
        for column, (direction, fmt) in CHECKS.items():
            bound = number(row[column]) if row[column] != "-" else None
            value = report[key][column]
            if bound is None:
                continue
            if value is None:
                failures.append("%s | %s: no %s in the report" % (key + (column,)))
                continue
            shown = fmt.format(value)
            ok = value >= number(fmt.format(bound)) if direction == ">=" else \
                number(shown) <= bound
            if not ok:
                failures.append("%s | %s: %s %s, the threshold is %s %s"
                                % (key + (column, shown, direction, row[column])))
            elif number(shown) != bound and (column not in TARGETS or
                                             misses(column, bound, TARGETS[column])):
                # an exception that got better: tighten it, not past the target
                target = TARGETS.get(column)
                if target is not None and misses(column, target, value):
                    shown = fmt.format(target)
                improved.append((row, column, shown))
    for key in sorted(set(report) - seen):
        failures.append("%s | %s: in the report, but no threshold line (add one to %s)"
                        % (key + (args.thresholds,)))

    if args.update:
        new = text
        for row, column, shown in improved:
            old_line = "| " + " | ".join(row[c] for c in COLUMNS) + " |"
            row[column] = shown
            new_line = "| " + " | ".join(row[c] for c in COLUMNS) + " |"
            new = new.replace(old_line, new_line)
        open(args.thresholds, "w").write(new)
        print("check_gpu_model: %d figures tightened in %s" % (len(improved), args.thresholds))

    checked = sum(1 for r in rows for c in CHECKS if r[c] != "-")
    for f in failures:
        print("check_gpu_model: FAIL " + f)
    for row, column, shown in improved if not args.update else []:
        print("check_gpu_model: better than the table: %s | %s: %s %s (was %s; --update)"
              % (row["case"], row["kernel"], column, shown, row[column]))
    print("check_gpu_model: %d kernels, %d figures checked, %d failed"
          % (len(rows), checked, len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
