"""anvil from Python: train with anvil's prebuilt C++ Trainers, and step anvil's C++ envs
as a batched vector env.

    import anvil
    summary = anvil.train("sac", MyPendulum, config={"train.steps": 20000})
    envs = anvil.make_vec("Pendulum-v1", 16)
    obs, infos = envs.reset(seed=0)
    obs, rewards, terminations, truncations, infos = envs.step(actions)

Built by anvil's CMake build into build/python (`PYTHONPATH=build/python`). docs/python.md
says more.
"""

import copy
import importlib
import json
import os

import numpy as np

from . import _anvil, safetensors  # noqa: F401 - anvil.safetensors: the format with numpy
from ._anvil import ConfigError, EnvError, Error  # noqa: F401 - anvil's errors, as Python's
from .policy import load_policy
from .spaces import Box, Dict, Discrete, MultiDiscrete

__all__ = ["train", "make_vec", "VectorEnv", "load_policy", "config_help", "envs", "algorithms",
           "Error", "ConfigError", "EnvError", "Box", "Dict", "Discrete", "MultiDiscrete"]

_ALGORITHMS = tuple(_anvil.algorithms())


def algorithms():
    """The algorithms `train` takes by name."""
    return list(_ALGORITHMS)


def envs():
    """The ids of anvil's C++ envs in this build (`make_vec`, and `train` by id)."""
    return list(_anvil.env_ids())


def config_help(algorithm):
    """Every config field of `algorithm`'s Trainer with its default and help (what a C++
    main prints for --help)."""
    return _anvil.config_help(algorithm)


