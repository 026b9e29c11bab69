#!/usr/bin/env python3
"""Checks the shell commands in anvil's docs (README.md and docs/*.md, ```sh and ```bash
blocks) against the build: every anvil program a command runs exists in the build, and its
command line is valid: the program parses it with `--print-config` appended (every key
known, every value in range, every --config file readable), which runs nothing (a file or
run directory the command names that appears is a fault: the program ran it). A sweep
(`--multirun k=a,b ...`) is checked run by run. Scripts a command runs must exist and be
executable. A YAML config in the docs (```yaml) is given to a main as `--config FILE`
with `--print-config` (train_sac_pendulum, or the main YAML_PROGRAMS names), and a CMake
snippet (```cmake) must be what the package test's consumer project does
(tests/package/consumer/CMakeLists.txt, `my_trainer` being its `consumer`).

Not run, and said so: a command whose program is an optional component this build lacks, a
command with a placeholder (`<the run>`), and one that reads what an earlier command of
the same block writes (an evaluation of the run trained above).

Usage: scripts/check_doc_commands.py --build DIR [--root DIR]   (exit 1 naming page, line
and command at fault)
       scripts/check_doc_commands.py --build DIR --selftest  (a page with a bad key, a
       missing script, a bad sweep value, a bad YAML key and a CMake line no test runs is
       refused, each named)
"""
import argparse
import itertools
import os
import pathlib
import re
import shlex
import subprocess
import sys

from doc_blocks import code_blocks, doc_pages, report

PROGRAM = re.compile(r"^build/(examples|tools|benchmarks)/([\w-]+)$")


def commands(page):
    """(line number, command text) of each command in the page's sh/bash blocks, in the page's
    order, continued lines joined, comments dropped."""
    out = []
    for lang in ("sh", "bash"):
        for start, lines in code_blocks(page, lang):
            pending, first = "", start
            for n, line in enumerate(lines, start):
                text = re.sub(r"(^|\s)#.*$", "", line).rstrip()  # a comment (no '#' inside the commands here)
                if not pending:
                    first = n
                if text.endswith("\\"):
                    pending += text[:-1] + " "
                    continue
                text, pending = (pending + text).strip(), ""
                out += [(first, part.strip()) for part in text.split("&&") if part.strip()]
    return sorted(out, key=lambda c: c[0])


# (page, first line) of a YAML block -> the main that reads it (default: train_sac_pendulum).
YAML_PROGRAMS = {}
CONSUMER = "tests/package/consumer/CMakeLists.txt"


def blocks(page, lang):
    """(first line number, text) of each ```lang block of the page."""
    for start, lines in code_blocks(page, lang):
        yield start, "\n".join(lines)


def statements(cmake):
    """A CMake text's statements, comments dropped and spaces collapsed."""
    text = re.sub(r"#[^\n]*", "", cmake)
    return [re.sub(r"\s+", " ", m).strip() for m in re.findall(r"[\w_]+\s*\([^)]*\)", text)]


def check_configs(root, build, page, faults):
    """The page's YAML and CMake snippets (see file comment); how many were checked."""
    import tempfile
    rel, checked = page.relative_to(root), 0
    for line, text in blocks(page, "yaml"):
        exe = build / "examples" / YAML_PROGRAMS.get((rel.as_posix(), text.split("\n")[0]), "train_sac_pendulum")
        if not exe.exists():
            continue
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
            f.write(text)
            f.flush()
            r = subprocess.run([str(exe), "--config", f.name, "--print-config"], capture_output=True, text=True, timeout=120)
        checked += 1
        if r.returncode != 0:
            err = (r.stderr.strip() or r.stdout.strip()).splitlines()
            faults.append(f"{rel}:{line}: the YAML config: {exe.name} --config exits {r.returncode}: {err[-1] if err else ''}")
    consumer = statements((root / CONSUMER).read_text(encoding="utf-8")) if (root / CONSUMER).exists() else []
    for line, text in blocks(page, "cmake"):
        checked += 1
        for st in statements(text.replace("my_trainer", "consumer")):
            if st not in consumer:
                faults.append(f"{rel}:{line}: the CMake snippet's `{st}` is not what {CONSUMER} (tested) does")
    return checked


def sweep_runs(args):
    """A --multirun command line as the command lines of its runs (each key=a,b,... a list)."""
    if "--multirun" not in args:
        return [args]
    fixed, lists, it = [], [], iter(args)
    for a in it:
        if a == "--multirun" or a.startswith("--jobs="):
            continue
        if a == "--jobs":
            next(it, None)
            continue
        m = re.match(r"^(--)?([\w.]+)=([^\[].*,.*)$", a)
        if m:
            lists.append([f"--{m.group(2)}={v}" for v in m.group(3).split(",")])
        else:
            fixed.append(a)
    return [fixed + list(combo) for combo in itertools.product(*lists)]


