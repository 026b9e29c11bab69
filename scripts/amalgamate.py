#!/usr/bin/env python3
"""Generates single_include/anvil/anvil.hpp from include/: every `#include <anvil/...>`
is replaced by that header's text the first time it is seen (so each header appears once,
after everything it includes), and dropped after that. System and third-party includes
are kept as written.

    scripts/amalgamate.py                 # regenerate single_include/anvil/anvil.hpp
    scripts/amalgamate.py --check         # exit 1 if the committed file is out of date
    scripts/amalgamate.py --output FILE   # write somewhere else
"""
import argparse
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
INCLUDE = ROOT / "include"
DEFAULT_OUT = ROOT / "single_include" / "anvil" / "anvil.hpp"
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*[<"](anvil/[^>"]+)[>"]\s*$')
PRAGMA_ONCE_RE = re.compile(r"^\s*#\s*pragma\s+once\s*$")


def version() -> str:
    text = (INCLUDE / "anvil" / "core" / "version.hpp").read_text()
    parts = [re.search(rf"#define ANVIL_VERSION_{p} (\d+)", text).group(1)
             for p in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(parts)


def inline(rel: str, seen: set, stack: list) -> list:
    if rel in seen:
        return []
    if rel in stack:
        raise SystemExit(f"amalgamate: include cycle: {' -> '.join(stack + [rel])}")
    path = INCLUDE / rel
    if not path.is_file():
        where = stack[-1] if stack else "the command line"
        raise SystemExit(f"amalgamate: {where} includes <{rel}>, which does not exist")
    stack.append(rel)
    out = [f"// ---- begin <{rel}> ----\n"]
    for line in path.read_text().splitlines(keepends=True):
        if PRAGMA_ONCE_RE.match(line):
            continue
        m = INCLUDE_RE.match(line)
        if m:
            out.extend(inline(m.group(1), seen, stack))
        else:
            out.append(line)
    out.append(f"// ---- end <{rel}> ----\n")
    stack.pop()
    seen.add(rel)
    return out


def generate() -> str:
    head = (
        "// anvil " + version() + ": single-header edition, generated from include/ by\n"
        "// `python3 scripts/amalgamate.py`. Do not edit: change include/ and regenerate.\n"
        "#pragma once\n"
    )
    return head + "".join(inline("anvil/anvil.hpp", set(), []))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--output", type=pathlib.Path, default=DEFAULT_OUT)
    ap.add_argument("--check", action="store_true",
                    help="compare with the output file instead of writing it")
    args = ap.parse_args()
    text = generate()
    if args.check:
        current = args.output.read_text() if args.output.is_file() else None
        if current != text:
            print(f"amalgamate: {args.output} is out of date; run scripts/amalgamate.py and commit it",
                  file=sys.stderr)
            return 1
        print(f"amalgamate: {args.output.name} is up to date")
        return 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