def _value(v):
    """A config value as the command line writes it."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return ",".join(_value(x) for x in v)
    if isinstance(v, os.PathLike):
        return os.fspath(v)
    return str(v)


def _arguments(config, run_dir):
    """The config as a C++ main's command line: a dict {"train.steps": 3000} gives
    --train.steps=3000; strings ("train.steps=3000", "--config=run.yaml") are taken as they
    are; a path is a config file."""
    args = ["anvil.train"]
    if config is None:
        pass
    elif isinstance(config, dict):
        for key, value in config.items():
            if not isinstance(key, str):
                raise TypeError(f"config: keys are strings such as 'train.steps'; got {key!r}")
            args.append(f"--{key}={_value(value)}")
    elif isinstance(config, (str, os.PathLike)) and not (isinstance(config, str) and "=" in config):
        args.append(f"--config={os.fspath(config)}")
    elif isinstance(config, str):
        args.append(config)
    else:
        for item in config:
            if not isinstance(item, str):
                raise TypeError(f"config: a dict, or key=value strings; got {item!r}")
            args.append(item)
    if run_dir is not None:
        args.append(f"--run.run_dir={os.fspath(run_dir)}")
    return args


class _Copies:
    """The factory of an env given as an object: a deep copy of it for each env, training and
    evaluation (the object itself is left as it is)."""

    def __init__(self, env):
        self.env = env

    def __call__(self):
        return copy.deepcopy(self.env)


def _importable(f):
    """`python:module:qualname` for a factory a fresh interpreter can import by name (what
    worker processes do), and '' with the reason otherwise."""
    module, qualname = getattr(f, "__module__", None), getattr(f, "__qualname__", None)
    if not module or not qualname:
        return "", f"{f!r} has no importable name (a functools.partial or a callable object)"
    if "<lambda>" in qualname or "<locals>" in qualname:
        return "", f"{module}.{qualname} is a lambda or is defined inside a function"
    if module == "__main__":
        return "", f"{qualname} is defined in the script being run (__main__), which a worker cannot import " \
                   "without running the script again"
    try:
        found = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        return "", f"{module}.{qualname} cannot be imported by that name"
    if found is not f:
        return "", f"{module}.{qualname} names another object"
    return f"python:{module}:{qualname}", ""


def _env(env):
    """(what the C++ side steps, its name, its importable id or '', why not)."""
    if isinstance(env, str):
        return env, env, env if env.startswith("python:") else "", ""
    if callable(env) and not all(hasattr(env, a) for a in ("reset", "step")) or isinstance(env, type):
        name, why = _importable(env)
        shown = name or f"python:{getattr(env, '__module__', '?')}:{getattr(env, '__qualname__', type(env).__name__)}"
        return env, shown, name, why
    if all(hasattr(env, a) for a in ("reset", "step", "observation_space", "action_space")):
        t = type(env)
        return _Copies(env), f"python:{t.__module__}:{t.__qualname__}", "", \
            f"an env object ({t.__qualname__}) cannot be remade in a worker process; pass its class or a factory"
    raise TypeError(f"env: {env!r} is neither an env id (a string), a factory of envs (a class or a function), "
                    "nor an env (reset, step, observation_space, action_space)")


def train(algorithm, env, config=None, run_dir=None):
    """Trains `env` with `algorithm` ("sac", "sac_discrete", "ppo", "ppo_recurrent" or
    "mt_sac"; `anvil.algorithms()`) through anvil's prebuilt C++ Trainer and returns the run's summary (summary.json, with the run directory).

    env: a Gymnasium-style env class or factory (called once per env; `index=i` when it takes
    `index`), an env object (deep-copied per env), "python:MODULE:ATTR", or one of anvil's C++
    envs by id (`anvil.envs()`). With env.workers=W in the config the envs step in W worker
    processes, which import the factory by name: a lambda, a closure or a factory defined in
    the script being run is refused there.
    config: a dict of overrides ({"train.steps": 3000}), key=value strings, or a config
    file; the keys are the C++ mains' (`anvil.config_help(algorithm)`), and a bad one raises
    ConfigError with the line a main prints.
    run_dir: where the run writes its files (default: the mains' runs/<env>-<time>).

    The Trainer runs with the GIL released except while a Python env steps. Ctrl-C stops the
    run after the iteration under way, writes a checkpoint (run.resume=auto continues it),
    and raises KeyboardInterrupt.
    """
    if algorithm not in _ALGORITHMS:
        raise ConfigError(f"algorithm='{algorithm}': choose one of {', '.join(_ALGORITHMS)}")
    stepped, name, importable, why = _env(env)
    args = _arguments(config, run_dir)
    if not isinstance(env, str):
        args.insert(1, f"--env.id={name}")  # the config records which env (the object trains)
    result = _anvil.train(algorithm, stepped, name, importable, why, args)
    summary_file = os.path.join(result["run_dir"], "summary.json")
    summary = {}
    if os.path.exists(summary_file):
        with open(summary_file) as f:
            summary = json.load(f)
    summary.update(result)
    return summary


def _part_spaces(parts, low, high, n):
    """The single and batched observation spaces of an env of parts: a Box per part (uint8
    images in [0, 255], float parts in their bounds, taken in order from low and high), in a
    Dict by name, or the one part's Box where there is one."""
    single, batched, k = {}, {}, 0
    for name, dtype, shape in parts:
        shape = tuple(shape)
        if dtype == "uint8":
            lo, hi = np.zeros(shape, np.uint8), np.full(shape, 255, np.uint8)
        else:
            m = int(np.prod(shape))
            lo, hi = low[k:k + m].reshape(shape), high[k:k + m].reshape(shape)
            k += m
        single[name] = Box(lo, hi, dtype=np.dtype(dtype))
        batched[name] = Box(np.broadcast_to(lo, (n,) + shape), np.broadcast_to(hi, (n,) + shape), dtype=np.dtype(dtype))
    if len(parts) == 1:
        return next(iter(single.values())), next(iter(batched.values()))
    return Dict(single), Dict(batched)


class VectorEnv(_anvil.VecEnv):
    """`num_envs` of one of anvil's C++ envs stepped together in C++ (no Python per env), in
    Gymnasium's VectorEnv shape: `reset(seed=)` -> (obs, infos); `step(actions)` -> (obs,
    rewards, terminations, truncations, infos), numpy arrays with a row per env.

    Autoreset: "next_step" (Gymnasium 1.x's default): the step that ends an episode returns
    its last observation, and that env's next step starts a new episode (its action is
    ignored; reward 0). "same_step": the step that ends an episode returns the new episode's
    first observation, and the last in infos["final_obs"] (rows where infos["_final_obs"]).
    An ended episode's return and length are in infos["episode"] ("r", "l", and "success"
    for envs that report it), where infos["_episode"]; envs with tasks give each env's task
    index in infos["task"] (names in `tasks`). Seeds: reset(seed=s) makes the same episodes
    for the same s; env i's episodes come from its own stream.
    """

    def __init__(self, id, num_envs, threads=0, autoreset_mode="next_step", suite="", tasks=(), *,
                 image_size=0, frame_stack=0, action_repeat=0):
        if isinstance(tasks, str):
            tasks = [t for t in tasks.split(",") if t]
        super().__init__(id, int(num_envs), int(threads), autoreset_mode, suite, list(tasks),
                         [int(image_size), int(frame_stack), int(action_repeat)])
        spec = self.spec
        n = self.num_envs
        low, high = np.asarray(spec["obs_low"], np.float32), np.asarray(spec["obs_high"], np.float32)
        if "parts" in spec:  # a pixel task: uint8 [C, H, W] images (beside float parts, in a Dict)
            self.single_observation_space, self.observation_space = _part_spaces(spec["parts"], low, high, n)
        else:
            self.single_observation_space = Box(low, high, dtype=np.float32)
            self.observation_space = Box(np.tile(low, (n, 1)), np.tile(high, (n, 1)), dtype=np.float32)
        if "action_n" in spec:
            self.single_action_space = Discrete(spec["action_n"])
            self.action_space = MultiDiscrete(np.full(n, spec["action_n"]))
        else:
            alow, ahigh = np.asarray(spec["action_low"], np.float32), np.asarray(spec["action_high"], np.float32)
            self.single_action_space = Box(alow, ahigh, dtype=np.float32)
            self.action_space = Box(np.tile(alow, (n, 1)), np.tile(ahigh, (n, 1)), dtype=np.float32)
        self.agents = spec.get("agents")  # (agents, obs per agent, actions per agent, state) for a team env
        self.autoreset_mode = autoreset_mode
        self.metadata = {"autoreset_mode": autoreset_mode}
        self.closed = False

    def reset(self, *, seed=None, options=None):
        if options:
            raise ValueError("reset: anvil's envs take no options")
        if seed is not None and not isinstance(seed, (int, np.integer)):
            raise TypeError(f"reset: seed is an int (env i's episodes come from its own stream); got {seed!r}")
        if seed is not None and seed < 0:
            raise ValueError(f"reset: seed is {seed}; seeds are 0 or more")
        return self._reset(None if seed is None else int(seed))

    def close(self):
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __len__(self):
        return self.num_envs

    def __repr__(self):
        return f"anvil.VectorEnv({self.name!r}, num_envs={self.num_envs}, autoreset_mode={self.autoreset_mode!r})"


def make_vec(id, num_envs, threads=0, *, autoreset_mode="next_step", suite="", tasks=(),
             image_size=0, frame_stack=0, action_repeat=0):
    """`num_envs` of anvil's C++ env `id` (`anvil.envs()`) as a VectorEnv, stepped on
    `threads` threads (0: the calling thread), the GIL released while they step. For the
    manipulation suite, `suite="mt10"` or `tasks="reach,push"` chooses its tasks. The pixel
    task (PixelPendulum-v1) hands out uint8 images [num_envs, C, H, W], drawn in C++;
    `image_size`, `frame_stack` and `action_repeat` (0: the task's own, 64, 3 and 2) are the
    run config's env.image_size, env.frame_stack and env.action_repeat."""
    return VectorEnv(id, num_envs, threads=threads, autoreset_mode=autoreset_mode, suite=suite, tasks=tasks,
                     image_size=image_size, frame_stack=frame_stack, action_repeat=action_repeat)
