#!/usr/bin/env python3
"""Table of benchmarks/mt_sac_vs_sac.sh: each task's final evaluation success and return for
one SAC per task and for the multi-task SAC, and the first evaluation at which the task's
success reached 80%.

    python3 benchmarks/mt_sac_table.py OUT_DIR TASKS STEPS_PER_TASK
"""
import csv
import glob
import json
import os
import sys


def evaluations(run_dir, task):
    """(env steps, success) of each evaluation of `task` in a run's metrics.csv."""
    rows = list(csv.DictReader(open(os.path.join(run_dir, "metrics.csv"))))
    key = f"eval_success/{task}" if f"eval_success/{task}" in rows[0] else "eval_success"
    out, last = [], None
    for r in rows:  # a row carries the latest evaluation: keep the rows where it changes
        mark = (r["eval_return"], r[key])
        if r[key] != "" and mark != last:
            out.append((int(r["env_steps"]), float(r[key])))
            last = mark
    return out


def first_at(evals, bar=0.8):
    return next((f"{s // 1000}K" for s, v in evals if v >= bar), "never")


def main():
    out, tasks, steps = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
    multi_dir = os.path.join(out, "multi")
    multi = json.load(open(os.path.join(multi_dir, "summary.json")))
    rows = ["| task | SAC: success | SAC: return | SAC: 80% at | MT-SAC: success | MT-SAC: return | MT-SAC: 80% at (all tasks' steps) |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    single_s, multi_s = [], []
    for t in tasks:
        (d,) = [d for d in glob.glob(os.path.join(out, "single", "*")) if d.endswith("env.tasks=" + t)]
        s = json.load(open(os.path.join(d, "summary.json")))["final_eval_tasks"][t]
        m = multi["final_eval_tasks"][t]
        single_s.append(s["success"])
        multi_s.append(m["success"])
        rows.append(f"| {t} | {s['success']:.1f} | {s['return']:.0f} | {first_at(evaluations(d, t))} | "
                    f"{m['success']:.1f} | {m['return']:.0f} | {first_at(evaluations(multi_dir, t))} |")
    rows.append(f"| mean | {sum(single_s) / len(tasks):.2f} | | | {sum(multi_s) / len(tasks):.2f} | | |")
    table = "\n".join(rows)
    print(f"{steps} env steps per task ({len(tasks) * steps} in all for each side)\n" + table)
    open(os.path.join(out, "table.md"), "w").write(table + "\n")


if __name__ == "__main__":
    main()
