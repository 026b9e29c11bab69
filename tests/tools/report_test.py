#!/usr/bin/env python3
"""anvil-report on real runs of train_sac_pendulum: a run stopped and resumed, a sweep of two
settings x two seeds, a run still in progress, and damaged input. Checks that the page is
self-contained, that every curve of every run is drawn, that the values it draws are
metrics.csv's, that a sweep's means and min-max bands are those of its runs, and that bad input
is named (file and line) while the rest is still reported. Leaves the pages in --work for the
screenshot test."""
import argparse
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--report", required=True)
ap.add_argument("--train", required=True)
ap.add_argument("--work", required=True)
args = ap.parse_args()

work = os.path.abspath(args.work)
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
SHORT = ["--train.learning_starts=200", "--run.log_interval=200", "--train.eval_interval=400",
         "--train.eval_episodes=2", "--run.checkpoint_interval=400", "--run.progress=off"]


def fail(msg):
    print("FAILED: " + msg)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def train(*extra, expect_rc=0):
    r = subprocess.run([args.train, *SHORT, *extra], cwd=work, capture_output=True, text=True, timeout=300)
    check(r.returncode == expect_rc, f"train {' '.join(extra)} exited {r.returncode}:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return r


def report(*argv):
    r = subprocess.run([args.report, *argv], cwd=work, capture_output=True, text=True, timeout=120)
    print(f"$ anvil-report {' '.join(argv)}  -> {r.returncode}\n{r.stdout}{r.stderr}", end="")
    return r


def page(path):
    with open(os.path.join(work, path)) as f:
        html = f.read()
    m = re.search(r'<script type="application/json" id="anvil-report-data">(.*?)</script>', html, re.S)
    check(m, f"{path}: no data block")
    return html, json.loads(m.group(1).replace("<\\/", "</"))


def read_csv(path):
    with open(path) as f:
        lines = f.read().split("\n")
    names = lines[0].split(",")
    cols = {n: [] for n in names}
    for line in lines[1:]:
        if not line:
            continue
        cells = line.split(",")
        if len(cells) != len(names):
            continue
        for n, c in zip(names, cells):
            try:
                cols[n].append(float(c) if c else None)
            except ValueError:
                cols[n].append(None)
    return cols


def self_contained(path, html):
    for bad in (r"<link\b", r"\bsrc\s*=", r"\bhref\s*=", r"url\(", r"@import", r"https?://"):
        check(not re.search(bad, html), f"{path}: the page fetches something ({bad}); it must be self-contained")


def section(html, name):
    m = re.search(r'<section class="run" data-run="%s">(.*?)</section>' % re.escape(name), html, re.S)
    check(m, f"no section for run {name}")
    return m.group(1)


def check_run(html, data, run_dir, name, x="env_steps"):
    """Every column of the run's metrics.csv with a value is drawn, with metrics.csv's values."""
    csv = read_csv(os.path.join(work, run_dir, "metrics.csv"))
    runs = [r for r in data["runs"] if r["name"] == name]
    check(len(runs) == 1, f"run {name} is not in the page's data")
    run = runs[0]
    sec = section(html, name)
    drawn = run["columns"]
    for col, values in csv.items():
        if col in ("env_steps", "updates", "wall_s", "episodes") or all(v is None for v in values):
            continue
        check(col in drawn, f"{name}: column {col} has values but no curve")
        check(f'data-series="{col}"' in sec, f"{name}: no <path data-series=\"{col}\"> in its section")
        xs, ys = drawn[col]["x"], drawn[col]["y"]
        rows = [(csv[x][i], v) for i, v in enumerate(values) if v is not None]
        if col.startswith("eval_"):
            # Evaluations: the rows where one happened (metrics.csv repeats the latest in between).
            points = list(zip(xs, ys))
            check(set(points) <= set(rows), f"{name}: {col} draws points that are not rows of metrics.csv")
            check(all(p in points for p in rows if p[0] % 400 == 0), f"{name}: {col} misses an evaluation at a multiple of 400")
            check(points[-1] == rows[-1], f"{name}: {col}'s last point is not the last evaluation")
        else:
            check(list(zip(xs, ys)) == rows, f"{name}: {col} drawn {list(zip(xs, ys))[:4]}... but metrics.csv has {rows[:4]}...")
            m = re.search(r'data-series="%s" data-points="(\d+)"' % re.escape(col), sec)
            check(m and int(m.group(1)) == len(rows), f"{name}: the {col} path has {m and m.group(1)} points, metrics.csv {len(rows)}")
    return run, csv


# 1. A run stopped at 600 env steps and resumed to 1,200: its curves are continuous.
train("--train.steps=600", "--sac.batch_size=64", "--run.run_dir=resumed")
train("--train.steps=1200", "--sac.batch_size=64", "--run.run_dir=resumed", "--run.resume=auto")
r = report("resumed", "-o", "resumed.html")
check(r.returncode == 0, "a good run must be reported with exit status 0")
html, data = page("resumed.html")
self_contained("resumed.html", html)
run, csv = check_run(html, data, "resumed", "resumed")
steps = csv["env_steps"]
check(steps == [200.0 * (i + 1) for i in range(6)], f"metrics.csv of the resumed run is not one row per step: {steps}")
check(run["columns"]["recent_return"]["x"][-1] == 1200, "the resumed curve does not reach 1,200 env steps")
check("(resumed: 2 sessions)" in html, "the page does not say the run was resumed")
for needle in ("Return", "evaluation return (mean of 2 episodes)", "env steps", "critic loss", "Where the time went",
               'data-phase="update"', "Provenance", "config.yaml"):
    check(needle in html, f"resumed.html lacks {needle!r}")

# Wall-clock x-axis and smoothing: the sessions end to end, raw curves faint under smoothed ones.
r = report("resumed", "--x", "wall", "--smooth", "0.6", "-o", "wall.html")
check(r.returncode == 0, "--x wall --smooth 0.6 must work")
html, data = page("wall.html")
wall = data["runs"][0]["columns"]["critic_loss"]["x"]
check(all(b > a for a, b in zip(wall, wall[1:])), f"wall time is not increasing across the resume: {wall}")
check('class="line faint" data-series="eval_return"' in html and 'data-series="eval_return smoothed"' in html,
      "smoothing must draw the raw curve faint and the smoothed one over it")
check("wall-clock time (s" in html, "the wall-clock axis is not labelled")

# 2. A sweep, two settings x two seeds: grouped by setting, mean and min-max band, n=2.
train("--multirun", "seed=1,2", "sac.batch_size=32,64", "--jobs", "2", "--train.steps=800", "--run.run_dir=sweep")
r = report("sweep", "-o", "sweep.html")
check(r.returncode == 0, "a good sweep must be reported with exit status 0")
html, data = page("sweep.html")
self_contained("sweep.html", html)
groups = {g["label"]: g for g in data["groups"]}
check(set(groups) == {"sac.batch_size=32", "sac.batch_size=64"}, f"groups are {list(groups)}")
for label, g in groups.items():
    check(len(g["runs"]) == 2, f"{label}: {len(g['runs'])} runs, not 2 seeds")
    check(f"{label} (n=2)" in html, f"the legend does not show {label} (n=2)")
    per_run = {}
    for name in g["runs"]:
        run, csv = check_run(html, data, os.path.join("sweep", name), name)
        ev = run["columns"]["eval_return"]
        per_run[name] = dict(zip(ev["x"], ev["y"]))
    band = g["series"]["eval_return"]
    for x, mean, lo, hi, n in zip(band["x"], band["mean"], band["min"], band["max"], band["n"]):
        vals = [p[x] for p in per_run.values() if x in p]
        check(n == len(vals) and math.isclose(mean, sum(vals) / len(vals), rel_tol=1e-12) and lo == min(vals) and hi == max(vals),
              f"{label} at {x}: band {mean}/{lo}/{hi} n={n}, runs {vals}")
    check(band["n"][-1] == 2, f"{label}: the last point is not over both seeds")
    check(f'class="band" data-series="group' in html, "no min-max band drawn")
check("Final and best evaluation return, by setting" in html, "the sweep's final/best table is missing")

# 3. A run still in progress: what is there so far.
live_args = [a for a in SHORT if not a.startswith("--run.log_interval")]
proc = subprocess.Popen([args.train, *live_args, "--train.steps=200000", "--sac.batch_size=64", "--run.log_interval=100",
                         "--run.run_dir=live"], cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
try:
    deadline = time.time() + 120
    rows = 0
    while time.time() < deadline and rows < 4:
        time.sleep(0.3)
        if proc.poll() is not None:
            fail(f"the live run ended early ({proc.returncode}): {proc.stderr.read()[-2000:]}")
        try:
            with open(os.path.join(work, "live", "metrics.csv")) as f:
                rows = f.read().count("\n") - 1
        except FileNotFoundError:
            pass
    check(rows >= 4, "the live run wrote no rows in 120 s")
    r = report("live", "-o", "live.html")
finally:
    proc.send_signal(signal.SIGKILL)
    proc.wait()
check(r.returncode in (0, 1), "a run in progress must be reported")
if r.returncode == 1:  # only a row being written as the report read it
    check("is torn" in r.stderr and r.stderr.count("anvil-report:") == 1, f"unexpected problem with the live run: {r.stderr}")
html, data = page("live.html")
check(data["runs"][0]["status"].startswith("in progress (running now"), f"status of the live run: {data['runs'][0]['status']}")
check(data["runs"][0]["rows"] >= 4 and len(data["runs"][0]["columns"]["recent_return"]["x"]) >= 2,
      "the live run's rows so far are not drawn")
check("not there yet" in html, "the live run's page does not say the phase split comes at the end")
# Killed: the same directory, now without a process holding its lock.
r = report("live", "-o", "killed.html")
html, data = page("killed.html")
check(data["runs"][0]["status"].startswith("ended without a summary.json (killed or crashed"),
      f"status of the killed run: {data['runs'][0]['status']}")

# A run logged at every step: the page keeps at most 5,000 points a curve, the last one included.
os.makedirs(os.path.join(work, "long"))
shutil.copy(os.path.join(work, "resumed", "config.yaml"), os.path.join(work, "long"))
with open(os.path.join(work, "resumed", "metrics.csv")) as f:
    header, first = f.read().split("\n")[:2]
cells = first.split(",")
with open(os.path.join(work, "long", "metrics.csv"), "w") as f:
    f.write(header + "\n")
    for i in range(1, 12001):
        f.write(",".join([str(i)] + cells[1:]) + "\n")
r = report("long", "-o", "long.html")
html, data = page("long.html")
rr = data["runs"][0]["columns"]["env_steps_per_s"]
check(rr["every"] == 3 and len(rr["x"]) == 4000 + 1 and rr["x"][-1] == 12000, f"a long run's curve: every {rr.get('every')}, {len(rr['x'])} points")

# 4. Damaged input: each named with its file (and line); the rest still reported.
shutil.copytree(os.path.join(work, "resumed"), os.path.join(work, "torn"))
path = os.path.join(work, "torn", "metrics.csv")
with open(path) as f:
    lines = f.read().split("\n")
lines.insert(3, "1,2,3")                 # a row with too few fields (line 4)
cells = lines[5].split(",")
cells[4] = "abc"                         # a cell that is not a number (line 6, column episodes)
lines[5] = ",".join(cells)
torn = "\n".join(lines).rstrip("\n")
torn = torn[: len(torn) - 10]            # the last row cut off mid-write
with open(path, "w") as f:
    f.write(torn)
shutil.copytree(os.path.join(work, "resumed"), os.path.join(work, "badsummary"))
with open(os.path.join(work, "badsummary", "summary.json"), "w") as f:
    f.write('{"final_eval_return": -12')
os.makedirs(os.path.join(work, "empty"))
r = report("resumed", "torn", "badsummary", "missing", "empty", "-o", "damaged.html")
check(r.returncode == 1, "damaged input: the page is written and the exit status is 1")
html, data = page("damaged.html")
for needle in ("torn/metrics.csv: line 8 is torn", "torn/metrics.csv: line 4 has 3 fields",
               "torn/metrics.csv: 1 cell(s) are not numbers", "line 6, column episodes: 'abc'",
               "badsummary/summary.json: not valid JSON", "missing: no such file or directory",
               "empty: not a run directory"):
    check(needle in r.stderr, f"stderr does not say {needle!r}")
    check(needle in html, f"the page does not say {needle!r}")
check([run["name"] for run in data["runs"]] == ["resumed", "torn", "badsummary"], "the readable runs are not all reported")
tr = [run for run in data["runs"] if run["name"] == "torn"][0]
good = read_csv(os.path.join(work, "resumed", "metrics.csv"))
expect = [x for x, v in zip(good["env_steps"], good["recent_return"]) if v is not None and x <= 1000]
check(tr["columns"]["recent_return"]["x"] == expect,
      f"the torn run draws {tr['columns']['recent_return']['x']}: every whole row but the short one, not the torn one")
check(data["runs"][2]["status"] == "ended without a readable summary.json", f"a damaged summary.json: {data['runs'][2]['status']}")

# 5. A bad command line.
r = report("--x", "minutes", "resumed")
check(r.returncode == 2 and "--x minutes" in r.stderr, "a bad --x must be refused, naming it")
r = report()
check(r.returncode == 2 and "no run directory given" in r.stderr, "no input must be refused")
print("anvil-report: every check passed; pages in", work)
