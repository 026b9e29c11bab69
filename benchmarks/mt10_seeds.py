#!/usr/bin/env python3
"""MT-SAC against one SAC per task over seeds (issue 50 point 2): reads the output
directories of benchmarks/mt_sac_vs_sac.sh (one per seed), prints a markdown table of each
task's final success for both sides, mean and min-max over the seeds, and with --jsonl FILE
appends one JSON line per task, side and seed (the final success and return, the success at
each evaluation, the first evaluation at 80%). An output directory of PARTS=multi (the
multi-task SAC alone) gives MT-SAC's rows only.

    python3 benchmarks/mt10_seeds.py [--jsonl benchmarks/results-vm.jsonl] [--tag KEY=VALUE ...]
                                     runs/mt10_s1 runs/mt10_s2 ...

--tag adds a field to every JSON line (e.g. --tag rewards=metaworld_v2: which rewards the
suite had when the runs ran). The run directories are scratch; the JSON lines are the
record, so the same table comes from them too, both sides' lines alike:

    python3 benchmarks/mt10_seeds.py --from benchmarks/results-vm.jsonl --where update_interval=1 \
        --where batch_size=128 --where "hidden=[256, 256]"

--where KEY=VALUE keeps the lines whose KEY holds VALUE (read as JSON where it parses, so
numbers and lists compare as such; seed=N or seed=[N,M,...] keeps those seeds, as --seeds
N M ... does); with --from, no output directory is read.
"""
import argparse
import datetime
import glob
import json
import os

from machine import add_jsonl_arguments, append_jsonl, blas_kernel, cpu_model, tags_of
from mt_sac_table import evaluations, first_at


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
    if multi and not singles:  # PARTS=multi: the multi-task SAC alone
        for t in multi["final_eval_tasks"]:
            yield "mt_sac", t, multi_dir, multi


def command_of(out):
    """The command that made output directory `out`, as mt_sac_vs_sac.sh wrote it in
    `out/command` (None for an output from before it did: the command is rebuilt)."""
    path = os.path.join(out, "command")
    return open(path).read().strip() if os.path.exists(path) else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_jsonl_arguments(ap)
    ap.add_argument("outs", nargs="*", help="benchmarks/mt_sac_vs_sac.sh's output directories (one per seed, or per task and seed)")
    ap.add_argument("--from", dest="source", metavar="FILE", help="read the runs' JSON lines from FILE instead of output directories")
    ap.add_argument("--where", action="append", default=[], metavar="KEY=VALUE", help="with --from: keep the lines whose KEY holds VALUE")
    ap.add_argument("--seeds", type=int, nargs="+", metavar="SEED", help="with --from: keep these seeds' lines only")
    a = ap.parse_args()
    tags = tags_of(ap, a)
    if bool(a.source) == bool(a.outs):
        ap.error("give output directories or --from FILE, one of the two")
    if not a.source and (a.where or a.seeds):
        ap.error("--where and --seeds filter the lines --from FILE reads; give --from FILE")
    if a.source:
        if a.jsonl:
            ap.error("--jsonl writes lines read from output directories; --from reads lines already written")
        where = a.where + ([f"seed={a.seeds}"] if a.seeds else [])
        print_table(lines_of_file(ap, a.source, where))
        return
    lines, steps = [], 0
    cpu, blas = cpu_model(), blas_kernel()
    for out in a.outs:
        runs = list(runs_of(out))
        has_single, has_multi = any(r[0] == "sac" for r in runs), any(r[0] == "mt_sac" for r in runs)
        parts = "" if has_single and has_multi else "PARTS=single " if has_single else "PARTS=multi "
        out_tasks = list(dict.fromkeys(task for _, task, _, _ in runs))
        tasks_arg = "mt10" if len(out_tasks) == 10 else ",".join(out_tasks)
        for side, task, d, s in runs:
            final = s["final_eval_tasks"][task]
            if side == "sac" or not has_single:  # the steps per task the command was given
                steps = s["env_steps"] if side == "sac" else s["env_steps"] // len(out_tasks)
            evals = evaluations(d, task)
            seed = s["config"]["run.seed"]
            # The episodes' time limits the runs had (0: the env's own, 500) and the flags that set them.
            horizons = {k: s["config"].get(f"env.{k}", 0) for k in ("max_episode_steps", "eval_max_episode_steps")}
            extra = " ".join(f"--env.{k}={v}" for k, v in horizons.items() if v)
            extra = f"EXTRA_ARGS='{extra}' " if " " in extra else f"EXTRA_ARGS={extra} " if extra else ""
            lines.append({"name": f"{side}_mt10_success", "issue": 50, "task": task, "seed": seed,
                          "env_steps": s["env_steps"], "final_success": final["success"],
                          "final_eval_return": round(final["return"], 1),
                          "success_by_eval": [[e, v] for e, v in evals], "first_80": first_at(evals),
                          "seconds": round(s["wall_seconds"], 1), "run_dir": d,
                          "commit": s["provenance"]["git_commit"][:7],
                          "train_max_episode_steps": horizons["max_episode_steps"] or 500,
                          "eval_max_episode_steps": horizons["eval_max_episode_steps"] or 500,
                          "n_step": s["config"].get("buffer.n_step", 1),
                          "update_interval": s["config"].get("train.update_interval"),
                          "batch_size": s["config"].get("mtsac.batch_size"),
                          "hidden": s["config"].get("mtsac.actor.hidden"),
                          "heads": s["config"].get("mtsac.actor.heads", 1),
                          "command": command_of(out) or
                          f"TASKS={tasks_arg} SEED={seed} {parts}{extra}benchmarks/mt_sac_vs_sac.sh build {out} {steps}",
                          "cpu": cpu, "blas": blas, "host": "vm",
                          "date": datetime.date.today().isoformat(), **tags})
    print_table(lines)
    if a.jsonl:
        append_jsonl(a.jsonl, lines)


