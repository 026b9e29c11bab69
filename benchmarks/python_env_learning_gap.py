#!/usr/bin/python3
"""Where does anvil's SAC on a Python Pendulum lose to the same SAC on its C++ Pendulum
(issues 44 and 45)? Three envs trained by `anvil.train("sac", ...)` with the same settings
as benchmarks/python_module_sac.py, seed by seed:
  cxx      anvil's C++ Pendulum-v1, stepped by anvil in C++;
  wrapped  the same C++ Pendulum stepped through the Python path (a Python env whose
           reset and step call anvil.make_vec("Pendulum-v1", 1)): C++ dynamics and start
           states, the Python env's data path;
  numpy    tests/python/envs/pendulum.py (numpy, Gymnasium's dynamics).
If `wrapped` learns as `numpy` does, the difference is in the data path; if as `cxx`, in
the env. One JSON line per run, two runs at a time (one thread each).

    PYTHONPATH=build/python /usr/bin/python3 benchmarks/python_env_learning_gap.py --seeds 3 4 5
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ENVS = os.path.join(HERE, "..", "tests", "python", "envs")

RUN = """
import json, sys
import numpy as np
import anvil, pendulum

class Wrapped:
    '''anvil's C++ Pendulum-v1 behind Gymnasium's single-env API.'''
    def __init__(self):
        self.vec = anvil.make_vec("Pendulum-v1", 1, autoreset_mode="same_step")
        self.observation_space = self.vec.single_observation_space
        self.action_space = self.vec.single_action_space
    def reset(self, seed=None, options=None):
        obs, _ = self.vec.reset(seed=seed)
        return obs[0], {}
    def step(self, action):
        obs, r, te, tr, info = self.vec.step(np.asarray(action, np.float32).reshape(1, 1))
        last = info["final_obs"][0] if "final_obs" in info and info["_final_obs"][0] else obs[0]
        return last, float(r[0]), bool(te[0]), bool(tr[0]), {}

kind, seed, run_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3]
env = {"cxx": "Pendulum-v1", "wrapped": Wrapped, "numpy": pendulum.Pendulum}[kind]
config = {"train.steps": 20000, "train.learning_starts": 1000, "train.eval_interval": 2000, "train.eval_episodes": 10,
          "sac.actor_lr": 1e-3, "sac.critic_lr": 1e-3, "sac.alpha_lr": 1e-3, "run.seed": seed, "run.threads": 1,
          "run.update_threads": 1, "run.progress": "off"}
s = anvil.train("sac", env, config=config, run_dir=run_dir)
print(json.dumps({"env": kind, "seed": seed, "final_eval_return": round(s["final_eval_return"], 1)}))
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[3, 4, 5])
    ap.add_argument("--kinds", nargs="+", default=["cxx", "wrapped", "numpy"])
    args = ap.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        env.pop(k, None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), ENVS) if p)
    jobs = [(k, s) for s in args.seeds for k in args.kinds]
    with tempfile.TemporaryDirectory() as tmp:
        while jobs:
            batch, jobs = jobs[:2], jobs[2:]
            procs = [subprocess.Popen([sys.executable, "-c", RUN, k, str(s), f"{tmp}/{k}{s}"], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for k, s in batch]
            for p in procs:
                out, err = p.communicate()
                if p.returncode != 0:
                    sys.exit(err[-2000:])
                print(out.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
