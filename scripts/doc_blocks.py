"""What the docs checkers share (scripts/check_doc_commands.py, doc_snippets.py,
run_doc_python.py): the pages they read, their fenced code blocks, and how they report."""
import sys


def doc_pages(root):
    """README.md and every page under docs/, in a fixed order."""
    return [root / "README.md"] + sorted((root / "docs").rglob("*.md"))


def code_blocks(page, lang):
    """(first line number, lines) of each ```lang block of a Markdown page."""
    block, start, lines = False, 0, []
    for n, line in enumerate(page.read_text(encoding="utf-8").split("\n"), 1):
        if line.startswith("```"):
            if block:
                yield start, lines
                block = False
            elif line[3:].strip() == lang:
                block, start, lines = True, n + 1, []
            continue
        if block:
            lines.append(line)


def report(tool, notes, faults, summary):
    """Prints what was not done (stdout) and the faults (stderr), then one line; the exit
    status: 1 when anything is at fault."""
    for x in notes:
        print(x)
    for f in faults:
        print(f, file=sys.stderr)
    print(f"{tool}: {summary}, " + (f"{len(faults)} faults" if faults else "none at fault"))
    return 1 if faults else 0
