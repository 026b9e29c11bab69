"""anvil's Python env worker: steps a slice of a run's envs for the process that started it.

Started by anvil (src/python_envs/workers.cpp, `env.workers=W`) as a fresh interpreter, never
a fork: fd 3 is a socket to that process, fd 4 a shared block of memory. The env factory is
imported by name (`--target module:attr`), called once per env of the slice with the
`--kwarg` values (as Python literals where they are one) and `index=` when it takes one.
The first message is the envs' spec (or why they could not be made); then each command is
one byte ('R' reset, 'S' step, 'Q' quit) acted on in the shared block and answered with one
byte ('k', or 'e' with the fault's text in the block). The worker exits when anvil tells it
to, when the socket closes, or when its parent process changes (anvil was killed).
"""

import os

# Each worker is one of several processes sharing the machine's cores: one BLAS thread each
# (unless the user says otherwise), set before numpy is imported.
for _k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_k, "1")

import mmap
import select
import signal
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from anvil_envs import Fault  # noqa: E402 - beside this file
import anvil_envs  # noqa: E402

SOCK, MEM = 3, 4
# How long a worker looks for its next command before sleeping (ANVIL_WORKER_SPIN_US; 0: sleep at once).
SPIN_SECONDS = float(os.environ.get("ANVIL_WORKER_SPIN_US", "50")) * 1e-6

# The header's int64 slots: the same indices as `Slot` in src/python_envs/workers.cpp.
(MAGIC, COUNT, OBS_DIM, ACT_BYTES, ACTIONS, NEXT_OBS, RESET_OBS, REWARD, TERMINATED, TRUNCATED, TASK, SEED,
 ERROR, ERROR_CAP, BEGIN, END, CURRENT, PHASE, ERROR_LEN, ERROR_ENV, ERROR_PHASE) = range(21)
MAGIC_VALUE = 0x616E76696C313031
STEP, RESET, AUTORESET = 1, 2, 3


def send(data):
    view = memoryview(data)
    while view:
        n = os.write(SOCK, view)
        view = view[n:]


def send_message(kind, text):
    body = text.encode()
    send(f"{kind} {len(body)}\n".encode() + body)


