#!/usr/bin/python3
"""SAC on the numpy Pendulum (tests/python/envs/pendulum.py) trained by `anvil.train` (the
prebuilt C++ Trainer, the env stepped in this interpreter) against a whole SAC training run
in PyTorch (benchmarks/reference/sac_pendulum_train.py), same settings on both sides: 20,000
env steps, 1,000 random ones first, one update per step, 256x256 networks, batch 256,
learning rate 1e-3, 10 evaluation episodes every 2,000 steps and at the end; one thread each
(torch.set_num_threads(1); anvil's run.threads=1, run.update_threads=1; OMP_NUM_THREADS=1).
Each run is a fresh process, the two sides interleaved seed by seed. One JSON line per run
(training seconds, whole-process seconds, final evaluation return) and one for the ratios.
--eval-episodes and --eval-interval change the evaluations on every side alike: a learning
comparison wants many episodes (100: a 10-episode figure carries ~27 of noise from the
start states alone), the timing one the defaults. --common-eval N also scores every run's
final policy on pendulum_eval.py's N fixed start states, one evaluation shared by all sides
(after the timed part), so that the start states' noise drops out of the comparison.

    PYTHONPATH=build/python /usr/bin/python3 benchmarks/python_module_sac.py [--seeds 0 1 2]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import cpu_model  # noqa: E402 - one reading of the CPU's name for the benchmarks
import pendulum_eval  # noqa: E402 - the evaluation every side shares (--common-eval)

HERE = os.path.dirname(os.path.abspath(__file__))
ENVS = os.path.join(HERE, "..", "tests", "python", "envs")

ANVIL = """
import ctypes, json, sys, time
import anvil, pendulum
seed, steps, run_dir, eval_interval, eval_episodes = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
common_eval = int(sys.argv[6])
env = sys.argv[7] if len(sys.argv) > 7 else pendulum.Pendulum  # "Pendulum-v1": anvil's C++ Pendulum
config = {"train.steps": steps, "train.learning_starts": 1000, "train.eval_interval": eval_interval,
          "train.eval_episodes": eval_episodes,
          "sac.actor_lr": 1e-3, "sac.critic_lr": 1e-3, "sac.alpha_lr": 1e-3, "sac.batch_size": 256,
          "run.seed": seed, "run.threads": 1, "run.update_threads": 1, "run.progress": "off"}
t0 = time.perf_counter()
s = anvil.train("sac", env, config=config, run_dir=run_dir)
seconds = time.perf_counter() - t0
fn = ctypes.CDLL("libopenblas.so.0").openblas_get_corename  # LibTorch's, loaded by anvil's module
fn.restype = ctypes.c_char_p
out = {"final_eval_return": s["final_eval_return"], "train_seconds": seconds, "updates": s["updates"],
       "openblas_core": fn().decode()}
if common_eval:  # the run's final policy, as it wrote it, on the start states every side shares
    import pendulum_eval
    policy = anvil.load_policy(run_dir + "/policy.safetensors")
    out["common_eval_return"], _ = pendulum_eval.evaluate(policy, pendulum_eval.start_states(common_eval))
