"""The table of an array-api-tests run (bench/array_api.sh): passed, skipped, and the failures by
reason, each reason with its count and a few test ids; then passed/failed/skipped per test file.

    python bench/array_api_table.py REPORT.json     # the table of a pytest-json-report file
    python bench/array_api_table.py --patch SUITE   # make a copy of the suite importable

A failure's reason is the first rule below that its message matches; "wrong value" and "wrong
dtype" are what the suite found computed differently from the standard (the target: none among
the functions the library has), "error" an exception the library raised where the standard
expects a result.
"""

from __future__ import annotations

import collections
import json
import re
import sys

REASONS = [  # (reason, pattern of the failure's message)
    ("complex dtypes: the library has none", r"no real float dtype to match None|complex"),
    ("missing: a function or attribute the library does not have",
     r"is missing the|not found in|is not defined in|has no attribute|'NoneType' object is "
     r"not callable"),
    ("immutable: Arrays have no item assignment", r"item assignment|__setitem__"),
    ("no device= keyword (a step places its values itself)", r"'device'"),
    ("signature: argument names or kinds differ from the standard's",
     r"Expected argument|missing from signature|unexpected keyword argument|positional"),
    ("default float is float32 (documented: replicate/numpy/__init__.py)",
     r"default floating-point dtype"),
    ("NumPy's tuple where the standard says list", r"<class 'tuple'> == <class 'list'>"),
    ("wrong dtype", r"dtype"),
    ("wrong value", r"AssertionError|assert "),
    ("error", r""),
]

# the suite's two lines that fail for a library without complex dtypes (which it otherwise
# supports through ARRAY_API_TESTS_SKIP_DTYPES): (file, line as it is, line as it becomes)
PATCHES = [
    ("array_api_tests/dtype_helpers.py",
     "    [(dt, dtype_nbits[dt]) for dt in complex_dtypes], key=lambda x: x[1]\n)[0]",
     "    [(dt, dtype_nbits[dt]) for dt in complex_dtypes], key=lambda x: x[1], "
     "default=(None, 0)\n)[0]"),
    ("array_api_tests/test_signatures.py",
     "cmplx_name = dh.dtype_to_name[dh.widest_complex_dtype]",
     "cmplx_name = (dh.dtype_to_name[dh.widest_complex_dtype] if dh.widest_complex_dtype "
     "is not None else 'complex128')"),
]


def patch(suite: str) -> None:
    for path, old, new in PATCHES:
        path = f"{suite}/{path}"
        text = open(path).read()
        if old not in text:
            sys.exit(f"array_api_table.py --patch: {path} has changed (no {old!r}); update PATCHES")
        open(path, "w").write(text.replace(old, new))


def message(test) -> str:
    for stage in ("setup", "call", "teardown"):
        part = test.get(stage) or {}
        if part.get("outcome") == "failed":
            crash = (part.get("crash") or {}).get("message", "")
            return crash + "\n" + str(part.get("longrepr", ""))[-3000:]
    return ""


def reason(text: str) -> str:
    first = text.split("\n", 1)[0]
    for name, pattern in REASONS[:-1]:  # the crash line first, then the whole report
        if re.search(pattern, first):
            return name
    for name, pattern in REASONS:
        if re.search(pattern, text):
            return name
    return "error"


def table(report: dict) -> str:
    tests = report["tests"]
    outcomes = collections.Counter(t["outcome"] for t in tests)
    failed = [t for t in tests if t["outcome"] in ("failed", "error")]
    by_reason = collections.defaultdict(list)
    for t in failed:
        by_reason[reason(message(t))].append(t["nodeid"].split("::", 1)[-1])
    lines = [f"{len(tests)} tests: {outcomes['passed']} passed, {len(failed)} failed, "
             f"{outcomes['skipped']} skipped", "", "| failed: reason | tests | e.g. |",
             "|---|---:|---|"]
    order = [name for name, _ in REASONS]
    for name in sorted(by_reason, key=order.index):
        ids = by_reason[name]
        lines.append(f"| {name} | {len(ids)} | {', '.join(i[:60] for i in ids[:3])} |")
    lines += ["", "| file | passed | failed | skipped |", "|---|---:|---:|---:|"]
    per_file = collections.defaultdict(collections.Counter)
    for t in tests:
        outcome = "failed" if t["outcome"] == "error" else t["outcome"]
        per_file[t["nodeid"].split("::", 1)[0].split("/")[-1]][outcome] += 1
    for name, c in sorted(per_file.items()):
        lines.append(f"| {name} | {c['passed']} | {c['failed']} | {c['skipped']} |")
    for name in ("wrong value", "wrong dtype", "error"):
        if by_reason.get(name):
            lines += ["", f"{name}:"] + [f"  {i}" for i in by_reason[name]]
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--patch"]:
        patch(sys.argv[2])
    else:
        print(table(json.load(open(sys.argv[1]))))
