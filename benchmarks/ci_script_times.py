#!/usr/bin/env python3
"""CI's script-driven steps before and after a change, interleaved (old, new, new, old per
round): the library order of anvil_fast_start (scripts/link_order.py, from an empty symbol
cache, as a fresh build runs it), the fast-start test (tests/examples/link_order_check.py)
and the docs' command check (scripts/check_doc_commands.py, its programs run with
--print-config). Each side runs its own checkout's script on its own build; the library
order and the test read the NEW build's programs on both sides, so that only the script
differs. Files that a side's --print-config runs wrote under data/ are removed before each
run and at the end (the old diffusion_pusht recorded demonstrations there). One JSON line
per step.

Usage: benchmarks/ci_script_times.py --old ROOT --new ROOT [--rounds N] [--jsonl FILE]
       (ROOT a checkout with its Release build in ROOT/build)
"""
import argparse
import os
import pathlib
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import add_jsonl_arguments, append_jsonl, blas_kernel, cpu_model, tags_of, utc_now  # noqa: E402

PYTHON = "/usr/bin/python3"


def timed(cmd, cwd):
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    t0 = time.monotonic()
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - t0
    if r.returncode != 0:
        sys.exit(f"{' '.join(map(str, cmd))} exited {r.returncode}:\n{(r.stdout + r.stderr)[-2000:]}")
    return seconds, r.stdout + r.stderr


def steps(side, root, probe_build, scratch):
    """{step: (command, cwd, cleanup before each run, output check)} of one side."""
    b = probe_build / "benchmarks"
    rsp = scratch / f"order_{side}.rsp"

    def fresh_cache():
        (scratch / "cache.json").unlink(missing_ok=True)

    def no_data():
        for f in (root / "data").glob("*.hdf5"):
            if subprocess.run(["git", "-C", str(root), "ls-files", "--error-unmatch", str(f)],
                              capture_output=True).returncode != 0:
                f.unlink()

    return {
        "ci_link_order_script": ([PYTHON, root / "scripts/link_order.py", b / "anvil_link_probe", rsp,
                                  "--cache", scratch / "cache.json"], b, fresh_cache, lambda out: rsp.read_text()),
        "ci_fast_start_test": ([PYTHON, root / "tests/examples/link_order_check.py", b / "anvil_link_probe",
                                b / "anvil_link_probe_ordered", b / "timed_sac_pendulum", b / "timed_ppo_pendulum"],
                               probe_build, None, lambda out: "all the same" in out),
        "ci_doc_commands_test": ([PYTHON, root / "scripts/check_doc_commands.py", "--build", root / "build"],
                                 root, no_data, lambda out: "none at fault" in out),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--rounds", type=int, default=2)
    add_jsonl_arguments(ap)
    args = ap.parse_args()
    old, new = pathlib.Path(args.old).resolve(), pathlib.Path(args.new).resolve()
    machine = {"cpu": cpu_model(), "cores": os.cpu_count(), "blas": blas_kernel(),
               "date": utc_now(),
               "command": "python3 benchmarks/ci_script_times.py --old OLD --new NEW --rounds " + str(args.rounds),
               "bench": "ci_script_times", **tags_of(ap, args)}
    rows = []
    with tempfile.TemporaryDirectory() as d:
        scratch = pathlib.Path(d)
        sides = {side: steps(side, root, new / "build", scratch) for side, root in (("old", old), ("new", new))}
        for name in sides["old"]:
            seconds, seen = {"old": [], "new": []}, {}
            for _ in range(args.rounds):
                for side in ("old", "new", "new", "old"):
                    cmd, cwd, cleanup, check = sides[side][name]
                    if cleanup:
                        cleanup()
                    s, out = timed(cmd, cwd)
                    seconds[side].append(round(s, 2))
                    seen[side] = check(out)
            same = seen["old"] == seen["new"] if name == "ci_link_order_script" else (seen["old"] and seen["new"])
            row = {"name": name, "old_s": seconds["old"], "new_s": seconds["new"],
                   "ratio_old_over_new": round(sum(seconds["old"]) / sum(seconds["new"]), 2),
                   "same_result": bool(same), "order": "old,new,new,old per round", **machine}
            print(row, flush=True)
            rows.append(row)
        for side in sides.values():  # leave no file a run wrote (the old side's demonstrations)
            for _, _, cleanup, _ in side.values():
                if cleanup:
                    cleanup()
    if args.jsonl:
        append_jsonl(args.jsonl, rows)
    return 0 if all(r["same_result"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