class Worker:
    def __init__(self, args):
        env_id = "python:" + args["target"]
        factory = anvil_envs.import_factory(args["target"])
        self.envs = anvil_envs.make_envs(factory, args["kwargs"], args["first"], args["count"])
        e0 = self.envs[0]
        self.spec, (self.obs_dim, self.discrete, self.action_shape, self.rows) = anvil_envs.spec(e0, env_id)
        self.tasks = [str(t) for t in getattr(e0, "tasks", [])]

    def map(self):
        size = os.fstat(MEM).st_size
        self.mm = mmap.mmap(MEM, size)
        h = self.h = np.frombuffer(self.mm, np.int64, count=21)
        self.hv = memoryview(self.mm)[: 21 * 8].cast("q")  # the header, as Python ints (cheaper to set)
        if h[MAGIC] != MAGIC_VALUE:
            raise SystemExit("anvil env worker: the shared block is not laid out")
        n, d = int(h[COUNT]), int(h[OBS_DIM])

        def arr(slot, dtype, count, shape=None):
            a = np.frombuffer(self.mm, dtype, count=count, offset=int(h[slot]))
            return a.reshape(shape) if shape else a

        if self.discrete:
            self.actions = arr(ACTIONS, np.int64, n)
        else:
            self.actions = arr(ACTIONS, np.float32, n * int(h[ACT_BYTES]) // 4, (n, -1))
        rows = np.uint8 if self.rows else np.float32  # rows of parts (images) as bytes
        self.next_obs = arr(NEXT_OBS, rows, n * d, (n, d))
        self.reset_obs = arr(RESET_OBS, rows, n * d, (n, d))
        self.reward = arr(REWARD, np.float64, n)
        self.terminated = arr(TERMINATED, np.uint8, n)
        self.truncated = arr(TRUNCATED, np.uint8, n)
        self.task = arr(TASK, np.int64, n)
        self.seed = arr(SEED, np.int64, n)
        self.error = arr(ERROR, np.uint8, int(h[ERROR_CAP]))

    def observation(self, o, row):
        if self.rows:  # a row of parts: images transposed, numbers as float32
            self.rows.write(o, row)
            return
        try:
            a = np.asarray(o, dtype=np.float32).reshape(-1)
        except (TypeError, ValueError) as e:
            why = anvil_envs.describe(e)
            raise Fault(f"observation is {type(o).__name__}, not an array of numbers ({why})") from None
        if a.size != self.obs_dim:
            raise Fault(f"observation has {a.size} numbers; the observation space has {self.obs_dim}")
        row[:] = a

    def reset_env(self, j):
        result = self.envs[j].reset(seed=int(self.seed[j]))
        if not isinstance(result, tuple) or len(result) != 2:
            what = type(result).__name__ + (f" of {len(result)} values" if isinstance(result, tuple) else "")
            raise Fault(f"reset() returned {what}; expected (obs, info) (Gymnasium's API; the old Gym API returned "
                        "obs alone)")
        self.observation(result[0], self.reset_obs[j])

    def task_of(self, info):
        t = info.get("task") if isinstance(info, dict) else None
        if t is None:
            raise Fault('the env declares tasks, but info has no "task"')
        if isinstance(t, str):
            if t not in self.tasks:
                raise Fault(f"info[\"task\"] is '{t}', not one of the env's tasks")
            return self.tasks.index(t)
        k = int(t)
        if not 0 <= k < len(self.tasks):
            raise Fault(f'info["task"] is {k}; the env has {len(self.tasks)} tasks')
        return k

    def bad_step(self, r):
        """Raises the Fault for a `step` result that is not Gymnasium's five-tuple."""
        if not isinstance(r, (tuple, list)):
            raise Fault(f"step() returned {type(r).__name__}; expected (obs, reward, terminated, truncated, info)")
        if len(r) == 4:
            raise Fault("step() returned 4 values, the old Gym API (obs, reward, done, info); anvil reads "
                        "Gymnasium's (obs, reward, terminated, truncated, info)")
        if len(r) != 5:
            raise Fault(f"step() returned {len(r)} values; expected (obs, reward, terminated, truncated, info)")

    def step_batch(self, lo, hi):
        """Steps envs [lo, hi) of the slice: the step calls in a loop, what they return gathered
        and written into the shared block once per batch (numpy's loops, not Python's); an env
        that ended is reset at once. A fault is raised with h[CURRENT] at its env."""
        h, envs, n = self.hv, self.envs, hi - lo
        actions = self.actions[lo:hi]
        # each env's action is its own: a row of this batch's copy (an int for a Discrete space)
        actions = actions.tolist() if self.discrete else actions.reshape((n,) + self.action_shape).copy()
        obs, rewards, terms, truncs, ended = [None] * n, [0.0] * n, [False] * n, [False] * n, [False] * n
        for k in range(n):
            j = lo + k
            h[CURRENT] = j
            r = envs[j].step(actions[k])
            if type(r) is not tuple or len(r) != 5:
                if isinstance(r, list) and len(r) == 5:
                    r = tuple(r)
                else:
                    self.bad_step(r)
            obs[k], rewards[k], terms[k], truncs[k] = r[0], r[1], r[2], r[3]
            if self.tasks:
                self.task[j] = self.task_of(r[4])
            if r[2] or r[3]:
                self.observation(r[0], self.next_obs[j])  # before the reset, which may reuse the env's array
                obs[k], ended[k] = self.next_obs[j], True
                h[PHASE] = AUTORESET
                self.reset_env(j)
                h[PHASE] = STEP
        if self.rows:
            for k in range(n):
                if not ended[k]:  # written already at an episode's end
                    h[CURRENT] = lo + k
                    self.observation(obs[k], self.next_obs[lo + k])
            obs = None
        try:
            if obs is not None:
                self.next_obs[lo:hi] = np.asarray(obs, dtype=np.float32).reshape(n, self.obs_dim)
        except (TypeError, ValueError):
            for k in range(n):  # find the env: its observation's own fault
                h[CURRENT] = lo + k
                self.observation(obs[k], self.next_obs[lo + k])
            raise
        try:
            self.reward[lo:hi] = rewards
        except (TypeError, ValueError):
            for k in range(n):
                h[CURRENT] = lo + k
                try:
                    float(rewards[k])
                except (TypeError, ValueError):
                    raise Fault(f"reward is {type(rewards[k]).__name__}, not a number") from None
            raise
        self.terminated[lo:hi] = [bool(x) for x in terms]
        self.truncated[lo:hi] = [bool(x) for x in truncs]

    def run(self, command):
        h = self.hv
        lo, hi = h[BEGIN], h[END]
        try:
            if command == b"S":
                h[PHASE] = STEP
                self.step_batch(lo, hi)
            else:
                h[PHASE] = RESET
                for j in range(lo, hi):
                    h[CURRENT] = j
                    self.reset_env(j)
        except Exception as e:  # noqa: BLE001 - every fault of an env goes back to anvil, named
            text = anvil_envs.fault_text(e).encode()[: h[ERROR_CAP]]
            self.error[: len(text)] = np.frombuffer(text, np.uint8)
            h[ERROR_LEN], h[ERROR_ENV], h[ERROR_PHASE] = len(text), h[CURRENT], h[PHASE]
            h[CURRENT] = -1
            return b"e"
        h[CURRENT] = -1
        return b"k"

    def close(self):
        for e in self.envs:
            try:
                if hasattr(e, "close"):
                    e.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass


def next_command(spin=SPIN_SECONDS):
    """The next command byte. A batch often follows the last within microseconds (the training
    loop acts and steps again at once): look for it for `spin` seconds before sleeping in
    `read`, whose wake-up costs tens of microseconds on a virtual machine."""
    if spin > 0:
        end = time.perf_counter() + spin
        while time.perf_counter() < end:
            if select.select([SOCK], [], [], 0)[0]:
                break
    return os.read(SOCK, 1)


def watch(parent):
    """Exits when the process that started this one is gone (killed: no 'Q' ever comes)."""
    while True:
        time.sleep(0.25)
        if os.getppid() != parent:
            os._exit(0)


def parse(argv):
    args = {"kwargs": {}}
    it = iter(argv)
    for a in it:
        if a.startswith("--kwarg="):
            k, _, v = a[len("--kwarg="):].partition("=")
            args["kwargs"][k] = v
        elif a in ("--target", "--name"):
            args[a[2:]] = next(it)
        elif a in ("--first", "--count", "--parent"):
            args[a[2:]] = int(next(it))
        else:
            raise SystemExit(f"anvil env worker: unknown argument {a}")
    return args


def main(argv):
    args = parse(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # anvil decides when its workers end
    threading.Thread(target=watch, args=(args["parent"],), daemon=True).start()
    try:
        worker = Worker(args)
    except Exception as e:  # noqa: BLE001 - why the envs could not be made goes back to anvil
        send_message("error", f"{args['name']}: {anvil_envs.fault_text(e)}")
        return 0
    send_message("spec", worker.spec)
    if os.read(SOCK, 1) != b"m":
        return 0
    worker.map()
    while True:
        c = next_command()
        if c in (b"S", b"R"):
            try:
                send(worker.run(c))
            except OSError:  # anvil is gone
                break
        else:  # b"Q", or b"" when the socket closed
            break
    worker.close()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (BrokenPipeError, ConnectionResetError):
        os._exit(0)
