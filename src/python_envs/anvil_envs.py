"""What both ways of stepping Python envs share: the in-process bridge (src/python_envs/bridge.cpp)
and the env workers (src/python_envs/env_worker.py). Importing the factory by name, making
the envs (PettingZoo parallel envs wrapped as one team env, anvil_team.py), reading and
checking their spaces into the spec anvil parses (src/python_envs/python_batch.hpp,
`parse_spec`), and the words of a fault. No side effects on import.
"""

import ast
import importlib
import inspect
import os
import sys
import traceback

import numpy as np

import anvil_team


class Fault(Exception):
    """A fault in an env or its factory, in words anvil shows as they are."""


_HERE = os.path.dirname(os.path.abspath(__file__))


def describe(e):
    """An exception as one line and its last two frames in the user's code (where it was
    raised; anvil's own frames and the import machinery's are left out)."""
    head = traceback.format_exception_only(type(e), e)[-1].strip()
    frames = [f for f in traceback.extract_tb(e.__traceback__)
              if os.path.dirname(os.path.abspath(f.filename)) != _HERE and not f.filename.startswith("<frozen")
              and "importlib" not in f.filename][-2:]
    tail = "".join(f'\n    File "{f.filename}", line {f.lineno}, in {f.name}' + (f": {f.line}" if f.line else "")
                   for f in frames)
    return head + tail


def fault_text(e):
    """What anvil shows for an exception from an env: a Fault's own words, else `describe`."""
    return str(e) if isinstance(e, (Fault, anvil_team.TeamFault)) else describe(e)


def literal(text):
    """A config value as Python reads it: a literal where it is one ("9.81", "[1, 2]",
    "True"), else the string itself."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def import_factory(target):
    """`module:attr`, imported (looked up on PYTHONPATH and in the current directory, as
    `python -m` does)."""
    module, colon, attr = target.rpartition(":")
    if not colon or not module or not attr:
        raise Fault("expected python:MODULE:ATTR (e.g. python:my_envs.pendulum:make)")
    if os.getcwd() not in sys.path:
        sys.path.insert(1, os.getcwd())
    try:
        f = importlib.import_module(module)
    except BaseException as e:  # noqa: BLE001 - any failure to import is the user's to see
        # a module that is not there: one line; one that fails as it runs: where it failed
        why = traceback.format_exception_only(type(e), e)[-1].strip() if isinstance(e, ModuleNotFoundError) \
            else describe(e)
        raise Fault(f"cannot import module '{module}' ({why}); it is looked up on PYTHONPATH and in the "
                    "current directory") from None
    for part in attr.split("."):
        if not hasattr(f, part):
            raise Fault(f"module '{module}' has no attribute '{attr}'")
        f = getattr(f, part)
    if not callable(f):
        raise Fault(f"'{module}.{attr}' is not callable (a class or a factory)")
    return f


def _takes_index(f):
    try:
        params = inspect.signature(f).parameters.values()
    except (TypeError, ValueError):  # builtins without a signature
        return False
    return any(p.name == "index" or p.kind == p.VAR_KEYWORD for p in params)


def make_envs(factory, kwargs, first, count):
    """Envs first .. first + count - 1: `factory(**kwargs)`, with `index=i` when it takes
    one, the kwargs' values read as literals; a PettingZoo parallel env as one team env."""
    kw = {k: literal(v) for k, v in kwargs.items()}
    index = _takes_index(factory)
    envs = []
    for i in range(first, first + count):
        try:
            envs.append(factory(**kw, index=i) if index else factory(**kw))
        except BaseException as e:  # noqa: BLE001
            raise Fault(f"making env {i} failed: {describe(e)}") from None
    if anvil_team.is_team(envs[0]):
        try:
            envs = [anvil_team.Team(e) for e in envs]
        except anvil_team.TeamFault as e:
            raise Fault(str(e)) from None
    return envs


def _box(space, what):
    """A space's (shape, low, high) as float32, checked."""
    if not all(hasattr(space, a) for a in ("shape", "low", "high")):
        raise Fault(f"{what} has neither `n` (a Discrete space) nor `shape`, `low` and `high` (a Box)")
    shape = tuple(int(d) for d in space.shape)
    n = int(np.prod(shape, dtype=np.int64))
    rows = []
    for attr in ("low", "high"):
        a = np.broadcast_to(np.asarray(getattr(space, attr), dtype=np.float32), shape).reshape(-1)
        if a.size != n:
            raise Fault(f"{what}.{attr} has {a.size} numbers; its shape has {n}")
        rows.append(a)
    if hasattr(space, "dtype") and np.dtype(space.dtype).kind not in "fiub":
        raise Fault(f"{what} has dtype {space.dtype}; anvil reads numeric Box spaces (float, int, uint, bool)")
    return shape, rows[0], rows[1]


def _floats(a):
    return " ".join(repr(float(x)) for x in a)


def spec(env, env_id):
    """The env's spaces, tasks and agents as lines of "key values" (anvil's `parse_spec`
    reads them), checked; and (obs_dim, discrete, action_shape) for stepping it."""
    if not all(hasattr(env, a) for a in ("observation_space", "action_space", "reset", "step")):
        raise Fault(f"the env ({type(env).__name__}) lacks observation_space, action_space, reset or step "
                    "(Gymnasium's Env API)")
    lines = [f"python {sys.version.split()[0]}"]
    _, low, high = _box(env.observation_space, f"{env_id}: observation_space")
    obs_dim = low.size
    lines += [f"obs_low {_floats(low)}", f"obs_high {_floats(high)}"]
    space = env.action_space
    if hasattr(space, "n"):  # a Discrete space (a Box has no `n`)
        n = int(space.n)
        if n < 2:
            raise Fault(f"action_space.n is {n}; needs 2 or more actions")
        discrete, action_shape = True, ()
        lines.append(f"action_n {n}")
    else:
        action_shape, low, high = _box(space, f"{env_id}: action_space")
        bad = np.nonzero(~(low <= high))[0]
        if bad.size:
            raise Fault(f"action_space.low[{bad[0]}] is above its high")
        discrete = False
        lines += [f"action_low {_floats(low)}", f"action_high {_floats(high)}",
                  "action_shape " + " ".join(str(d) for d in action_shape)]
    if hasattr(env, "agent_layout"):
        lines.append("agents " + " ".join(str(int(x)) for x in env.agent_layout))
    lines += [f"task {t}" for t in getattr(env, "tasks", [])]
    return "\n".join(lines) + "\n", (obs_dim, discrete, action_shape)
