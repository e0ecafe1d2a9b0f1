"""`python -m gpuflow.specs.reference --write DIR | --check DIR`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpuflow.specs.reference import COMMAND, pages, stale, undescribed, unexampled


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuflow.specs.reference", description=__doc__)
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", metavar="DIR", help="write the pages (job.md, fleet.md, ...)")
    action.add_argument("--check", metavar="DIR", help="exit 1 if a page differs from the models")
    args = parser.parse_args(argv)
    if args.write:
        folder = Path(args.write)
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in pages().items():
            (folder / name).write_text(text)
            print(f"wrote {folder / name}")
        missing = undescribed()
        if missing:  # a docstring under the field (or Field(description=...)) fills the cell
            print(f"{len(missing)} fields have no description: {', '.join(missing)}")
        missing = unexampled()
        if missing:  # Field(examples=[...]) fills the cell
            print(f"{len(missing)} fields have no example of their own: {', '.join(missing)}")
        return 0
    out_of_date = stale(args.check)
    for name in out_of_date:
        print(f"{Path(args.check) / name} is out of date; run `{COMMAND}`", file=sys.stderr)
    return 1 if out_of_date else 0


if __name__ == "__main__":
    sys.exit(main())
