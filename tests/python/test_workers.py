"""Python envs in worker processes (env.workers=W), driven through a real anvil program
(examples/train_sac, coma and mt_sac, in the folder ANVIL_EXAMPLES names): the same training as in this process; and
every way the program can end leaves no worker behind and nothing in /dev/shm."""

import csv
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

EXAMPLES = Path(os.environ.get("ANVIL_EXAMPLES", "/nonexistent"))
TRAIN_SAC = str(EXAMPLES / "train_sac")
ENVS = str(Path(__file__).parent / "envs")

pytestmark = pytest.mark.skipif(not TRAIN_SAC or not os.path.exists(TRAIN_SAC),
                                reason="ANVIL_EXAMPLES does not name a folder with a built train_sac")


def environment():
    env = dict(os.environ)
    env["PYTHONPATH"] = ENVS
    for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        env.pop(k, None)
    return env


def train(run_dir, *args, **kw):
    cmd = [TRAIN_SAC, "--env.id=python:pendulum:make", "--env.num_envs=4", f"--run_dir={run_dir}", "--seed=3", *args]
    return subprocess.Popen(cmd, env=environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def workers_of(pid):
    """The live worker processes started by process `pid` (their command line names it)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if any(c.endswith(b"env_worker.py") for c in cmd) and b"--parent" in cmd:
            if cmd[cmd.index(b"--parent") + 1] == str(pid).encode() and state != "Z":
                found.append(int(entry))
    return found


def ended(pid):
    """Process `pid` has exited: gone from /proc, or a zombie (or dead) waiting to be reaped. A
    process in the middle of exiting has already lost its command line, so workers_of no longer
    sees it; this asks its state instead."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def wait_for(predicate, seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def metrics_without_time(run_dir):
    with open(Path(run_dir) / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        del r["wall_s"], r["env_steps_per_s"]
    return rows


def test_training_in_workers_is_training_in_process(tmp_path):
    """Same seed, same envs: metrics.csv is the same (apart from its time columns) with the
    envs in one worker, in two, and (where the bridge is built) in this process."""
    runs = {}
    for w in (0, 1, 2):
        p = train(tmp_path / f"w{w}", "--train.steps=1200", "--train.learning_starts=400", "--train.eval_interval=600",
                  "--train.eval_episodes=2", "--run.log_interval=200", f"--env.workers={w}")
        out, _ = p.communicate(timeout=300)
        if w == 0 and p.returncode != 0 and "no Python env bridge" in out:
            continue  # a build without pybind11: the workers are compared with each other
        assert p.returncode == 0, out
        runs[w] = metrics_without_time(tmp_path / f"w{w}")
    assert len(runs[1]) > 3
    assert runs[2] == runs[1]
    if 0 in runs:
        assert runs[0] == runs[1]


def test_sigkill_of_anvil_leaves_no_worker_and_nothing_in_dev_shm(tmp_path):
    shm_before = set(os.listdir("/dev/shm"))
    p = train(tmp_path / "run", "--train.steps=10000000", "--env.workers=2")
    try:
        assert wait_for(lambda: len(workers_of(p.pid)) >= 2, 60), "the workers did not start"
        time.sleep(1.0)  # mid-training
        started = workers_of(p.pid)
        p.kill()
        p.wait(timeout=30)
        # the workers notice their parent is gone and exit
        assert wait_for(lambda: workers_of(p.pid) == [], 10), f"workers {workers_of(p.pid)} outlived a SIGKILL of anvil"
        assert wait_for(lambda: all(ended(w) for w in started), 10), \
            f"workers {[w for w in started if not ended(w)]} still run after a SIGKILL of anvil"
    finally:
        if p.poll() is None:
            p.kill()
    assert set(os.listdir("/dev/shm")) - shm_before == set()


def test_sigint_checkpoints_first_then_ends_the_workers(tmp_path):
    run = tmp_path / "run"
    p = train(run, "--train.steps=10000000", "--env.workers=2", "--run.checkpoint_interval=100000000")
    assert wait_for(lambda: len(workers_of(p.pid)) >= 2, 60), "the workers did not start"
    time.sleep(2.0)
    p.send_signal(signal.SIGINT)
    out, _ = p.communicate(timeout=120)
    assert list(run.glob("checkpoint-*.ckpt")), out  # the checkpoint of the step it stopped at
    assert (run / "summary.json").exists(), out
    assert workers_of(p.pid) == []


def run_example(name, run_dir, *args, timeout=300):
    cmd = [str(EXAMPLES / name), f"--run_dir={run_dir}", "--seed=1", "--run.progress=off", *args]
    p = subprocess.run(cmd, env=environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout)
    assert p.returncode == 0, p.stdout
    return p.stdout, json.loads((Path(run_dir) / "summary.json").read_text())


@pytest.mark.parametrize("workers", [0, 2])
def test_coma_learns_a_pettingzoo_style_team_env(tmp_path, workers):
    """COMA through examples/coma on a PettingZoo parallel env (tests/python/envs/team.py,
    with action masks in its observation dicts): a few hundred episodes of the one-step
    agreement game take the team from chance (1/9) to agreeing most of the time."""
    out, summary = run_example("coma", tmp_path / "run", "--env.id=python:team:Agree", "--env.num_envs=8",
                               f"--env.workers={workers}", "--train.steps=2400", "--train.eval_interval=0",
                               "--train.eval_episodes=40")
    assert "python:team:Agree" in out
    assert summary["final_eval_return"] > 0.6, out


@pytest.mark.skipif(not (EXAMPLES / "mt_sac").exists(), reason="examples/mt_sac is built with MuJoCo only")
def test_mt_sac_trains_a_multi_task_env_in_python(tmp_path):
    """examples/mt_sac on a multi-task Pendulum in Python (tasks named in info): it runs in
    worker processes, with a temperature and an evaluation per task."""
    out, summary = run_example("mt_sac", tmp_path / "run", "--env.id=python:pendulum:GravityTasks", "--env.num_envs=4",
                               "--env.workers=2", "--train.steps=1200",
                               "--train.learning_starts=400", "--train.eval_interval=0", "--train.eval_episodes=2")
    assert summary["env_steps"] == 1200
    header = (tmp_path / "run" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"eval_return/g10", "eval_return/g4", "alpha/g10", "alpha/g4"} <= set(header), header


def test_a_python_env_id_names_a_plain_run_directory(tmp_path):
    """Without --run_dir the run goes to runs/<algorithm>-<env>-seed<n>-<time>: the id's
    colons become underscores (no subfolder, no TensorBoard name:path pair)."""
    p = subprocess.run([TRAIN_SAC, "--smoke", "--env.id=python:pendulum:make", "--run.progress=off"], cwd=tmp_path,
                       env=environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert p.returncode == 0, p.stdout
    names = [d.name for d in (tmp_path / "runs").iterdir()]
    assert len(names) == 1 and names[0].startswith("sac-python_pendulum_make-seed0-"), names


@pytest.mark.skipif(os.environ.get("ANVIL_PYTHON_HELD") not in ("0", "1"),
                    reason="ANVIL_PYTHON_HELD (set by ctest) does not say how the build linked the mains")
def test_the_mains_that_take_env_id_step_python_in_the_interpreter_they_hold(tmp_path):
    """train_sac links Python's own archive (CMake's anvil_python_in_program) where the build
    found it: its Python envs in process then step in that interpreter, through the bridge
    built with no Python, and the shared libpython is never loaded; else the bridge embeds the
    shared libpython. The run header says which. ANVIL_PYTHON_ENVS (the shared bridge's path)
    does not change that in a program that holds the interpreter: it says it loads the other."""
    run_dir = tmp_path / "run"
    elsewhere = str(tmp_path / "libanvil_python_envs.so")  # no such file: never loaded
    p = subprocess.run([TRAIN_SAC, "--smoke", "--env.id=python:pendulum:make", f"--run_dir={run_dir}",
                        "--run.progress=off"], env=dict(environment(), LD_DEBUG="files", ANVIL_PYTHON_ENVS=elsewhere)
                       if os.environ["ANVIL_PYTHON_HELD"] == "1" else dict(environment(), LD_DEBUG="files"),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-3000:]
    loaded = [line for line in p.stdout.splitlines() if "file=" in line]  # the loader's record (LD_DEBUG)
    shared_libpython = [line for line in loaded if "libpython3" in line]
    if os.environ["ANVIL_PYTHON_HELD"] == "1":
        assert "linked into this program" in p.stdout, p.stdout[-3000:]
        assert any("libanvil_python_envs_host.so" in line for line in loaded)
        assert not shared_libpython, shared_libpython[:3]
        assert f"ANVIL_PYTHON_ENVS is set, but this program holds the interpreter: it loads " \
               f"libanvil_python_envs_host.so" in p.stdout and elsewhere in p.stdout, p.stdout[-3000:]
    else:
        assert "embedded in this process (the shared libpython" in p.stdout, p.stdout[-3000:]
        assert shared_libpython
