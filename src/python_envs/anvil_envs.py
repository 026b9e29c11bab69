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


def _image_shape(space):
    """A Box of bytes shaped as an image, [H, W, C] (C of 1 to 4: Gymnasium's pixel
    observations) or [H, W], as anvil's [C, H, W]; else None."""
    shape = tuple(int(d) for d in getattr(space, "shape", ()) or ())
    if not hasattr(space, "dtype") or np.dtype(space.dtype) != np.uint8:
        return None
    if len(shape) == 3 and 1 <= shape[2] <= 4:
        return (shape[2], shape[0], shape[1])
    if len(shape) == 2:
        return (1, shape[0], shape[1])
    return None


def obs_parts(space, env_id):
    """The observation's parts when it holds images or is a Dict: ([(name, dtype, shape)],
    keyed), an image part ("uint8", [C, H, W]) for each Box of bytes shaped [H, W, C] or
    [H, W], a float part ("float32", [n]) for each other Box, in the Dict space's order
    (keyed: observations are dicts), or a lone image Box as one part, "image" (not keyed);
    None for a Box of numbers."""
    spaces = getattr(space, "spaces", None)
    keyed = spaces is not None and hasattr(spaces, "items")
    if keyed:
        items = list(spaces.items())
        if not items:
            raise Fault(f"{env_id}: observation_space is an empty Dict")
    elif _image_shape(space) is not None:
        items = [("image", space)]
    else:
        return None
    parts = []
    for name, sub in items:
        name = str(name)
        if not name.replace("_", "a").isalnum():
            raise Fault(f"{env_id}: observation_space['{name}']: part names are letters, digits and _")
        image = _image_shape(sub)
        if image is not None:
            parts.append((name, "uint8", image))
        else:
            shape, _, _ = _box(sub, f"{env_id}: observation_space['{name}']")
            parts.append((name, "float32", (int(np.prod(shape, dtype=np.int64)),)))
    return parts, keyed


class Rows:
    """Writes observations of parts (a dict of them, or the one image) into rows of bytes
    as anvil lays them out: each part at the next multiple of 4 bytes, images [H, W, C]
    transposed to [C, H, W], float parts as float32."""

    def __init__(self, parts, keyed):
        self.parts, offset = [], 0
        for name, dtype, shape in parts:
            offset = (offset + 3) // 4 * 4
            size = int(np.prod(shape)) * (1 if dtype == "uint8" else 4)
            self.parts.append((name, dtype, tuple(shape), offset, size))
            offset += size
        self.row_bytes = (offset + 3) // 4 * 4
        self.dict = keyed

    def write(self, obs, row):
        """`obs` into `row` (a uint8 array of row_bytes); a Fault naming the part at fault."""
        if self.dict and not hasattr(obs, "keys"):
            raise Fault(f"observation is {type(obs).__name__}; the observation space is a Dict of "
                        f"{', '.join(p[0] for p in self.parts)}")
        for name, dtype, shape, offset, size in self.parts:
            if self.dict:
                if name not in obs:
                    raise Fault(f"observation has no part '{name}' (it has {', '.join(map(str, obs.keys()))})")
                x = obs[name]
            else:
                x = obs
            out = row[offset:offset + size]
            if dtype == "uint8":
                a = np.asarray(x)
                c, hh, ww = shape
                if a.shape not in ((hh, ww, c), (hh, ww)) or (a.ndim == 2 and c != 1):
                    raise Fault(f"observation part '{name}' has shape {a.shape}; the space's is {(hh, ww, c)}")
                if a.dtype != np.uint8:
                    raise Fault(f"observation part '{name}' is {a.dtype}; the space's images are uint8")
                out.reshape(c, hh, ww)[...] = a.reshape(hh, ww, c).transpose(2, 0, 1)
            else:
                try:
                    a = np.asarray(x, dtype=np.float32).reshape(-1)
                except (TypeError, ValueError):
                    raise Fault(f"observation part '{name}' is {type(x).__name__}, not an array of numbers") from None
                if a.size != shape[0]:
                    raise Fault(f"observation part '{name}' has {a.size} numbers; the space's has {shape[0]}")
                out.view(np.float32)[:] = a


def spec(env, env_id):
    """The env's spaces, tasks and agents as lines of "key values" (anvil's `parse_spec`
    reads them), checked; and (obs_dim, discrete, action_shape, rows) for stepping it (obs_dim:
    an observation's numbers, or its row's bytes when it has parts, `obs_parts`, which `rows`,
    a `Rows`, writes; None for a Box of numbers)."""
    if not all(hasattr(env, a) for a in ("observation_space", "action_space", "reset", "step")):
        raise Fault(f"the env ({type(env).__name__}) lacks observation_space, action_space, reset or step "
                    "(Gymnasium's Env API)")
    lines = [f"python {sys.version.split()[0]}"]
    found, rows = obs_parts(env.observation_space, env_id), None
    if found is None:
        _, low, high = _box(env.observation_space, f"{env_id}: observation_space")
        obs_dim = low.size
        lines += [f"obs_low {_floats(low)}", f"obs_high {_floats(high)}"]
    else:  # rows of parts: obs_dim is the row's bytes
        rows = Rows(*found)
        obs_dim = rows.row_bytes
        lines += [f"obs_part {name} {dtype} " + " ".join(str(d) for d in shape) for name, dtype, shape in found[0]]
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
    return "\n".join(lines) + "\n", (obs_dim, discrete, action_shape, rows)


class Check:
    """The env anvil-doctor makes and steps through each door of anvil's Python envs
    (`python:anvil_envs:Check`, in this process and in worker processes): a point on a line,
    moved by the action (clipped to [-1, 1]), rewarded -|x|, truncated after `length` steps.
    Its numpy arrays prove the interpreter, its numpy and the door at once."""

    def __init__(self, index=0, length=8):
        self.observation_space = anvil_team.Box([-100.0], [100.0])
        self.action_space = anvil_team.Box([-1.0], [1.0])
        self.length = int(length)
        self.rng = np.random.default_rng(index)
        self.x, self.t = 0.0, 0

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.x, self.t = float(self.rng.uniform(-1.0, 1.0)), 0
        return np.array([self.x], dtype=np.float32), {}

    def step(self, action):
        self.x += float(np.clip(np.asarray(action, dtype=np.float32).reshape(-1)[0], -1.0, 1.0))
        self.t += 1
        return np.array([self.x], dtype=np.float32), -abs(self.x), False, self.t >= self.length, {}
