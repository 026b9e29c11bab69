"""`import anvil` (python/): training through the prebuilt Trainers (a Python env, a C++ env,
worker processes), the config's errors, Ctrl-C, the GIL, and anvil's C++ envs as a
vector env (shapes, seeds, autoreset, threads). The package is the build's (the folder
ANVIL_PYTHON_PACKAGE names: build/python); the test envs are tests/python/envs."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

PACKAGE = os.environ.get("ANVIL_PYTHON_PACKAGE", "")
ENVS = str(Path(__file__).resolve().parent.parent / "python" / "envs")
EXAMPLES = Path(os.environ.get("ANVIL_EXAMPLES", "/nonexistent"))

if not PACKAGE or not os.path.exists(os.path.join(PACKAGE, "anvil", "__init__.py")):
    pytest.skip("ANVIL_PYTHON_PACKAGE does not name a built anvil package (build/python)", allow_module_level=True)
sys.path[:0] = [PACKAGE, ENVS]

import anvil  # noqa: E402
import pendulum  # noqa: E402

QUICK = {"train.steps": 1200, "train.learning_starts": 400, "train.eval_interval": 600, "train.eval_episodes": 2,
         "run.update_threads": 1}


def short(tmp_path, **more):
    return {**QUICK, **more}


# ---- train ---------------------------------------------------------------------------------

def test_train_a_python_env_class_writes_the_run_and_returns_its_summary(tmp_path):
    s = anvil.train("sac", pendulum.Pendulum, config=short(tmp_path), run_dir=tmp_path / "run")
    assert s["status"] == "finished" and s["env_steps"] == 1200 and s["updates"] > 0
    assert np.isfinite(s["final_eval_return"])
    assert s["config"]["env.id"] == "python:pendulum:Pendulum"
    for f in ("config.yaml", "training.log", "metrics.csv", "summary.json"):
        assert (tmp_path / "run" / f).exists(), f


def test_train_an_env_object_leaves_the_object_untouched_and_key_value_strings(tmp_path):
    env = pendulum.Pendulum(g=9.0)
    s = anvil.train("sac", env, config=[f"{k}={v}" for k, v in QUICK.items()], run_dir=tmp_path / "run")
    assert s["env_steps"] == 1200
    assert env.steps == 0  # deep copies stepped, not the object


def test_train_ppo_on_a_cxx_env_by_id_takes_the_mains_hyperparameters(tmp_path):
    s = anvil.train("ppo", "CartPole-v1", config={"train.steps": 2048, "run.update_threads": 1}, run_dir=tmp_path / "r")
    assert s["env_steps"] >= 2048
    assert s["config"]["env.num_envs"] == 8  # examples/hyperparams/ppo.yaml's CartPole-v1 block


def test_train_discrete_sac_and_recurrent_ppo_by_name_with_their_mains_hyperparameters(tmp_path):
    assert anvil.algorithms() == ["sac", "sac_discrete", "ppo", "ppo_recurrent", "mt_sac"]
    s = anvil.train("sac_discrete", "CartPole-v1", config={**QUICK, "train.steps": 800}, run_dir=tmp_path / "d")
    assert s["status"] == "finished" and s["env_steps"] == 800 and s["updates"] > 0
    assert s["config"]["sac_discrete.critic_lr"] == 1e-3  # examples/hyperparams/sac_discrete.yaml's CartPole-v1
    r = anvil.train("ppo_recurrent", "CartPoleNoVel-v1", config={"train.steps": 512, "run.update_threads": 1},
                    run_dir=tmp_path / "r")
    assert r["status"] == "finished" and r["env_steps"] >= 512
    assert r["config"]["ppo_recurrent.memory"] == 64 and r["config"]["env.num_envs"] == 8
    for run in ("d", "r"):  # their policies act in PyTorch as exported
        policy = anvil.load_policy(tmp_path / run / "policy.safetensors")
        assert policy is not None
    with pytest.raises(anvil.ConfigError, match="continuous actions: use SAC"):
        anvil.train("sac_discrete", "Pendulum-v1", config=QUICK, run_dir=tmp_path / "p")
    assert "ppo_recurrent.sequence_length" in anvil.config_help("ppo_recurrent")


@pytest.mark.skipif("Manipulation" not in anvil.envs(), reason="built without MuJoCo")
def test_train_mt_sac_on_the_manipulation_suite(tmp_path):
    s = anvil.train("mt_sac", "Manipulation", config={"env.tasks": ["reach", "push"], "train.steps": 600,
                                                     "train.learning_starts": 300, "train.eval_interval": 600,
                                                     "train.eval_episodes": 2, "env.num_envs": 2,
                                                     "run.update_threads": 1}, run_dir=tmp_path / "mt")
    assert s["env_steps"] == 600 and s["status"] == "finished"


def test_bad_keys_raise_the_line_the_mains_print(tmp_path):
    with pytest.raises(anvil.ConfigError) as e:
        anvil.train("sac", pendulum.Pendulum, config={"train.stepz": 3})
    assert str(e.value) == "command line '--train.stepz=3': unknown key 'train.stepz'; did you mean 'train.steps'?"
    main = EXAMPLES / "train_sac"
    if main.exists():  # the very line train_sac prints (after "error: ")
        r = subprocess.run([str(main), "--train.stepz=3"], capture_output=True, text=True, cwd=tmp_path)
        assert r.returncode == 2 and r.stderr.strip() == "error: " + str(e.value)
    with pytest.raises(anvil.ConfigError, match="sac.batch_size"):
        anvil.train("sac", pendulum.Pendulum, config={"sac.batch_size": -1})
    with pytest.raises(anvil.ConfigError, match="algorithm='dqn'"):
        anvil.train("dqn", pendulum.Pendulum)
    with pytest.raises(anvil.ConfigError, match="env.id='Pong'"):
        anvil.train("sac", "Pong")
    with pytest.raises(TypeError, match="neither an env id"):
        anvil.train("sac", 42)
    assert issubclass(anvil.ConfigError, ValueError)


def test_an_env_that_fails_is_named_with_its_step(tmp_path):
    import faulty
    with pytest.raises(anvil.EnvError, match=r"env 0 of 1: step 50 .*ValueError"):
        anvil.train("sac", faulty.Raises, config={**QUICK, "env.kwargs.after": 50}, run_dir=tmp_path / "f")


def test_workers_refuse_a_lambda_and_import_a_module_level_factory(tmp_path):
    with pytest.raises(anvil.ConfigError, match="lambda"):
        anvil.train("sac", lambda: pendulum.Pendulum(), config={**QUICK, "env.workers": 1})
    s = anvil.train("sac", pendulum.make, config={**QUICK, "env.workers": 1, "env.num_envs": 2},
                    run_dir=tmp_path / "w")
    assert s["env_steps"] == 1200


def test_the_gil_is_free_while_anvil_trains(tmp_path):
    ticks = []
    stop = threading.Event()

    def tick():
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.001)

    t = threading.Thread(target=tick)
    t.start()
    begin = time.monotonic()
    anvil.train("sac", "Pendulum-v1", config={**QUICK, "train.steps": 1500, "run.tensorboard": False},
                run_dir=tmp_path / "gil")
    end = time.monotonic()
    stop.set()
    t.join()
    inside = [x for x in ticks if begin + 0.2 < x < end - 0.2]
    # a tick a millisecond (sleep's overshoot included, ~1.1 ms) when the GIL is free; none if held
    assert end - begin > 1.0
    assert len(inside) > 0.3 * (end - begin - 0.4) * 1000, (len(inside), end - begin)


CTRL_C = """
import os, sys, anvil, pendulum
try:
    anvil.train("sac", pendulum.Pendulum, config={"train.steps": 200000, "train.learning_starts": 300,
                                                  "run.update_threads": 1}, run_dir="run")
    print("FINISHED")