print(json.dumps(out))
"""


def run(cmd, env):
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"{cmd[:3]} failed:\n{r.stdout}\n{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1]), wall


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=20_000)
    ap.add_argument("--eval-episodes", type=int, default=10, help="episodes per evaluation, every side")
    ap.add_argument("--eval-interval", type=int, default=2_000,
                    help="env steps between evaluations, every side (each run also evaluates at its end)")
    ap.add_argument("--common-eval", type=int, default=0, metavar="N",
                    help="also score each run's final policy on pendulum_eval.py's N fixed start states, the same "
                         "for every side and seed (after the timed part)")
    ap.add_argument("--sides", nargs="+", default=["anvil", "pytorch"],
                    choices=["anvil", "pytorch", "pytorch_flush", "anvil_cxx_env"],
                    help="anvil_cxx_env: anvil.train on anvil's C++ Pendulum-v1, the same settings (how much of a "
                         "difference in returns is the env's); pytorch_flush: the reference with "
                         "torch.set_flush_denormal(True), PyTorch's switch for CPUs slow on denormal floats (anvil's "
                         "Adam flushes them itself)")
    ap.add_argument("--before", metavar="DIR",
                    help="another build's python folder (its anvil package): adds the side anvil_before, anvil.train "
                         "of that build, interleaved with the others, for a before/after comparison")
    args = ap.parse_args()
    if args.common_eval < 0:
        ap.error(f"--common-eval: {args.common_eval} start states; give 0 (off) or more")
    if args.before:
        args.sides.append("anvil_before")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        env.pop(k, None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), ENVS, HERE) if p)
    before_env = dict(env, PYTHONPATH=os.pathsep.join((os.path.abspath(args.before or "."), env["PYTHONPATH"])))
    rows = {s: [] for s in args.sides}
    with tempfile.TemporaryDirectory() as tmp:
        for i, seed in enumerate(args.seeds):
            ev = [str(args.eval_interval), str(args.eval_episodes), str(args.common_eval)]
            ref = [sys.executable, os.path.join(HERE, "reference", "sac_pendulum_train.py"), "--seed", str(seed),
                   "--threads", "1", "--steps", str(args.steps), "--eval-interval", ev[0], "--eval-episodes", ev[1],
                   "--common-eval", ev[2]]
            sides = [("anvil", [sys.executable, "-c", ANVIL, str(seed), str(args.steps), f"{tmp}/run{seed}", *ev]),
                     ("pytorch", ref),
                     ("pytorch_flush", ref + ["--flush-denormal"]),
                     ("anvil_cxx_env", [sys.executable, "-c", ANVIL, str(seed), str(args.steps), f"{tmp}/cxx{seed}", *ev,
                                        "Pendulum-v1"]),
                     ("anvil_before", [sys.executable, "-c", ANVIL, str(seed), str(args.steps), f"{tmp}/before{seed}", *ev])]
            sides = [s for s in sides if s[0] in args.sides]
            for side, cmd in (sides if i % 2 == 0 else sides[::-1]):
                out, wall = run(cmd, before_env if side == "anvil_before" else env)
                row = {"name": f"sac_numpy_pendulum_{side}", "seed": seed, "steps": args.steps,
                       "eval_interval": args.eval_interval, "eval_episodes": args.eval_episodes,
                       "final_eval_return": round(out["final_eval_return"], 1),
                       "train_seconds": round(out["train_seconds"], 2), "process_seconds": round(wall, 2),
                       "cpu": cpu_model(), "openblas_core": out.get("openblas_core")}
                if args.common_eval:
                    row.update(common_eval_episodes=args.common_eval, common_eval_start_seed=pendulum_eval.START_SEED,
                               common_eval_return=round(out["common_eval_return"], 1))
                rows[side].append(row)
                print(json.dumps(row), flush=True)
    if "anvil" not in rows:
        return
    med = {s: {k: statistics.median(r[k] for r in rows[s]) for k in ("train_seconds", "process_seconds")} for s in rows}
    if "anvil_before" in rows:
        print(json.dumps({"name": "sac_numpy_pendulum_anvil_before_after", "before": args.before,
                          "train_ratio": round(med["anvil"]["train_seconds"] / med["anvil_before"]["train_seconds"], 3),
                          "process_ratio": round(med["anvil"]["process_seconds"] / med["anvil_before"]["process_seconds"], 3),
                          "cpu": cpu_model(), "seeds": args.seeds}))
    a_ret = [r["final_eval_return"] for r in rows["anvil"]]
    for ref in ("pytorch", "pytorch_flush"):
        if ref not in rows:
            continue
        p_ret = [r["final_eval_return"] for r in rows[ref]]
        print(json.dumps({"name": "sac_numpy_pendulum_anvil_train_vs_pytorch", "reference": ref,
                          "train_speedup": round(med[ref]["train_seconds"] / med["anvil"]["train_seconds"], 2),
                          "process_speedup": round(med[ref]["process_seconds"] / med["anvil"]["process_seconds"], 2),
                          "target": 2.0, "anvil_returns": a_ret, "pytorch_returns": p_ret,
                          # learning within the reference's range: no anvil seed below the reference's worst
                          "anvil_within_reference_range": min(a_ret) >= min(p_ret),
                          "cpu": cpu_model(), "seeds": args.seeds}))
        if args.common_eval:  # the same comparison on the start states every side shares
            a_c, p_c = [r["common_eval_return"] for r in rows["anvil"]], [r["common_eval_return"] for r in rows[ref]]
            print(json.dumps({"name": "sac_numpy_pendulum_common_eval", "reference": ref,
                              "episodes": args.common_eval, "start_seed": pendulum_eval.START_SEED,
                              "anvil_returns": a_c, "reference_returns": p_c,
                              "anvil_mean": round(statistics.mean(a_c), 1), "reference_mean": round(statistics.mean(p_c), 1),
                              "reference_range": [min(p_c), max(p_c)],
                              # learning at least as well: no anvil seed below the reference's worst seed
                              "no_anvil_seed_below_reference_worst": min(a_c) >= min(p_c),
                              # and read strictly, between its worst and its best (above its best fails this)
                              "every_anvil_seed_within_reference_range": all(min(p_c) <= a <= max(p_c) for a in a_c),
                              "cpu": cpu_model(), "seeds": args.seeds}))


if __name__ == "__main__":
    main()
