#!/usr/bin/env python3
"""MT-SAC against one SAC per task over seeds (issue 50 point 2): reads the output
directories of benchmarks/mt_sac_vs_sac.sh (one per seed), prints a markdown table of each
task's final success for both sides, mean and min-max over the seeds, and with --jsonl FILE
appends one JSON line per task, side and seed (the final success and return, the success at
each evaluation, the first evaluation at 80%).

    python3 benchmarks/mt10_seeds.py [--jsonl benchmarks/results-vm.jsonl] runs/mt10_s1 runs/mt10_s2 ...
"""
import argparse
import datetime
import glob
import json
import os
import subprocess
import sys

from mt_sac_table import evaluations, first_at


def cpu_model():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def blas_kernel():
    """OpenBLAS's kernel family as the runs loaded it (benchmarks/mt_sac_vs_sac.sh unsets
    OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE, so asked of a process without them)."""
    code = ("import ctypes; f = ctypes.CDLL('libopenblas.so.0').openblas_get_corename; "
            "f.restype = ctypes.c_char_p; print(f().decode())")
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    try:
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return "OpenBLAS " + out.stdout.strip() if out.returncode == 0 else "unknown"


def runs_of(out):
    """(side, task, run directory, summary) of each run in one seed's output directory: one SAC
    per task, then the multi-task SAC where the directory has it (PARTS=single has not)."""
    singles = sorted(glob.glob(os.path.join(out, "single", "*", "summary.json")),
                     key=lambda p: int(os.path.basename(os.path.dirname(p)).split("_", 1)[0]))
    multi_dir = os.path.join(out, "multi")
    multi = json.load(open(os.path.join(multi_dir, "summary.json"))) if os.path.isdir(multi_dir) else None
    for path in singles:
        s = json.load(open(path))
        (t,) = s["final_eval_tasks"]
        yield "sac", t, os.path.dirname(path), s
        if multi:
            yield "mt_sac", t, multi_dir, multi


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jsonl", help="append the JSON lines to this file")
    ap.add_argument("outs", nargs="+", help="benchmarks/mt_sac_vs_sac.sh's output directories, one per seed")
    a = ap.parse_args()
    lines, success, tasks, steps = [], {}, [], 0
    cpu, blas = cpu_model(), blas_kernel()
    for out in a.outs:
        for side, task, d, s in runs_of(out):
            if task not in tasks:
                tasks.append(task)
            final = s["final_eval_tasks"][task]
            if side == "sac":
                steps = s["env_steps"]
            evals = evaluations(d, task)
            seed = s["config"]["run.seed"]
            success.setdefault((side, task), []).append(final["success"])
            lines.append({"name": f"{side}_mt10_success", "issue": 50, "task": task, "seed": seed,
                          "env_steps": s["env_steps"], "final_success": final["success"],
                          "final_eval_return": round(final["return"], 1),
                          "success_by_eval": [[e, v] for e, v in evals], "first_80": first_at(evals),
                          "seconds": round(s["wall_seconds"], 1), "run_dir": d,
                          "commit": s["provenance"]["git_commit"][:7],
                          "command": f"TASKS=mt10 SEED={seed} benchmarks/mt_sac_vs_sac.sh build {out} {steps}",
                          "cpu": cpu, "blas": blas, "host": "vm",
                          "date": datetime.date.today().isoformat()})
    def cell(side, t):
        v = success[(side, t)]
        return f"{sum(v) / len(v):.2f} ({min(v):.1f}-{max(v):.1f})"
    sides = [side for side in ("sac", "mt_sac") if any(k[0] == side for k in success)]
    head = {"sac": f"one SAC per task ({len(a.outs)} seeds)", "mt_sac": "MT-SAC"}
    rows = ["| task | " + " | ".join(head[x] for x in sides) + " |", "| --- " * (len(sides) + 1) + "|"]
    rows += [f"| {t} | " + " | ".join(cell(x, t) for x in sides) + " |" for t in tasks]
    mean = {x: sum(sum(success[(x, t)]) / len(success[(x, t)]) for t in tasks) / len(tasks) for x in sides}
    rows.append("| mean | " + " | ".join(f"{mean[x]:.2f}" for x in sides) + " |")
    print("\n".join(rows))
    print(f"({cpu}, {blas})")
    if a.jsonl:
        with open(a.jsonl, "a") as f:
            for line in lines:
                f.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
