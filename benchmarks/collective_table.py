#!/usr/bin/env python3
"""Tables of benchmarks/RESULTS.md from a benchmarks/collective_pipeline.sh output directory:

    benchmarks/collective_table.py OUT_DIR [--distill RUN] [--jsonl FILE] [--tag KEY=VALUE ...]

1. each worker expert's final success rate against the collective's on the same task (the
   distillation run's last evaluation: deterministic actions, its EMA weights);
2. per student task, the shaped students (shaping at update time, at store time) against
   plain SAC: env steps to the first evaluation at 80% success, per seed, and the median
   (a run that never gets there counts as after every run that does).

--jsonl appends one JSON line per task (worker against collective) and per student run.
"""
import argparse
import datetime
import glob
import json
import os
import statistics

from machine import add_jsonl_arguments, append_jsonl, blas_kernel, cpu_model, tags_of
from mt_sac_table import evaluations


def steps_to(evals, level=0.8):
    """The env steps of the first evaluation at `level` success or above (None: never)."""
    return next((steps for steps, v in evals if v >= level), None)


def summary(run):
    p = os.path.join(run, "summary.json")
    return json.load(open(p)) if os.path.exists(p) else {}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="collective_pipeline.sh's output directory")
    ap.add_argument("--distill", help="the distillation run (default OUT/distill_fp32)")
    add_jsonl_arguments(ap)
    a = ap.parse_args()
    tags = tags_of(ap, a)
    out = a.out
    distill = a.distill or os.path.join(out, "distill_fp32")
    stamp = {"cpu": cpu_model(), "blas": blas_kernel(), "host": "vm", "date": datetime.date.today().isoformat()}
    lines = []

    workers = sorted(glob.glob(os.path.join(out, "worker_*/")))
    if workers:
        ds = summary(distill)
        print("| task | worker expert: success | collective: success | collective / expert |")
        print("|---|---|---|---|")
        for w in workers:
            task = os.path.basename(os.path.dirname(w))[len("worker_"):]
            expert = evaluations(w, task)[-1][1]
            coll = evaluations(distill, task) if os.path.isdir(distill) else []
            c = coll[-1][1] if coll else float("nan")
            ratio = None if expert == 0 else c / expert
            print(f"| {task} | {expert:.2f} | {c:.2f} | {'-' if ratio is None else f'{ratio:.2f}'} |")
            lines.append({"name": "collective_vs_worker", "issue": 50, "task": task, "worker_success": expert,
                          "worker_env_steps": summary(w).get("env_steps"), "collective_success": c,
                          "collective_over_worker": None if ratio is None else round(ratio, 3),
                          "collective_updates": ds.get("updates"),
                          "commit": ds.get("provenance", {}).get("git_commit", "")[:7], "run_dir": distill, **stamp, **tags})
        print(f"\n(collective: {distill}, after {ds.get('updates')} updates)\n")

    students = {}
    for p in glob.glob(os.path.join(out, "student_*_*_*")):
        if os.path.exists(os.path.join(p, "summary.json")):  # finished runs only
            task, kind, seed = os.path.basename(p)[len("student_"):].rsplit("_", 2)
            students.setdefault(task, {}).setdefault(kind, {})[int(seed)] = p
    for task in sorted(students):
        seeds = sorted({s for runs in students[task].values() for s in runs})
        print(f"| {task}: env steps to 80% success | " + " | ".join(f"seed {s}" for s in seeds) + " | median |")
        print("|---|" + "---|" * (len(seeds) + 1))
        for kind, label in (("update", "shaped at update time"), ("store", "shaped at store time"), ("plain", "plain SAC")):
            runs = students[task].get(kind)
            if not runs:
                continue
            evals = {s: evaluations(runs[s], task) for s in runs}
            steps = {s: steps_to(evals[s]) for s in runs}
            cells = [("never" if steps[s] is None else f"{steps[s] / 1000:.0f}K") if s in runs else "-" for s in seeds]
            med = statistics.median(v if v is not None else float("inf") for v in steps.values())
            print(f"| {label} | " + " | ".join(cells) + f" | {'never' if med == float('inf') else f'{med / 1000:.0f}K'} |")
            for s, run in sorted(runs.items()):
                sm = summary(run)
                lines.append({"name": "collective_student", "issue": 50, "task": task, "variant": kind, "seed": s,
                              "first_80": steps[s], "success_by_eval": [list(e) for e in evals[s]],
                              "seconds": round(sm.get("wall_seconds", 0.0), 1),
                              "commit": sm.get("provenance", {}).get("git_commit", "")[:7], "run_dir": run, **stamp, **tags})
        print()
    if a.jsonl:
        append_jsonl(a.jsonl, lines)
        print(f"{len(lines)} JSON lines appended to {a.jsonl}")


if __name__ == "__main__":
    main()
