#!/usr/bin/env python3
"""Tables of benchmarks/RESULTS.md from a benchmarks/collective_pipeline.sh output directory:
   benchmarks/collective_table.py OUT_DIR [DISTILL_RUN]
1. each worker expert's final success rate against the collective's on the same task (the
   distillation run's last evaluation: deterministic actions, its EMA weights);
2. per student task, the shaped students (shaping at update time, at store time) against
   plain SAC: env steps to the first evaluation at 80% success, per seed, and the median
   (a run that never gets there counts as after every run that does)."""
import csv, glob, json, os, statistics, sys

out = sys.argv[1]
distill = sys.argv[2] if len(sys.argv) > 2 else os.path.join(out, "distill_fp32")

def rows(run):
    with open(os.path.join(run, "metrics.csv")) as f:
        return list(csv.DictReader(f))

def last_eval(run):
    ev = [r for r in rows(run) if r.get("eval_success") not in ("", "nan", None)]
    return ev[-1] if ev else {}

workers = sorted(glob.glob(os.path.join(out, "worker_*/")))
coll = last_eval(distill)
print("| task | worker expert: success | collective: success | collective / expert |")
print("|---|---|---|---|")
for w in workers:
    task = os.path.basename(os.path.dirname(w))[len("worker_"):]
    expert = float(last_eval(w)["eval_success"])
    c = float(coll.get("eval_success/" + task, "nan"))
    print(f"| {task} | {expert:.2f} | {c:.2f} | {c / expert if expert else float('nan'):.2f} |")
print(f"\n(collective: {distill}, after {coll.get('updates')} updates)\n")

def steps_to(run, level=0.8):
    for r in rows(run):
        s = r.get("eval_success")
        if s not in ("", "nan", None) and float(s) >= level:
            return int(float(r["env_steps"]))
    return None

students = {}
for p in glob.glob(os.path.join(out, "student_*_*_*")):
    if os.path.isdir(p):
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
        steps = [steps_to(runs[s]) if s in runs else None for s in seeds]
        cells = [f"{s / 1000:.0f}K" if s is not None else ("never" if seed in runs else "-") for s, seed in zip(steps, seeds)]
        known = [s if s is not None else float("inf") for s, seed in zip(steps, seeds) if seed in runs]
        med = statistics.median(known)
        print(f"| {label} | " + " | ".join(cells) + f" | {'never' if med == float('inf') else f'{med / 1000:.0f}K'} |")
    print()
