#!/usr/bin/env python3
"""Checks anvil's Markdown: the README stays a front door (at most 250 lines; new material
goes to docs/), benchmarks/RESULTS.md a summary (at most 200 lines; figures in full go to
docs/benchmarks/), and every relative link in README.md, CHANGELOG.md, docs/ and
benchmarks/RESULTS.md leads somewhere: to a file that exists and, where it names a section
(`page.md#section`), to a heading of that page (GitHub's anchors: lower case, punctuation
dropped, spaces to hyphens, "-1", "-2" for repeats). Links inside code are not links.

Usage: scripts/check_docs.py [--root DIR]   (exit 1 naming each file, line and link at fault)
       scripts/check_docs.py --selftest     (a tree with one fault of each kind is refused)
"""
import argparse
import pathlib
import re
import sys
import tempfile

README_MAX_LINES = 250
RESULTS_MAX_LINES = 200
LINK = re.compile(r"\]\(([^)\s]+)\)")  # the target of a link, its text on this line or the one before


def prose_lines(text, keep_code=False):
    """(line number, line) outside fenced code, with inline code blanked (or kept)."""
    fence = False
    for n, line in enumerate(text.split("\n"), 1):
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        if not fence:
            yield n, line if keep_code else re.sub(r"`[^`]*`", "``", line)


def anchors(path):
    """The section anchors of a Markdown page, as GitHub makes them."""
    seen, out = {}, set()
    for _, line in prose_lines(path.read_text(encoding="utf-8"), keep_code=True):
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        k = seen.get(slug, 0)
        seen[slug] = k + 1
        out.add(slug if k == 0 else f"{slug}-{k}")
    return out


def pages(root):
    found = [root / "README.md", root / "CHANGELOG.md", root / "benchmarks" / "RESULTS.md"]
    found += sorted((root / "docs").rglob("*.md")) if (root / "docs").is_dir() else []
    return [p for p in found if p.is_file()]


def check(root):
    faults = []
    readme = root / "README.md"
    if not readme.is_file():
        return [f"{readme}: missing"]
    n = len(readme.read_text(encoding="utf-8").splitlines())
    if n > README_MAX_LINES:
        faults.append(f"README.md: {n} lines; it stays a front door of at most {README_MAX_LINES} "
                      "(move the new material to a page in docs/ and link it)")
    results = root / "benchmarks" / "RESULTS.md"
    if results.is_file():
        n = len(results.read_text(encoding="utf-8").splitlines())
        if n > RESULTS_MAX_LINES:
            faults.append(f"benchmarks/RESULTS.md: {n} lines; it stays a summary of at most {RESULTS_MAX_LINES} "
                          "(the figures in full go to a page in docs/benchmarks/)")
    cache = {}
    for page in pages(root):
        rel = page.relative_to(root)
        for n, line in prose_lines(page.read_text(encoding="utf-8")):
            for target in LINK.findall(line):
                if re.match(r"[a-z]+:", target):  # https:, mailto:
                    continue
                path, _, section = target.partition("#")
                dest = (page.parent / path).resolve() if path else page
                if not dest.exists():
                    faults.append(f"{rel}:{n}: link ({target}): no file {path}")
                    continue
                if section:
                    if dest.suffix != ".md":
                        faults.append(f"{rel}:{n}: link ({target}): a section of a file that is not Markdown")
                        continue
                    if dest not in cache:
                        cache[dest] = anchors(dest)
                    if section not in cache[dest]:
                        faults.append(f"{rel}:{n}: link ({target}): {dest.name} has no section #{section}")
    return faults


def selftest():
    """A tree with a long README, a missing file and a missing section: all three named."""
    with tempfile.TemporaryDirectory() as d:
        root = pathlib.Path(d)
        (root / "docs").mkdir()
        (root / "docs" / "a.md").write_text("# A\n\n## Some section\n\n[ok](#some-section) [bad](#none)\n"
                                            "`[code](nowhere.md)`\n```\n[fenced](nowhere.md)\n```\n")
        (root / "README.md").write_text("[a](docs/a.md#some-section) [gone](docs/gone.md)\n" + "x\n" * 260)
        faults = check(root)
        want = ["README.md: 261 lines", "README.md:1: link (docs/gone.md): no file docs/gone.md",
                "docs/a.md:5: link (#none): a.md has no section #none"]
        ok = len(faults) == 3 and all(any(f.startswith(w) for f in faults) for w in want)
        print("\n".join(faults))
        print("selftest:", "the faults are named" if ok else "FAILED: expected " + "; ".join(want))
        return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=str(pathlib.Path(__file__).resolve().parent.parent))
    ap.add_argument("--selftest", action="store_true")
    args = ap.parse_args()
    if args.selftest:
        return selftest()
    root = pathlib.Path(args.root).resolve()
    faults = check(root)
    for f in faults:
        print(f, file=sys.stderr)
    n = len(pages(root))
    print(f"check_docs: {n} pages, " + ("every link leads somewhere" if not faults else f"{len(faults)} faults"))
    return 1 if faults else 0


if __name__ == "__main__":
    sys.exit(main())