def lines_of_file(ap, path, where):
    """The `*_mt10_success` JSON lines of file `path` whose fields hold every KEY=VALUE of `where`."""
    wanted = {}
    for w in where:
        key, eq, value = w.partition("=")
        if not eq or not key:
            ap.error(f"--where {w!r}: expected KEY=VALUE")
        try:
            wanted[key] = json.loads(value)
        except json.JSONDecodeError:
            wanted[key] = value
    seeds = wanted.pop("seed", None)  # one seed, or a list of them
    if seeds is not None and not isinstance(seeds, list):
        seeds = [seeds]
    rows = []
    try:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        ap.error(f"--from {path}:{n}: not a JSON line ({e.msg})")
    except OSError as e:
        ap.error(f"--from {path}: {e.strerror}")
    kept = [r for r in rows if r.get("name") in ("sac_mt10_success", "mt_sac_mt10_success")
            and all(r.get(k) == v for k, v in wanted.items()) and (seeds is None or r.get("seed") in seeds)]
    if not kept:
        ap.error(f"{path}: no sac_mt10_success or mt_sac_mt10_success line holds {' '.join(where) or 'anything'}")
    return kept


def print_table(lines):
    """A markdown table of each task's final success, mean and min-max over the seeds, one
    column per side (one SAC per task, MT-SAC), from the runs' JSON lines."""
    final, tasks = {}, []
    for r in lines:  # a run recorded twice counts once (its last line)
        if r["task"] not in tasks:
            tasks.append(r["task"])
        final[(r["name"][:-len("_mt10_success")], r["task"], r["seed"])] = r["final_success"]
    success, seeds = {}, {}
    for (side, task, seed), v in final.items():
        success.setdefault((side, task), []).append(v)
        seeds.setdefault(side, set()).add(seed)
    cpus = sorted({(r.get("cpu", "unknown"), r.get("blas", "unknown")) for r in lines})
    sides = [side for side in ("sac", "mt_sac") if side in seeds]

    def cell(side, t):
        v = success.get((side, t))
        return f"{sum(v) / len(v):.2f} ({min(v):.1f}-{max(v):.1f})" if v else "-"

    def n_seeds(side):
        return f"{len(seeds[side])} seed{'' if len(seeds[side]) == 1 else 's'}"
    head = {"sac": "one SAC per task", "mt_sac": "MT-SAC"}
    rows = ["| task | " + " | ".join(f"{head[x]} ({n_seeds(x)})" for x in sides) + " |", "| --- " * (len(sides) + 1) + "|"]
    rows += [f"| {t} | " + " | ".join(cell(x, t) for x in sides) + " |" for t in tasks]
    means = {x: [sum(v) / len(v) for (side, _), v in success.items() if side == x] for x in sides}
    rows.append("| mean | " + " | ".join(f"{sum(means[x]) / len(means[x]):.2f}" for x in sides) + " |")
    print("\n".join(rows))
    print("(" + "; ".join(f"{c}, {b}" for c, b in cpus) + ")")


if __name__ == "__main__":
    main()
