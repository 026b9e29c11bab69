#!/usr/bin/python3
"""A change's before and after on one of the timed programs (timed_sac_pendulum,
timed_ppo_pendulum: the examples' Trainers with a fast start and exit), interleaved run by
run on one core (`taskset -c 0`): the two binaries alternate old/new, new/old, ... with the
same arguments, each run a fresh process in its own run directory. Per run one JSON line:
the whole process's seconds, the training's (summary.json's wall_seconds), its phases and
final return; then the medians of each side and their ratios new / old.

    /usr/bin/python3 benchmarks/timed_ab.py --old OLD_BINARY --new NEW_BINARY [--rounds 5]
        [--preset ppo_rltools | sac_rltools] [-- KEY=VALUE ...]

--preset takes the arguments benchmarks/vs_rltools.sh gives the program for RLtools' config
(PPO: 4 envs x 1,024 steps x 75 iterations, 1,000 final episodes; SAC: 10,000 steps, batch
100), on one update thread; arguments after `--` are added to them (or given alone).
Copy the old binary aside before rebuilding (it links LibTorch only, not the build tree).
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import blas_kernel, cpu_model  # noqa: E402

def preset(name):
    """The arguments benchmarks/vs_rltools.sh gives its program for RLtools' config (its
    `sac_args` or `ppo_args`, read from the script: one list), on one update thread."""
    text = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "vs_rltools.sh")).read()
    m = re.search(r"^%s_args=\(([^)]*)\)" % name.split("_")[0], text, re.M)
    if not m:
        sys.exit(f"timed_ab: no {name.split('_')[0]}_args=( ... ) in benchmarks/vs_rltools.sh")
    return m.group(1).split() + ["run.update_threads=1"]


def one_run(binary, args, tmp):
    run_dir = tempfile.mkdtemp(dir=tmp)
    t0 = time.perf_counter()
    r = subprocess.run(["taskset", "-c", "0", binary, *args, f"run.run_dir={run_dir}"], capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"timed_ab: {binary} failed ({r.returncode}):\n{r.stderr[-2000:]}")
    with open(os.path.join(run_dir, "summary.json")) as f:
        s = json.load(f)
    shutil.rmtree(run_dir, ignore_errors=True)
    return {"seconds": round(seconds, 4), "train_seconds": round(s.get("wall_seconds", 0.0), 4),
            "phase_seconds": {k: round(v, 4) for k, v in s.get("phase_seconds", {}).items() if v},
            "final_eval_return": s.get("final_eval_return")}


def main():
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--preset", choices=["ppo_rltools", "sac_rltools"])
    a = ap.parse_args(argv)
    if a.rounds < 1:
        ap.error("--rounds must be at least 1")
    for b in (a.old, a.new):
        if not os.access(b, os.X_OK):
            ap.error(f"{b} is not an executable program")
    args = (preset(a.preset) if a.preset else []) + extra
    for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        os.environ.pop(k, None)
    machine = {"cpu": cpu_model(), "blas": blas_kernel()}
    runs = {"old": [], "new": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for side in (("old", "new") if r % 2 == 0 else ("new", "old")):
                row = {"name": "timed_ab", "side": side, "round": r + 1,
                       **one_run(a.old if side == "old" else a.new, args, tmp), **machine}
                runs[side].append(row)
                print(json.dumps(row), flush=True)
    med = {side: {k: statistics.median(x[k] for x in rows) for k in ("seconds", "train_seconds")}
           for side, rows in runs.items()}
    phases = sorted({p for rows in runs.values() for x in rows for p in x["phase_seconds"]})
    print(json.dumps({"name": "timed_ab_summary", "preset": a.preset, "extra": extra, "rounds": a.rounds,
                      "old": med["old"], "new": med["new"],
                      "old_phases": {p: round(statistics.median(x["phase_seconds"].get(p, 0) for x in runs["old"]), 4)
                                     for p in phases},
                      "new_phases": {p: round(statistics.median(x["phase_seconds"].get(p, 0) for x in runs["new"]), 4)
                                     for p in phases},
                      "seconds_ratio": round(med["new"]["seconds"] / med["old"]["seconds"], 3),
                      "train_seconds_ratio": round(med["new"]["train_seconds"] / med["old"]["train_seconds"], 3),
                      **machine}), flush=True)


if __name__ == "__main__":
    main()
