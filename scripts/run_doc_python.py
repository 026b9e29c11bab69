#!/usr/bin/env python3
"""Runs the Python snippets of anvil's docs (README.md and docs/*.md, ```python blocks) as
written, each page's in order in one namespace (as a reader types them into one session),
in an empty directory, with the built package importable (`--package build/python`).

Each snippet has a context below, keyed by its page and first line: what a reader has
around it (the module `my_envs` a snippet imports: tests/python/envs' Pendulum under that
name), or the package it needs, without which it is skipped and said so. A snippet with no
context fails the run, naming it, so a new snippet is run from the day it is written. A
snippet that trains may have a shorter budget (SHORTER), the one change made to its text.

Usage: scripts/run_doc_python.py --package DIR [--root DIR]   (exit 1 naming page and line)
"""
import argparse
import os
import pathlib
import sys
import tempfile
import traceback

from doc_blocks import code_blocks, doc_pages, report

# (page, first line) -> what it needs: "needs:MODULE" (skipped, said so, without it),
# "my_envs" (a module my_envs with a Gymnasium-style Pendulum), or "" (nothing more).
CONTEXTS = {
    ("docs/pixels.md", 'observation_space = gymnasium.spaces.Dict({"rgb": Box(0, 255, (96, 96, 3), np.uint8),'):
        "needs:gymnasium",
    ("docs/python_module.md", "import anvil"): "my_envs",
    ("docs/python_module.md", "import numpy as np, anvil"): "",
    ("docs/python_module.md", "import torch, anvil"): "needs:torch",
}
PRELUDE = {"needs:gymnasium": "import gymnasium, numpy as np\nfrom gymnasium.spaces import Box\n"}
# (page, first line) -> (text, shorter): the one change made to a snippet's text, a training
# budget cut so that the test runs in seconds (the calls are the same; the budget a reader
# would train with is the page's).
SHORTER = {
    ("docs/python_module.md", "import anvil"): ('"train.steps": 20000', '"train.steps": 2000'),
}


def snippets(root):
    for page in doc_pages(root):
        for start, lines in code_blocks(page, "python"):
            yield page.relative_to(root).as_posix(), start, "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=str(pathlib.Path(__file__).resolve().parent.parent))
    ap.add_argument("--package", required=True)
    args = ap.parse_args()
    root = pathlib.Path(args.root).resolve()
    sys.path[:0] = [str(pathlib.Path(args.package).resolve()), str(root / "tests" / "python" / "envs")]
    faults, ran, skipped = [], 0, []
    namespaces = {}
    with tempfile.TemporaryDirectory() as work:
        os.chdir(work)
        pathlib.Path("my_envs.py").write_text("from pendulum import Pendulum  # tests/python/envs: a Gymnasium-style env\n")
        sys.path.insert(0, work)
        for page, line, code in snippets(root):
            key = (page, code.split("\n")[0])
            if key not in CONTEXTS:
                faults.append(f"{page}:{line}: a Python snippet with no context in scripts/run_doc_python.py "
                              f"(first line: {key[1]!r}); add one so that it is run")
                continue
            need = CONTEXTS[key]
            if need.startswith("needs:"):
                try:
                    __import__(need[6:])
                except ImportError:
                    skipped.append(f"{page}:{line}: not run: {need[6:]} is not installed")
                    continue
            if key in SHORTER:
                text, shorter = SHORTER[key]
                if text not in code:
                    faults.append(f"{page}:{line}: the snippet no longer holds {text!r} (SHORTER in "
                                  "scripts/run_doc_python.py): update the budget cut")
                    continue
                code = code.replace(text, shorter)
            ns = namespaces.setdefault(page, {"__name__": "__doc__"})
            try:
                exec(compile(PRELUDE.get(need, "") + code, f"{page}:{line}", "exec"), ns)
                ran += 1
            except Exception:  # noqa: BLE001 - any failure of a snippet is reported
                faults.append(f"{page}:{line}: {traceback.format_exc(limit=3).strip().splitlines()[-1]}")
    return report("run_doc_python", skipped, faults, f"{ran} snippets ran, {len(skipped)} skipped (said above)")


if __name__ == "__main__":
    sys.exit(main())