def check(root, build):
    faults, notes, checked = [], [], 0
    for page in doc_pages(root):
        rel = page.relative_to(root)
        made = set()  # run directories and files earlier commands of the page write
        checked += check_configs(root, build, page, faults)
        for n, cmd in commands(page):
            env = dict(os.environ)
            words = shlex.split(cmd)
            while words and re.match(r"^\w+=", words[0]):  # VAR=value before the program
                k, _, v = words.pop(0).partition("=")
                env[k] = v
            if not words:
                continue
            m = PROGRAM.match(words[0])
            if not m:
                script = root / words[0]
                if re.match(r"^(scripts|benchmarks|\.ci)/", words[0]):
                    if not (script.is_file() and os.access(script, os.X_OK)):
                        faults.append(f"{rel}:{n}: {cmd}: no executable {words[0]}")
                    checked += 1
                continue
            exe = build / m.group(1) / m.group(2)
            outputs = [re.sub(r"^--[\w.]*(run_dir|file|dataset)=", "", a) for a in words[1:]
                       if re.match(r"^--[\w.]*(run_dir|file|dataset)=", a)]
            if not exe.exists():
                notes.append(f"{rel}:{n}: not run: {words[0]} is not in this build (an optional component)")
                continue
            if any("<" in a for a in words[1:]):
                notes.append(f"{rel}:{n}: not run: a placeholder in {cmd}")
                continue
            if m.group(1) != "examples" and m.group(2) not in ("anvil-doctor",):
                checked += 1  # a tool or benchmark with its own arguments: it exists
                continue
            reads = [re.sub(r"^--[\w.]*(run|resume)=", "", a) for a in words[1:] if re.match(r"^--[\w.]*(run|resume)=", a)]
            if any(r in made or any(r.startswith(p) for p in made) for r in reads):
                notes.append(f"{rel}:{n}: not run: it reads what a command above writes ({', '.join(reads)})")
                made.update(outputs)
                continue
            made.update(outputs)
            # --print-config runs nothing: a file or run directory the command names, absent
            # before, that is there after, was written by a run it should not have started.
            absent = [o for o in outputs if not (root / o).exists()]
            for run in sweep_runs(words[1:]):
                r = subprocess.run([str(exe), *run, "--print-config"], cwd=root, env=env, capture_output=True,
                                   text=True, timeout=120)
                checked += 1
                if r.returncode != 0:
                    err = (r.stderr.strip() or r.stdout.strip()).splitlines()
                    faults.append(f"{rel}:{n}: {cmd}: exit {r.returncode}: {err[-1] if err else ''}")
            for o in absent:
                if (root / o).exists():
                    faults.append(f"{rel}:{n}: {cmd}: with --print-config it ran: it wrote {o}")
    return faults, notes, checked


def selftest(build):
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        root = pathlib.Path(d)
        (root / "docs").mkdir()
        (root / "README.md").write_text(
            "```sh\nbuild/examples/train_sac --sac.batch_sizze=3\nscripts/nowhere.sh\n"
            "build/examples/train_sac --multirun seed=1,x --jobs 2\nbuild/examples/train_sac --seed=2\n```\n"
            "```yaml\nsac:\n  batch_sizze: 3\n```\n```cmake\nanvil_slow_start(my_trainer)\n```\n")
        faults, _, checked = check(root, build)
        print("\n".join(faults))
        want = ["README.md:2: build/examples/train_sac --sac.batch_sizze=3: exit 2", "README.md:3: scripts/nowhere.sh: no executable",
                "README.md:4: build/examples/train_sac --multirun seed=1,x --jobs 2: exit 2",
                "README.md:8: the YAML config: train_sac_pendulum --config exits 2",
                "README.md:12: the CMake snippet's `anvil_slow_start(consumer)`"]
        ok = len(faults) == 5 and all(any(f.startswith(w) for f in faults) for w in want) and checked == 7
        print("selftest:", "the faults are named" if ok else "FAILED: expected " + "; ".join(want))
        return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=str(pathlib.Path(__file__).resolve().parent.parent))
    ap.add_argument("--build", required=True)
    ap.add_argument("--selftest", action="store_true")
    args = ap.parse_args()
    if args.selftest:
        return selftest(pathlib.Path(args.build).resolve())
    faults, notes, checked = check(pathlib.Path(args.root).resolve(), pathlib.Path(args.build).resolve())
    return report("check_doc_commands", notes, faults, f"{checked} commands checked, {len(notes)} not run (said above)")


if __name__ == "__main__":
    sys.exit(main())
