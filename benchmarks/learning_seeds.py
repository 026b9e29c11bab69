#!/usr/bin/python3
"""Every learning test of ctest (the doctest cases of the test suite "learning", ctest label
`learning`) run again over other seeds than the one its threshold was set with: each test's
own command and environment as ctest has them, with doctest's -s (so that the figures it
prints show) and ANVIL_LEARNING_SEED=S (tests/temp_run_dir.hpp's `learning_seed`: the
run's seed, or the first of the COMA credit game's five). One JSON line per test and seed
(passed or failed, seconds, the figures the test prints), then one per test with its
passes over the seeds.

    python3 benchmarks/learning_seeds.py [--build build] [--seeds 101 102 103] [--jobs 1]
                                         [--only REGEX]
                                         [--out benchmarks/results-vm.jsonl]

A test that fails here is not a failing build: it says the threshold holds for the fixed
seed and not for this one. The figures go to benchmarks/RESULTS.md ("Learning tests over
other seeds").
"""
import argparse
import concurrent.futures
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import append_jsonl, cpu_model  # noqa: E402  (the benchmarks read the CPU's name one way)


def learning_tests(build):
    """The tests labelled `learning`, as ctest would run them: (name, command, environment, directory)."""
    r = subprocess.run(["ctest", "--test-dir", build, "--show-only=json-v1", "-L", "^learning$"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"ctest --show-only failed in {build} (exit {r.returncode}):\n{r.stderr[-2000:]}")
    tests = []
    for t in json.loads(r.stdout)["tests"]:
        props = {p["name"]: p["value"] for p in t.get("properties", [])}
        env = dict(e.split("=", 1) for e in props.get("ENVIRONMENT", []))
        tests.append((t["name"], t["command"], env, props.get("WORKING_DIRECTORY", build)))
    if not tests:
        sys.exit(f"no test carries the label 'learning' in {build} (a build from before this script?)")
    return tests


def run_one(test, seed):
    """Runs one learning test with the seed, doctest's -s on so that its MESSAGE lines print."""
    name, command, extra, cwd = test
    env = dict(os.environ, **extra, ANVIL_LEARNING_SEED=str(seed))
    t0 = time.perf_counter()
    r = subprocess.run(command + ["-s"], env=env, cwd=cwd, capture_output=True, text=True)
    out = r.stdout + r.stderr
    status = "skipped" if "ANVIL-SKIPPED:" in out else ("passed" if r.returncode == 0 else "failed")
    return name, status, time.perf_counter() - t0, out


def run_seed(tests, seed, jobs):
    """Every learning test with the seed, `jobs` at a time: [(name, status, seconds, output)]."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(lambda t: run_one(t, seed), tests))


def figures(output):
    """The lines the test printed with MESSAGE (doctest: "MESSAGE: ..."), and failed checks."""
    said = [m.strip() for m in re.findall(r"MESSAGE: (.*)", output)]
    failed = [m.strip() for m in re.findall(r"ERROR: (CHECK.*)", output)]
    return said, failed


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--seeds", type=int, nargs="+", default=[101, 102, 103])
    ap.add_argument("--jobs", type=int, default=1, help="tests at once (learning tests time nothing: two at once is fair)")
    ap.add_argument("--only", help="only the tests whose names match this regular expression")
    ap.add_argument("--out", help="also append the JSON lines to this file")
    args = ap.parse_args()
    if any(s < 0 for s in args.seeds):
        sys.exit("--seeds: a seed is a whole number, 0 or more")
    meta = {"cpu": cpu_model(), "host": platform.node(), "date": datetime.date.today().isoformat()}
    lines, tally = [], {}
    for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):  # the tests' own environment sets what they need
        os.environ.pop(k, None)
    tests = learning_tests(args.build)
    if args.only:
        tests = [t for t in tests if re.search(args.only, t[0])]
        if not tests:
            sys.exit(f"--only {args.only!r}: no learning test's name matches")
    for seed in args.seeds:
        for name, status, seconds, output in run_seed(tests, seed, args.jobs):
            said, failed = figures(output)
            row = {"name": "learning_test_other_seed", "test": name, "seed": seed, "result": status,
                   "seconds": round(seconds, 1), "said": said, "failed_checks": failed, **meta}
            print(json.dumps(row), flush=True)
            lines.append(row)
            passed, runs = tally.get(name, (0, 0))
            tally[name] = (passed + (status == "passed"), runs + (status != "skipped"))
    for name, (passed, runs) in sorted(tally.items()):
        row = {"name": "learning_test_other_seeds_summary", "test": name, "seeds": args.seeds, "passed": passed,
               "runs": runs, **meta}
        print(json.dumps(row), flush=True)
        lines.append(row)
    if args.out:
        append_jsonl(args.out, lines)


if __name__ == "__main__":
    main()
