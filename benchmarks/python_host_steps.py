#!/usr/bin/python3
"""Envs in Python stepped in process (env.workers=0) with the interpreter that hosts them:
anvil's VecEnv stepping the numpy Pendulum (tests/python/envs/pendulum.py) under

  - a C++ main (bench_python_envs, as a main with --env.id=python:... runs it), which holds
    the interpreter's own archive (CMake's anvil_python_in_program, as the mains that take
    --env.id do; the shared libpython where the build found no archive or
    -DANVIL_PYTHON_IN_PROGRAM=OFF), and any other C++ mains named by --main (an older build's
    bench_python_envs, say: LABEL=PATH), and
  - `/usr/bin/python3` itself, which imported anvil (`import anvil`: the module's Trainers
    step a Python env in the interpreter that called anvil.train),

each beside the bare Python loop under `/usr/bin/python3`
(benchmarks/reference/python_env_loop.py). The three sides run as fresh processes, in
interleaved rounds; each side's figure is the median of three timed stretches of --seconds
(the same loop of fixed actions of 0.5 on both anvil sides). Prints one JSON line per
figure and per round, then a summary line per env count and host: the median over rounds
of anvil / bare loop (issue 44's figure, target 0.85).

    PYTHONPATH=build/python /usr/bin/python3 benchmarks/python_host_steps.py [--build build] [--rounds 3]
        [--main LABEL=PATH]...
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from machine import add_jsonl_arguments, append_jsonl, blas_kernel, cpu_model, tags_of  # noqa: E402

PYTHON = "/usr/bin/python3"
ENV = "python:pendulum:make"


def env_with_paths(build):
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    paths = [os.path.join(build, "python"), os.path.join(ROOT, "tests", "python", "envs")]
    env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def run(cmd, env):
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"python_host_steps: {' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-2000:]}")
    return out.stdout


def bare_loop(n, seconds, env):
    line = run([PYTHON, os.path.join(HERE, "reference", "python_env_loop.py"), ENV.split(":", 1)[1], str(n),
                str(seconds)], env)
    return json.loads(line)["value"]


def under_python3(n, seconds, env):
    code = f"import anvil; print(anvil._anvil._python_step_rate({ENV!r}, {n}, {seconds}))"
    return float(run([PYTHON, "-c", code], env).strip().splitlines()[-1])


def under_main(n, seconds, env, program):
    out = run([program, f"--bench.seconds={seconds}",
               "--bench.workers=[]", f"--bench.num_envs=[{n}]", "--bench.python="], env)
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return next(r["value"] for r in rows if r["name"] == "python_env_steps")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--num-envs", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--main", action="append", default=[], metavar="LABEL=PATH",
                    help="another C++ main to time beside the build's bench_python_envs")
    add_jsonl_arguments(ap)
    a = ap.parse_args()
    env = env_with_paths(os.path.abspath(a.build))
    machine = {"cpu": cpu_model(), "blas": blas_kernel()}
    mains = {"C++ main": os.path.join(os.path.abspath(a.build), "benchmarks", "bench_python_envs")}
    for m in a.main:
        label, sep, path = m.partition("=")
        if not sep or not os.access(path, os.X_OK):
            sys.exit(f"python_host_steps: --main {m}: expected LABEL=PATH of a bench_python_envs program")
        mains[f"C++ main ({label})"] = path
    rows, ratios = [], {}
    for r in range(1, a.rounds + 1):
        for n in a.num_envs:
            bare = bare_loop(n, a.seconds, env)
            sides = {label: under_main(n, a.seconds, env, path) for label, path in mains.items()}
            sides["python3 (import anvil)"] = under_python3(n, a.seconds, env)
            rows.append({"name": "python_env_bare_loop_steps", "value": bare, "unit": "env steps/s", "num_envs": n,
                         "round": r, **machine})
            for host, steps in sides.items():
                rows.append({"name": "python_env_steps", "value": steps, "unit": "env steps/s", "host": host,
                             "num_envs": n, "workers": 0, "round": r, **machine})
                ratios.setdefault((host, n), []).append(steps / bare)
            for row in rows[-1 - len(sides):]:
                print(json.dumps(row), flush=True)
    for (host, n), v in ratios.items():
        row = {"name": "python_env_vs_bare_loop_median", "host": host, "num_envs": n, "rounds": v,
               "median": statistics.median(v), "target": 0.85, "unit": "x", **machine}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if a.jsonl:
        tags = tags_of(ap, a)
        append_jsonl(a.jsonl, [dict(row, **tags) for row in rows])


if __name__ == "__main__":
    main()
