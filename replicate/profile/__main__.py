"""``python -m replicate.profile TRACE.json [...]``: the summary of each trace (``summary``)."""

from __future__ import annotations

import sys

from . import load, summary


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m replicate.profile TRACE.json [more traces]")
        return 0 if argv else 2
    for path in argv:
        print(f"# {path}")
        print(summary(load(path)))
    return 0



if __name__ == "__main__":
    sys.exit(main())