except KeyboardInterrupt as e:
    print("KeyboardInterrupt:", e, flush=True)
    s = anvil.train("sac", pendulum.Pendulum, config={"train.steps": 2500, "run.resume": "auto",
                                                      "run.update_threads": 1}, run_dir="run")
    print("RESUMED", s["env_steps"], s["status"], flush=True)
"""


def test_ctrl_c_writes_a_checkpoint_and_raises_keyboard_interrupt(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([PACKAGE, ENVS]))
    p = subprocess.Popen([sys.executable, "-c", CTRL_C], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    log = tmp_path / "run" / "metrics.csv"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (log.exists() and log.read_text().count("\n") >= 2):
        time.sleep(0.1)  # a row after the first 1000 steps: the run is under way
    p.send_signal(signal.SIGINT)
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 0, out
    assert "KeyboardInterrupt: stopped by SIGINT at env step" in out, out
    assert "FINISHED" not in out
    assert list((tmp_path / "run").glob("checkpoint-*.ckpt")), out
    assert "RESUMED 2500 finished" in out, out


# ---- make_vec ------------------------------------------------------------------------------

def test_make_vec_shapes_spaces_and_bad_actions():
    envs = anvil.make_vec("Pendulum-v1", 16)
    assert envs.num_envs == 16 and envs.single_observation_space.shape == (3,)
    assert envs.action_space.shape == (16, 1) and envs.single_action_space.shape == (1,)
    obs, infos = envs.reset(seed=0)
    assert obs.shape == (16, 3) and obs.dtype == np.float32 and infos == {}
    obs, r, te, tr, infos = envs.step(np.zeros((16, 1), np.float32))
    assert obs.shape == (16, 3) and r.shape == (16,) and r.dtype == np.float64
    assert te.dtype == np.bool_ and tr.dtype == np.bool_ and not te.any() and not tr.any()
    envs.step(np.zeros(16))  # one number per action: a 1-D array is taken
    with pytest.raises(ValueError, match=r"actions: shape \(8, 1\); expected \(16, 1\)"):
        envs.step(np.zeros((8, 1)))
    cart = anvil.make_vec("CartPole-v1", 4)
    cart.reset(seed=1)
    cart.step(np.array([0, 1, 0, 1]))
    with pytest.raises(TypeError, match="expected integers"):
        cart.step(np.zeros(4, np.float32))
    with pytest.raises(ValueError, match=r"actions\[2\] is 5"):
        cart.step(np.array([0, 1, 5, 1]))
    with pytest.raises(anvil.Error, match="before reset"):
        anvil.make_vec("Acrobot-v1", 2).step(np.zeros(2, np.int64))
    with pytest.raises(anvil.ConfigError, match="env.id='Nope'"):
        anvil.make_vec("Nope", 2)


def rollout(envs, seed, steps, rng_seed=5):
    rng = np.random.default_rng(rng_seed)
    out = [envs.reset(seed=seed)[0]]
    for _ in range(steps):
        a = rng.uniform(-2, 2, size=(envs.num_envs, 1)).astype(np.float32)
        out.append(envs.step(a))
    return out


def test_make_vec_seeds_repeat_and_differ_between_envs():
    a = anvil.make_vec("Pendulum-v1", 4)
    o1 = a.reset(seed=7)[0]
    o2 = a.reset(seed=7)[0]
    o3 = a.reset(seed=8)[0]
    assert np.array_equal(o1, o2) and not np.array_equal(o1, o3)
    assert len({tuple(row) for row in o1}) == 4  # each env from its own stream
    r1 = rollout(anvil.make_vec("Pendulum-v1", 4), 3, 50)
    r2 = rollout(anvil.make_vec("Pendulum-v1", 4, threads=2), 3, 50)  # threads change nothing
    for x, y in zip(r1[1:], r2[1:]):
        for u, v in zip(x[:4], y[:4]):
            assert np.array_equal(u, v)


def test_python_step_rate_steps_a_python_env_in_this_interpreter():
    # the hook benchmarks/python_host_steps.py times: anvil's VecEnv stepping a Python env
    # with this interpreter as the host (env.workers=0)
    assert anvil._anvil._python_step_rate("python:pendulum:make", 2, 0.02) > 0
    with pytest.raises(ValueError, match="python:MODULE:ATTR"):
        anvil._anvil._python_step_rate("Pendulum-v1", 2, 0.02)
    with pytest.raises(anvil.ConfigError, match="nowhere_module"):
        anvil._anvil._python_step_rate("python:nowhere_module:make", 2, 0.02)


def test_make_vec_autoreset_next_step_and_same_step():
    nxt = anvil.make_vec("Pendulum-v1", 3)
    same = anvil.make_vec("Pendulum-v1", 3, autoreset_mode="same_step")
    a = np.full((3, 1), 0.5, np.float32)
    nxt.reset(seed=11)
    same.reset(seed=11)
    total = np.zeros(3)
    for t in range(200):  # Pendulum truncates after 200 steps
        on, rn, ten, trn, infn = nxt.step(a)
        os_, rs, tes, trs, infs = same.step(a)
        total += rn
        assert np.array_equal(rn, rs)
        if t < 199:
            assert not trn.any() and "episode" not in infn
    assert trn.all() and not ten.any() and trs.all()
    assert np.array_equal(infn["_episode"], [True] * 3) and np.array_equal(infn["episode"]["l"], [200] * 3)
    assert np.allclose(infn["episode"]["r"], total)
    assert np.array_equal(on, infs["final_obs"]) and infs["_final_obs"].all()  # the last observations
    first, r, te, tr, info = nxt.step(a)  # next_step: this step starts the new episodes
    assert np.array_equal(first, os_) and (r == 0).all() and not te.any() and not tr.any()
    o2n = nxt.step(a)[0]
    o2s = same.step(a)[0]
    assert np.array_equal(o2n, o2s)  # and both go on alike


def test_make_vec_envs_with_tasks_and_agents():
    if "Manipulation" in anvil.envs():
        envs = anvil.make_vec("Manipulation", 4, tasks="reach,push")
        assert envs.tasks == ["reach", "push"]
        envs.reset(seed=0)
        out = envs.step(np.zeros(envs.action_space.shape, np.float32))
        assert out[0].shape == (4, envs.single_observation_space.shape[0])
        assert sorted(out[4]["task"]) == [0, 0, 1, 1]  # each env's task in the step
    team = anvil.make_vec("Climbing", 5)
    assert team.agents[0] == 2 and team.single_action_space.n == team.agents[2] ** team.agents[0]
    team.reset(seed=2)
    obs, r, te, tr, infos = team.step(np.zeros(5, np.int64))
    assert obs.shape == (5, team.single_observation_space.shape[0])


def test_make_vec_of_the_pixel_task_hands_out_uint8_images_with_the_frames_stacked():
    envs = anvil.make_vec("PixelPendulum-v1", 3, image_size=32, frame_stack=2, action_repeat=3)
    space = envs.single_observation_space
    assert space.shape == (6, 32, 32) and space.dtype == np.uint8 and space.low.max() == 0 and space.high.min() == 255
    assert envs.observation_space.shape == (3, 6, 32, 32) and envs.observation_space.dtype == np.uint8
    obs, _ = envs.reset(seed=4)
    assert obs.shape == (3, 6, 32, 32) and obs.dtype == np.uint8 and obs.std() > 0 and space.contains(obs[0])
    assert not np.array_equal(obs[0], obs[1])  # each env from its own stream
    a = np.full((3, 1), 1.0, np.float32)
    prev = obs
    for _ in range(5):
        obs, r, te, tr, infos = envs.step(a)
        assert obs.shape == (3, 6, 32, 32) and r.shape == (3,) and np.all(r <= 0)
        assert np.array_equal(obs[:, :3], prev[:, 3:])  # the newest frame becomes the older one
        assert not np.array_equal(obs[:, 3:], prev[:, 3:])
        prev = obs
    again = anvil.make_vec("PixelPendulum-v1", 3, image_size=32, frame_stack=2, action_repeat=3)
    assert np.array_equal(again.reset(seed=4)[0], envs.reset(seed=4)[0])  # seeds repeat
    own = anvil.make_vec("PixelPendulum-v1", 1)  # the task's own: 64x64, 3 frames
    assert own.single_observation_space.shape == (9, 64, 64) and own.reset(seed=0)[0].shape == (1, 9, 64, 64)


def test_make_vec_of_the_pixel_task_ends_episodes_with_their_last_images():
    envs = anvil.make_vec("PixelPendulum-v1", 2, autoreset_mode="same_step", image_size=16, frame_stack=1, action_repeat=2)
    envs.reset(seed=1)
    a = np.zeros((2, 1), np.float32)
    for _ in range(100):  # 200 env steps of Pendulum: 100 steps of 2
        obs, r, te, tr, infos = envs.step(a)
    assert tr.all() and infos["_final_obs"].all()
    assert infos["final_obs"].shape == (2, 3, 16, 16) and infos["final_obs"].dtype == np.uint8
    assert np.array_equal(infos["episode"]["l"], [100, 100])


def test_make_vec_and_train_refuse_bad_pixel_settings_naming_the_field(tmp_path):
    with pytest.raises(anvil.ConfigError, match=r"env.image_size, env.frame_stack and env.action_repeat apply to a "
                                                r"pixel task anvil draws \(PixelPendulum-v1\); env.id is Pendulum-v1"):
        anvil.make_vec("Pendulum-v1", 2, image_size=32)
    with pytest.raises(anvil.ConfigError, match="frame_stack = -1 is out of range"):
        anvil.make_vec("PixelPendulum-v1", 2, frame_stack=-1)
    with pytest.raises(anvil.ConfigError, match="env.image_size"):
        anvil.make_vec("PixelPendulum-v1", 2, image_size=4)
    with pytest.raises(anvil.ConfigError, match=r"apply to a pixel task anvil draws .*the env is python:pendulum:Pendulum, in Python"):
        anvil.train("sac", pendulum.Pendulum, config={"env.frame_stack": 2}, run_dir=tmp_path / "run")


def test_train_sac_on_the_pixel_task_by_id(tmp_path):
    cfg = {"train.steps": 300, "train.learning_starts": 200, "train.eval_interval": 300, "train.eval_episodes": 1,
           "run.update_threads": 1, "buffer.capacity": 1000, "sac.batch_size": 16, "sac.encoder.width": 8,
           "sac.encoder.features": 16, "env.image_size": 32, "env.frame_stack": 2}
    s = anvil.train("sac", "PixelPendulum-v1", config=cfg, run_dir=tmp_path / "run")
    assert s["status"] == "finished" and s["env_steps"] == 300 and s["updates"] > 0
    assert np.isfinite(s["final_eval_return"])
    assert "observations: pixels uint8 [6,32,32]" in (tmp_path / "run" / "training.log").read_text()
    torch = pytest.importorskip("torch", reason="the policy as a torch module needs torch (Debian: python3-torch)")
    policy = anvil.load_policy(tmp_path / "run" / "policy.safetensors")  # the encoder with the actor
    obs, _ = anvil.make_vec("PixelPendulum-v1", 4, image_size=32, frame_stack=2).reset(seed=0)
    with torch.no_grad():
        a = policy(torch.from_numpy(obs)).numpy()  # uint8 images as make_vec hands them out
    assert a.shape == (4, 1) and np.all(np.abs(a) <= 2.0) and len(np.unique(a)) > 1


def test_pip_installs_the_built_package_offline(tmp_path):
    probe = [subprocess.run([sys.executable, *a], capture_output=True).returncode
             for a in (["-c", "import venv, setuptools"], ["-m", "pip", "--version"])]
    if any(probe):
        pytest.skip("this Python has no pip, venv or setuptools (Debian: python3-pip python3-venv python3-setuptools)")
    venv = tmp_path / "venv"
    r = subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot make a virtual environment here: {r.stderr.strip()[-200:]}")
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--no-index",
           "--quiet", PACKAGE]
    r = subprocess.run(pip, capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    check = "import anvil; e = anvil.make_vec('CartPole-v1', 2); print(anvil.__file__, e.reset(seed=1)[0].shape)"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([str(venv / "bin" / "python"), "-c", check], capture_output=True, text=True, cwd=tmp_path,
                       env=env)
    assert r.returncode == 0 and "site-packages" in r.stdout and "(2, 4)" in r.stdout, r.stdout + r.stderr


# ---- weights out ---------------------------------------------------------------------------

@pytest.mark.parametrize("normalise", [False, True])
def test_load_policy_acts_as_the_cxx_policy_within_1e_5(tmp_path, normalise):
    try:
        import torch
    except ImportError:
        pytest.skip("no PyTorch for this Python (Debian: python3-torch)")
    run = tmp_path / "run"
    anvil.train("sac", "Pendulum-v1", config={**QUICK, "normalize.obs": normalise}, run_dir=run)
    module = anvil.load_policy(run / "policy.safetensors")
    assert isinstance(module, torch.nn.Module) and module.metadata["env"] == "Pendulum-v1"
    names = set(anvil.safetensors.load(run / "policy.safetensors")[0])
    assert {k for k in module.state_dict()} == names  # the file's names are the module's own
    assert "net.fc0.weight" in names and ("obs_mean" in names) == normalise
    obs = np.random.default_rng(0).uniform([-1, -1, -8], [1, 1, 8], size=(1000, 3)).astype(np.float32)
    with torch.no_grad():
        ours = module(torch.from_numpy(obs)).numpy()
    cxx = anvil._anvil.policy_act(str(run / "policy.bin"), obs)
    assert ours.shape == (1000, 1) and np.abs(ours - cxx).max() < 1e-5
    assert np.abs(cxx).max() <= 2.0 + 1e-6 and np.abs(cxx).max() > 0


def test_the_python_safetensors_reader_refuses_damaged_files(tmp_path):
    p = tmp_path / "w.safetensors"
    anvil.safetensors.save(p, {"w": np.arange(4, dtype=np.float32), "b": np.ones(2)}, {"k": "v"})
    tensors, meta = anvil.safetensors.load(p)
    assert np.array_equal(tensors["w"], np.arange(4)) and meta == {"k": "v"}
    good = p.read_bytes()
    p.write_bytes(good[:-3])
    with pytest.raises(anvil.safetensors.FormatError, match="tensor 'b'"):
        anvil.safetensors.load(p)
    p.write_bytes(good[:5])
    with pytest.raises(anvil.safetensors.FormatError, match="truncated"):
        anvil.safetensors.load(p)


def test_a_ppo_run_writes_a_policy_torch_loads_and_a_state_dict_starts_another_run(tmp_path):
    try:
        import torch
    except ImportError:
        pytest.skip("no PyTorch for this Python (Debian: python3-torch)")
    ppo = {"train.steps": 2048, "train.eval_interval": 0, "train.eval_episodes": 1}
    anvil.train("ppo", "CartPole-v1", config=ppo, run_dir=tmp_path / "a")
    module = anvil.load_policy(tmp_path / "a" / "policy.safetensors")
    assert module.metadata["kind"] == "PpoActor" and module.metadata["env"] == "CartPole-v1"
    with torch.no_grad():
        actions = module(torch.zeros(5, 4))
    assert actions.dtype == torch.int64 and actions.shape == (5,)
    # a state_dict made in PyTorch, saved as safetensors, starts a run (init.weights)
    with torch.no_grad():
        for p in module.parameters():
            p.mul_(0.5)
    state = {k: v.numpy() for k, v in module.state_dict().items()}
    anvil.safetensors.save(tmp_path / "half.safetensors", state)
    s = anvil.train("ppo", "CartPole-v1", config={**ppo, "init.weights": str(tmp_path / "half.safetensors")},
                    run_dir=tmp_path / "b")
    assert s["status"] == "finished"
    assert "init.weights: the ppo actor starts from" in (tmp_path / "b" / "training.log").read_text()
    # one that does not fit is refused, naming the tensor
    state["net.fc0.weight"] = np.zeros((3, 4), np.float32)
    anvil.safetensors.save(tmp_path / "bad.safetensors", state)
    with pytest.raises(anvil.ConfigError, match=r"'net.fc0.weight' is \[3, 4\] in the file, \[64, 4\] in the ppo actor"):
        anvil.train("ppo", "CartPole-v1", config={**ppo, "init.weights": str(tmp_path / "bad.safetensors")},
                    run_dir=tmp_path / "c")


# ---- the SAC comparison's shared evaluation (benchmarks/python_module_sac.py --common-eval) --

BENCHMARKS = Path(__file__).resolve().parent.parent.parent / "benchmarks"


def test_the_shared_pendulum_evaluation_scores_known_controllers_exactly():
    torch = pytest.importorskip("torch", reason="the shared evaluation acts through torch (Debian: python3-torch)")
    sys.path.insert(0, str(BENCHMARKS))
    import pendulum_eval
    starts = pendulum_eval.start_states(50)
    assert np.array_equal(starts, pendulum_eval.start_states(50))  # the same states on every side
    assert np.all(np.abs(starts[:, 0]) <= np.pi) and np.all(np.abs(starts[:, 1]) <= 1.0)
    # upright and still, no torque: cost 0 every step; hanging still, no torque: pi^2 on each of 200 steps
    still = lambda obs: torch.zeros(obs.shape[0], 1)  # noqa: E731
    mean, per_episode = pendulum_eval.evaluate(still, np.array([[0.0, 0.0], [np.pi, 0.0]]))
    assert per_episode[0] == 0.0 and per_episode[1] == pytest.approx(-200 * np.pi ** 2, rel=1e-9)
    assert mean == pytest.approx(per_episode.mean())
    # each episode steps the test env from its own start: a batch of one gives the same return
    push = lambda obs: 2.0 * torch.tanh(obs[:, 2:3] - obs[:, 1:2])  # noqa: E731
    _, batch = pendulum_eval.evaluate(push, starts[:7])
    assert np.allclose([pendulum_eval.evaluate(push, starts[i:i + 1])[0] for i in range(7)], batch, rtol=1e-6)
    with pytest.raises(ValueError, match="non-finite action"):
        pendulum_eval.evaluate(lambda obs: torch.full((obs.shape[0], 1), float("nan")), starts[:2])


def test_the_sac_comparison_scores_both_sides_on_the_same_start_states():
    pytest.importorskip("torch", reason="the PyTorch reference needs torch (Debian: python3-torch)")
    r = subprocess.run([sys.executable, str(BENCHMARKS / "python_module_sac.py"), "--seeds", "0", "--steps", "1200",
                        "--eval-interval", "1200", "--eval-episodes", "2", "--common-eval", "20"],
                       env=dict(os.environ, PYTHONPATH=PACKAGE), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    runs = {d["name"]: d for d in lines if "seed" in d}
    for side in ("sac_numpy_pendulum_anvil", "sac_numpy_pendulum_pytorch"):
        assert runs[side]["common_eval_episodes"] == 20 and np.isfinite(runs[side]["common_eval_return"])
    summary = next(d for d in lines if d["name"] == "sac_numpy_pendulum_common_eval")
    assert summary["anvil_returns"] == [runs["sac_numpy_pendulum_anvil"]["common_eval_return"]]
    assert summary["reference_range"] == [runs["sac_numpy_pendulum_pytorch"]["common_eval_return"]] * 2
    for script in ("python_module_sac.py", "reference/sac_pendulum_train.py"):  # a bad count is named, before any run
        bad = subprocess.run([sys.executable, str(BENCHMARKS / script), "--common-eval", "-3"], capture_output=True,
                             text=True, timeout=60)
        assert bad.returncode == 2 and "--common-eval: -3 start states" in bad.stderr, (script, bad.stderr)
