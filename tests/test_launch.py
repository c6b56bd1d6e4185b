"""The launcher, `python -m sok_graph.launch`: CPU workers on localhost.

Most tests run the installed sok_graph/launch directory by its path (it
uses the standard library only), so each run costs a Python start instead of
a TensorFlow import; one test runs the documented `python -m sok_graph.launch`. The
workers are small scripts written to tmp_path. Each worker records its pid,
and every test checks by pid that no worker outlives the launcher.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from sok_graph import launch
from sok_graph.launch import cli as launch_cli

# The package directory: `python <it>` runs its __main__.py.
LAUNCH_PY = os.path.dirname(launch.__file__)
# Generous bounds for a loaded 2-core machine; a hang fails the test instead
# of stalling the suite.
RUN_TIMEOUT_S = 60

WORKER = r"""
import json, os, signal, socket, sys, time

rank = int(os.environ["SOK_GRAPH_RANK"])
size = int(os.environ["SOK_GRAPH_WORLD_SIZE"])
piddir, mode = sys.argv[1], sys.argv[2]


def record_pid():
    tmp = os.path.join(piddir, "%d.tmp" % rank)
    with open(tmp, "w") as f:
        f.write(str(os.getpid()))
    os.rename(tmp, os.path.join(piddir, str(rank)))


def wait_for_all():
    deadline = time.time() + 30
    while len([n for n in os.listdir(piddir) if not n.endswith(".tmp")]) < size:
        if time.time() > deadline:
            sys.exit("not every worker started")
        time.sleep(0.02)


def sleep_forever():
    for _ in range(600):
        time.sleep(0.1)
    sys.exit("slept 60 s: nobody stopped this worker")


if mode == "report":
    record_pid()
    keys = sorted(k for k in os.environ if k.startswith("SOK_GRAPH_"))
    env = {k: os.environ[k] for k in keys + ["TF_CONFIG", "CUDA_VISIBLE_DEVICES"]
           if k in os.environ}
    config = json.loads(os.environ["TF_CONFIG"])
    host, port = config["cluster"]["worker"][config["task"]["index"]].rsplit(":", 1)
    s = socket.socket()
    s.bind((host, int(port)))  # the address TF_CONFIG gives this worker is free
    s.close()
    print(json.dumps({"env": env, "argv": sys.argv[3:]}))
    print("stderr of rank %d" % rank, file=sys.stderr)
elif mode == "fail":
    if rank == 2:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # must be SIGKILLed
    record_pid()
    if rank == 1:
        wait_for_all()
        print("rank 1 about to fail", file=sys.stderr)
        sys.exit(3)
    sleep_forever()
elif mode == "selfkill":
    record_pid()
    if rank == 0:
        wait_for_all()
        os.kill(os.getpid(), signal.SIGKILL)
    sleep_forever()
elif mode == "sleep":
    how = sys.argv[3]

    def on_signal(signum, frame):
        print("rank %d got signal %d" % (rank, signum), flush=True)
        sys.exit(0)

    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, on_signal if how == "obey" else signal.SIG_IGN)
    record_pid()
    sleep_forever()
elif mode == "flood":
    record_pid()
    for i in range(int(sys.argv[3])):
        sys.stdout.write("out %d %d %s\n" % (rank, i, "x" * 40))
        sys.stderr.write("err %d %d %s\n" % (rank, i, "y" * 40))
    sys.stdout.write("last line without newline %d" % rank)
elif mode == "leave_child":
    record_pid()
    import subprocess
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                              "left-by-%d" % rank])
    with open(os.path.join(piddir, "child%d" % rank), "w") as f:
        f.write(str(child.pid))
    print("rank %d done" % rank, flush=True)
elif mode == "marker":
    open(os.path.join(piddir, "started"), "w").close()
"""


@pytest.fixture
def job(tmp_path):
    """A worker script, its pid directory, and the check that no worker
    survives the test (any that does is killed, and the test fails)."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    piddir = tmp_path / "pids"
    piddir.mkdir()
    j = Job(script, piddir)
    yield j
    survivors = [pid for pid in j.pids() if _alive(pid, str(script))]
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    assert not survivors, f"workers still running after the launcher exited: {survivors}"


def _alive(pid, marker):
    """Whether pid is a live (not zombie) process whose command line has marker."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return marker.encode() in cmdline and state != "Z"


def _env(**overrides):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SOK_GRAPH_")}
    env.pop("TF_CONFIG", None)
    # CPU workers unless a test asks for (pretend) GPUs.
    env["CUDA_VISIBLE_DEVICES"] = ""
    env.update(overrides)
    return env


class Job:
    def __init__(self, script, piddir):
        self.script = script
        self.piddir = piddir

    def argv(self, launcher_args, mode, *args):
        return (
            [sys.executable, LAUNCH_PY]
            + list(launcher_args)
            + [str(self.script), str(self.piddir), mode]
            + list(args)
        )

    def run(self, launcher_args, mode, *args, env=None):
        """(exit status, stdout, stderr, seconds) of one launcher run."""
        start = time.monotonic()
        p = subprocess.run(
            self.argv(launcher_args, mode, *args),
            env=env or _env(),
            capture_output=True,
            check=False,
            timeout=RUN_TIMEOUT_S,
        )
        return (p.returncode, p.stdout.decode(), p.stderr.decode(), time.monotonic() - start)

    def pids(self):
        return [int((self.piddir / n).read_text()) for n in os.listdir(self.piddir) if n.isdigit()]

    def wait_for_workers(self, n, proc):
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while len(self.pids()) < n:
            assert proc.poll() is None, "the launcher exited before its workers started"
            assert time.monotonic() < deadline, "workers did not start"
            time.sleep(0.05)


def _launch(script, launcher_args, timeout=RUN_TIMEOUT_S, **env):
    """The finished launcher run of `script` (stdout and stderr captured)."""
    return subprocess.run(
        [sys.executable, LAUNCH_PY] + list(launcher_args) + [str(script)],
        env=_env(**env),
        capture_output=True,
        check=False,
        timeout=timeout,
    )


def _lines_by_rank(text):
    """{rank: [line, ...]} of '[rank] line' lines; other lines under None."""
    out = {}
    for line in text.splitlines():
        rank = None
        if line.startswith("[") and "] " in line:
            head, rest = line[1:].split("] ", 1)
            if head.isdigit():
                rank, line = int(head), rest
        out.setdefault(rank, []).append(line)
    return out


@pytest.mark.parametrize("n", [2, 3])
def test_each_worker_gets_its_rank_world_size_and_tf_config(job, n):
    rc, out, err, _ = job.run(["-np", str(n)], "report", "--flag", "-np", "7")
    assert rc == 0, err
    by_rank = _lines_by_rank(out)
    assert sorted(k for k in by_rank if k is not None) == list(range(n)), out
    assert None not in by_rank, out
    clusters, coordinator_ports = [], set()
    for rank in range(n):
        (line,) = by_rank[rank]
        report = json.loads(line)
        env = report["env"]
        # The script's own arguments reach it unchanged, options included.
        assert report["argv"] == ["--flag", "-np", "7"]
        assert env["SOK_GRAPH_RANK"] == str(rank)
        assert env["SOK_GRAPH_LOCAL_RANK"] == str(rank)
        assert env["SOK_GRAPH_WORLD_SIZE"] == str(n)
        assert env["SOK_GRAPH_LOCAL_WORLD_SIZE"] == str(n)
        assert env["CUDA_VISIBLE_DEVICES"] == ""
        assert env["SOK_GRAPH_COORDINATOR_ADDR"] == "127.0.0.1"
        coordinator_ports.add(env["SOK_GRAPH_COORDINATOR_PORT"])
        config = json.loads(env["TF_CONFIG"])
        assert config["task"] == {"type": "worker", "index": rank}
        assert json.loads(env["SOK_GRAPH_TF_CONFIG"]) == config
        clusters.append(config["cluster"])
        assert launch.worker_info(env) == (rank, rank, n)
        assert f"[{rank}] stderr of rank {rank}" in err.splitlines()
    assert all(c == clusters[0] for c in clusters)
    workers = clusters[0]["worker"]
    assert list(clusters[0]) == ["worker"] and len(workers) == n
    assert all(w.startswith("127.0.0.1:") for w in workers)
    ports = {w.split(":")[1] for w in workers}
    assert len(ports) == n
    assert len(coordinator_ports) == 1 and not (coordinator_ports & ports)


def test_no_tf_config(job):
    # A TF_CONFIG of the caller's is removed, not passed on.
    env = _env(TF_CONFIG='{"stale": 1}')
    script = job.script.parent / "tfconfig.py"
    script.write_text(
        "import os\nprint(os.environ.get('TF_CONFIG'), 'SOK_GRAPH_TF_CONFIG' in os.environ)\n"
    )
    p = subprocess.run(
        [sys.executable, LAUNCH_PY, "-np", "2", "--no-tf-config", str(script)],
        env=env,
        check=False,
        stdout=subprocess.PIPE,
        timeout=RUN_TIMEOUT_S,
    )
    assert p.returncode == 0
    assert sorted(p.stdout.decode().splitlines()) == ["[0] None True", "[1] None True"]


def test_one_worker_per_gpu_in_cuda_visible_devices(job):
    # The GPU ids are only handed out, never used, so any ids will do here.
    def devices(launcher_args, visible):
        rc, out, err, _ = job.run(launcher_args, "report", env=_env(CUDA_VISIBLE_DEVICES=visible))
        assert rc == 0, err
        by_rank = _lines_by_rank(out)
        return [json.loads(by_rank[r][0])["env"]["CUDA_VISIBLE_DEVICES"] for r in sorted(by_rank)]

    assert devices([], "3,5") == ["3", "5"]
    assert devices(["-np", "1"], "3,5") == ["3"]
    assert devices(["-np", "3", "--cpu"], "3,5") == ["", "", ""]
    assert devices([], "GPU-aaaa,GPU-bbbb,7") == ["GPU-aaaa", "GPU-bbbb", "7"]
    assert devices([], "-1") == [""]
    assert devices(["-np", "2"], "") == ["", ""]
    rc, _, err, _ = job.run(["-np", "3"], "report", env=_env(CUDA_VISIBLE_DEVICES="3,5"))
    assert rc == 2
    assert "-np 3 asks for more workers than there are GPUs (2" in err


def test_visible_gpus():
    assert launch.visible_gpus({}, count_gpus=lambda: 2) == ["0", "1"]
    assert launch.visible_gpus({}, count_gpus=lambda: 0) == []
    assert launch.visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, count_gpus=lambda: 8) == []
    assert launch.visible_gpus({"CUDA_VISIBLE_DEVICES": " 2 , 0 "}) == ["2", "0"]
    # CUDA ignores every device from the first invalid (negative) one on.
    assert launch.visible_gpus({"CUDA_VISIBLE_DEVICES": "1,-1,2"}) == ["1"]


def test_failed_worker_stops_the_others_and_its_status_is_the_launchers(job):
    # Rank 1 exits 3 once all are up; rank 0 sleeps; rank 2 ignores SIGTERM,
    # so it stays until the SIGKILL that follows the 2 s grace period.
    rc, _, err, seconds = job.run(["-np", "3", "--grace", "2"], "fail")
    assert rc == 3, err
    assert "rank 1 exited with status 3; stopping 2 other worker(s)" in err
    assert "sending SIGKILL to rank(s) 2" in err
    tail = err.split("rank 1 failed: it exited with status 3; the last lines of its stderr:\n")
    assert len(tail) == 2 and "[1] rank 1 about to fail" in tail[1]
    assert 2 <= seconds < 2 + 20, seconds
    assert len(job.pids()) == 3


def test_worker_killed_by_a_signal(job):
    rc, _, err, seconds = job.run(["-np", "2", "--grace", "5"], "selfkill")
    assert rc == 128 + signal.SIGKILL, err
    assert "rank 0 was killed by SIGKILL (signal 9); stopping 1 other worker(s)" in err
    assert "(it wrote nothing to stderr)" in err
    assert seconds < 5 + 20
    assert len(job.pids()) == 2


def _signal_launcher(job, launcher_args, worker_args, n, signals):
    """Starts the launcher, waits for its n workers and sends it `signals`,
    0.5 s apart; (exit status, stdout, stderr, seconds from the first signal
    to the launcher's exit)."""
    proc = subprocess.Popen(
        job.argv(launcher_args, *worker_args),
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        job.wait_for_workers(n, proc)
        start = time.monotonic()
        for i, signum in enumerate(signals):
            if i:
                time.sleep(0.5)
            proc.send_signal(signum)
        out, err = proc.communicate(timeout=RUN_TIMEOUT_S)
        return proc.returncode, out.decode(), err.decode(), time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_the_launcher_reaches_every_worker(job, signum):
    rc, out, err, _ = _signal_launcher(job, ["-np", "3"], ["sleep", "obey"], 3, [signum])
    assert rc == 128 + signum, err
    assert f"got {signum.name}; forwarding it to 3 worker(s)" in err
    by_rank = _lines_by_rank(out)
    for rank in range(3):
        assert by_rank[rank] == [f"rank {rank} got signal {int(signum)}"]


def test_workers_that_ignore_sigterm_are_killed_after_the_grace_period(job):
    rc, _, err, seconds = _signal_launcher(
        job, ["-np", "2", "--grace", "1"], ["sleep", "ignore"], 2, [signal.SIGTERM]
    )
    assert rc == 128 + signal.SIGTERM, err
    assert "sending SIGKILL to rank(s) 0,1" in err
    assert 1 <= seconds < 1 + 20


def test_a_second_signal_kills_at_once(job):
    rc, _, err, seconds = _signal_launcher(
        job, ["-np", "2", "--grace", "100"], ["sleep", "ignore"], 2, [signal.SIGINT] * 2
    )
    assert rc == 128 + signal.SIGINT, err
    assert "got SIGINT while stopping the workers; killing them now" in err
    assert seconds < 20


def test_killed_launcher_takes_its_workers_along(job):
    # SIGKILL cannot be forwarded: the workers die because the kernel was told
    # (PR_SET_PDEATHSIG) to kill them when the launcher goes.
    proc = subprocess.Popen(
        job.argv(["-np", "2"], "sleep", "ignore"),
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        job.wait_for_workers(2, proc)
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 10
    while any(_alive(pid, str(job.script)) for pid in job.pids()):
        assert time.monotonic() < deadline, "workers outlived their SIGKILLed launcher"
        time.sleep(0.05)


@pytest.mark.parametrize("how", ["flag", "env"])
def test_timeout(job, how):
    args, env = (
        (["--timeout", "1"], _env()) if how == "flag" else ([], _env(SOK_GRAPH_LAUNCH_TIMEOUT="1"))
    )
    rc, _, err, seconds = job.run(args + ["-np", "2", "--grace", "1"], "sleep", "obey", env=env)
    assert rc == 124, err
    assert "timeout of 1 s reached; stopping 2 worker(s)" in err
    assert 1 <= seconds < 1 + 20


def test_output_of_every_line_arrives_prefixed_without_blocking(job):
    # 2 x 20,000 lines per stream (~1.9 MB) would fill any pipe that is not
    # drained while the launcher waits on the other one.
    n = 20000
    rc, out, err, _ = job.run(["-np", "2"], "flood", str(n))
    assert rc == 0, err[-2000:]
    outs, errs = _lines_by_rank(out), _lines_by_rank(err)
    for rank in range(2):
        expected = [f"out {rank} {i} {'x' * 40}" for i in range(n)]
        assert outs[rank] == expected + [f"last line without newline {rank}"]
        assert errs[rank] == [f"err {rank} {i} {'y' * 40}" for i in range(n)]


@pytest.mark.parametrize(
    "args, env, message",
    [
        (["-np", "0", "{script}"], {}, "argument -np/--np: must be a positive integer"),
        (["-np", "two", "{script}"], {}, "got 'two'"),
        ([], {}, "no script given"),
        (["-np", "2"], {}, "no script given"),
        (["-np", "2", "--"], {}, "no script given"),
        (["{missing}"], {}, "is not a file"),
        (["--timeout", "-1", "{script}"], {}, "argument --timeout: must be a positive number"),
        (["--grace", "inf", "{script}"], {}, "argument --grace: must be a positive number"),
        (
            ["{script}"],
            {"SOK_GRAPH_LAUNCH_GRACE": "soon"},
            "environment variable SOK_GRAPH_LAUNCH_GRACE must be a positive number of seconds",
        ),
        (
            ["{script}"],
            {"SOK_GRAPH_LAUNCH_TIMEOUT": "0"},
            "environment variable SOK_GRAPH_LAUNCH_TIMEOUT must be a positive number of seconds",
        ),
        # A GPU listed twice gave two workers the same device (each its own
        # CUDA_VISIBLE_DEVICES=0).
        (
            ["{script}"],
            {"CUDA_VISIBLE_DEVICES": "0,0"},
            "CUDA_VISIBLE_DEVICES=0,0 lists GPU 0 more than once: 2 workers would share it",
        ),
        (
            ["-np", "3", "{script}"],
            {"CUDA_VISIBLE_DEVICES": "3, 1,3"},
            "lists GPU 3 more than once: 3 workers would share it",
        ),
    ],
)
def test_bad_arguments_exit_2_with_a_message(job, args, env, message):
    fill = {"script": str(job.script), "missing": str(job.script.parent / "missing.py")}
    argv = [sys.executable, LAUNCH_PY] + [a.format(**fill) for a in args]
    if "{script}" in args:
        argv += [str(job.piddir), "marker"]
    p = subprocess.run(
        argv, env=_env(**env), capture_output=True, check=False, timeout=RUN_TIMEOUT_S
    )
    err = p.stderr.decode()
    assert p.returncode == 2, err
    assert "sok_graph.launch: error: " in err and message in err, err
    assert not (job.piddir / "started").exists()


def test_python_dash_m_entry_point(job):
    # What users type. Imports sok_graph (and TensorFlow) in the launcher.
    site = os.path.dirname(os.path.dirname(os.path.abspath(LAUNCH_PY)))
    env = _env(
        PYTHONPATH=os.pathsep.join(
            [site] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        )
    )
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "sok_graph.launch",
            "-np",
            "2",
            str(job.script),
            str(job.piddir),
            "report",
        ],
        cwd=str(job.script.parent),
        env=env,
        capture_output=True,
        check=False,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr.decode()[-3000:]
    by_rank = _lines_by_rank(p.stdout.decode())
    assert sorted(k for k in by_rank if k is not None) == [0, 1]
    for rank in range(2):
        assert json.loads(by_rank[rank][0])["env"]["SOK_GRAPH_RANK"] == str(rank)


MWMS_WORKER = """
import os
import tensorflow as tf

tf.compat.v1.enable_eager_execution()  # TF 1.x starts in graph mode
rank = int(os.environ["SOK_GRAPH_RANK"])
# TF 1.15 spells them experimental.MultiWorkerMirroredStrategy and
# experimental_run_v2.
mwms = (getattr(tf.distribute, "MultiWorkerMirroredStrategy", None)
        or tf.distribute.experimental.MultiWorkerMirroredStrategy)
strategy = mwms()


run = getattr(strategy, "run", None) or strategy.experimental_run_v2


def replica_step():
    return tf.distribute.get_replica_context().all_reduce("sum", tf.constant(rank + 1.0))


@tf.function
def step():
    return run(replica_step)


total = strategy.experimental_local_results(step())[0]
print("replicas", strategy.num_replicas_in_sync, "sum", float(total))
"""


def test_tf_config_drives_multi_worker_mirrored_strategy(tmp_path):
    # The TF_CONFIG the launcher writes is what MultiWorkerMirroredStrategy
    # needs: 2 workers on localhost all-reduce rank + 1 to 1 + 2.
    script = tmp_path / "mwms.py"
    script.write_text(MWMS_WORKER)
    p = _launch(script, ["-np", "2", "--timeout", "240"], timeout=300,
                TF_CPP_MIN_LOG_LEVEL="2")
    assert p.returncode == 0, p.stderr.decode()[-3000:]
    by_rank = _lines_by_rank(p.stdout.decode())
    for rank in range(2):
        assert by_rank[rank] == [f"replicas 2 sum {float(1 + 2)}"]


def test_worker_info():
    assert launch.worker_info({}) == (0, 0, 1)
    info = launch.worker_info(
        {"SOK_GRAPH_RANK": "2", "SOK_GRAPH_LOCAL_RANK": "0", "SOK_GRAPH_WORLD_SIZE": "4"}
    )
    assert (info.rank, info.local_rank, info.world_size) == (2, 0, 4)
    # Launched by horovodrun or mpirun instead; ours first when both are set.
    assert launch.worker_info(
        {"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": "1"}
    ) == (1, 1, 2)
    assert launch.worker_info({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "5"}) == (
        3,
        3,
        5,
    )
    assert launch.worker_info(
        {
            "SOK_GRAPH_RANK": "0",
            "SOK_GRAPH_WORLD_SIZE": "1",
            "HOROVOD_RANK": "1",
            "HOROVOD_SIZE": "2",
        }
    ) == (0, 0, 1)
    with pytest.raises(ValueError, match="SOK_GRAPH_RANK is set but SOK_GRAPH_WORLD_SIZE is not"):
        launch.worker_info({"SOK_GRAPH_RANK": "0"})
    with pytest.raises(ValueError, match="SOK_GRAPH_WORLD_SIZE must be an integer >= 1; got '0'"):
        launch.worker_info({"SOK_GRAPH_RANK": "0", "SOK_GRAPH_WORLD_SIZE": "0"})
    with pytest.raises(ValueError, match="SOK_GRAPH_RANK must be an integer >= 0; got 'x'"):
        launch.worker_info({"SOK_GRAPH_RANK": "x", "SOK_GRAPH_WORLD_SIZE": "2"})
    with pytest.raises(ValueError, match=r"SOK_GRAPH_RANK must be < SOK_GRAPH_WORLD_SIZE \(2\)"):
        launch.worker_info({"SOK_GRAPH_RANK": "2", "SOK_GRAPH_WORLD_SIZE": "2"})


def test_worker_info_reads_os_environ(monkeypatch):
    for k in (
        "SOK_GRAPH_RANK",
        "SOK_GRAPH_LOCAL_RANK",
        "SOK_GRAPH_WORLD_SIZE",
        "HOROVOD_RANK",
        "HOROVOD_SIZE",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
    ):
        monkeypatch.delenv(k, raising=False)
    assert launch.worker_info() == (0, 0, 1)
    monkeypatch.setenv("SOK_GRAPH_RANK", "1")
    monkeypatch.setenv("SOK_GRAPH_LOCAL_RANK", "1")
    monkeypatch.setenv("SOK_GRAPH_WORLD_SIZE", "3")
    assert launch.worker_info() == (1, 1, 3)


def test_free_ports_are_distinct_and_bindable():
    ports = launch.free_ports(8)
    assert len(set(ports)) == 8
    for port in ports:
        s = socket.socket()
        s.bind(("127.0.0.1", port))
        s.close()


# -- stall timeout and Horovod's variables ---------------------------------------
#
# Horovod under the launcher: test_launch_horovod.py.

HVD_ENV_REPORT = """
import json, os
print(json.dumps({k: v for k, v in os.environ.items()
                  if k.startswith(("HOROVOD_", "NCCL_")) or k == "SOK_GRAPH_STALL_TIMEOUT"}))
"""


def _env_reports(tmp_path, launcher_args, **env):
    script = tmp_path / "hvd_env.py"
    script.write_text(HVD_ENV_REPORT)
    p = _launch(script, launcher_args, **env)
    assert p.returncode == 0, p.stderr.decode()
    by_rank = _lines_by_rank(p.stdout.decode())
    # What the launcher set: NCCL_ variables the workers merely inherited (a
    # GPU machine's image sets NCCL_VERSION, say) are left out; HOROVOD_ ones
    # always count.
    def set_by_launcher(k, v):
        return k.startswith("HOROVOD_") or os.environ.get(k) != v
    return [{k: v for k, v in json.loads(by_rank[r][0]).items() if set_by_launcher(k, v)}
            for r in sorted(by_rank)]


def test_no_horovod_and_stall_timeout_from_the_environment(tmp_path):
    # Without Horovod (--no-horovod, or not installed) no HOROVOD_ variable
    # is set; the stall bound still reaches the workers.
    expected = {"SOK_GRAPH_STALL_TIMEOUT": "7.5"}
    if "NCCL_NVLS_ENABLE" not in os.environ:
        expected["NCCL_NVLS_ENABLE"] = "0"  # NVLink multicast off unless the user set it
    for env in _env_reports(tmp_path, ["-np", "2", "--no-horovod"], SOK_GRAPH_STALL_TIMEOUT="7.5"):
        assert env == expected


def test_nvlink_multicast_stays_off_unless_the_user_set_it(tmp_path):
    """NCCL_NVLS_ENABLE=0 reaches every worker started from an environment
    without it; a value the user set is passed on as it is."""
    script = tmp_path / "nvls.py"
    script.write_text("import os; print(os.environ.get('NCCL_NVLS_ENABLE'))")
    environ = {k: v for k, v in _env().items() if k != "NCCL_NVLS_ENABLE"}
    p = subprocess.run([sys.executable, LAUNCH_PY, "-np", "2", "--cpu", "--no-horovod",
                        str(script)], capture_output=True, env=environ, timeout=RUN_TIMEOUT_S)
    assert p.returncode == 0, p.stderr.decode()
    by_rank = _lines_by_rank(p.stdout.decode())
    assert {r: by_rank[r] for r in (0, 1)} == {0: ["0"], 1: ["0"]}, by_rank
    envs = launch.worker_environments(2, None, [1, 2], 3, base_env={"NCCL_NVLS_ENABLE": "2"})
    assert [e["NCCL_NVLS_ENABLE"] for e in envs] == ["2", "2"]


def test_horovod_only_where_it_is_installed_and_not_turned_off(tmp_path, monkeypatch):
    script = tmp_path / "noop.py"
    script.write_text("")
    for installed in (False, True):
        monkeypatch.setattr(launch_cli, "horovod_available", lambda v=installed: v)
        assert launch.parse_args(["--cpu", str(script)]).horovod is installed
        assert launch.parse_args(["--cpu", "--no-horovod", str(script)]).horovod is False


def test_horovod_stall_settings():
    def settings(s):
        e = launch.horovod_stall_settings(s)
        return tuple(
            int(e[k])
            for k in (
                "HOROVOD_STALL_CHECK_TIME_SECONDS",
                "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS",
                "HOROVOD_GLOO_TIMEOUT_SECONDS",
            )
        )

    assert settings(120) == (20, 60, 120)
    assert settings(10) == (1, 7, 10)
    assert settings(2.5) == (1, 1, 3)  # whole seconds, never 0 (0 turns them off)
    assert settings(0.1) == (1, 1, 1)
    for s in (4, 5, 7, 10, 11, 60, 120, 1000):
        check, shutdown, gloo = settings(s)
        # Horovod ignores a shutdown time below the check time.
        assert 1 <= check <= shutdown
        # Worst case (a cached collective): up to two checks until it counts
        # as stalled, then up to one check past the shutdown time.
        assert shutdown + 3 * check <= s and gloo == s


_STALL_BOUNDS = "must be 0 (no bound: wait forever) or a number of seconds >= 1e-06"


@pytest.mark.parametrize(
    "args, env, message",
    [
        (["--stall-timeout", "-1"], {}, "argument --stall-timeout: " + _STALL_BOUNDS),
        (
            [],
            {"SOK_GRAPH_STALL_TIMEOUT": "never"},
            "environment variable SOK_GRAPH_STALL_TIMEOUT " + _STALL_BOUNDS,
        ),
        # A positive bound under a microsecond was taken, and TensorFlow,
        # which counts whole microseconds (1e-300 is 0 as a 32-bit float),
        # read it as no timeout: the workers would wait forever.
        (["--stall-timeout", "1e-300"], {}, "argument --stall-timeout: " + _STALL_BOUNDS),
        (
            [],
            {"SOK_GRAPH_STALL_TIMEOUT": "5e-7"},
            "environment variable SOK_GRAPH_STALL_TIMEOUT " + _STALL_BOUNDS,
        ),
    ],
)
def test_bad_stall_timeout_exits_2(tmp_path, args, env, message):
    script = tmp_path / "noop.py"
    script.write_text("")
    p = _launch(script, args, **env)
    assert p.returncode == 2 and message in p.stderr.decode(), p.stderr.decode()


@pytest.mark.parametrize("how", ["flag", "env"])
def test_a_stall_timeout_of_0_is_no_bound(tmp_path, how):
    """The tf.distribute engine reads SOK_GRAPH_STALL_TIMEOUT=0 as no
    timeout (its docstring says so), but the launcher refused
    `--stall-timeout 0` and SOK_GRAPH_STALL_TIMEOUT=0 with status 2. 0 now
    reaches the workers; Horovod, to which 0 would be a bound of 1 s, gets
    its largest settings, as for a bound too large for it."""
    args, env = ((["--stall-timeout", "0"], {}) if how == "flag"
                 else ([], {"SOK_GRAPH_STALL_TIMEOUT": "0"}))
    largest = launch.horovod_stall_settings(launch.environment.HOROVOD_MAX_SECONDS)
    assert launch.horovod_stall_settings(0) == largest
    assert largest["HOROVOD_GLOO_TIMEOUT_SECONDS"] == str(2 ** 31 - 1)
    reports = _env_reports(tmp_path, ["-np", "2"] + args, **env)
    assert len(reports) == 2
    for report in reports:
        assert report["SOK_GRAPH_STALL_TIMEOUT"] == "0", report
        if launch.horovod_available():
            for name, value in largest.items():
                assert report[name] == value, (name, report)


def test_stall_timeout_bounds_in_parse_args(tmp_path, monkeypatch):
    """0 from the environment is no bound, not the default (a value of 0
    must not read as unset); the least bound, 1e-06 s, is taken."""
    script = tmp_path / "noop.py"
    script.write_text("")
    monkeypatch.setenv("SOK_GRAPH_STALL_TIMEOUT", "0")
    assert launch.parse_args(["--cpu", str(script)]).stall_timeout == 0
    monkeypatch.delenv("SOK_GRAPH_STALL_TIMEOUT")
    assert launch.parse_args(["--cpu", str(script)]).stall_timeout == 120
    assert launch.parse_args(["--cpu", "--stall-timeout", "1e-6", str(script)]).stall_timeout \
        == 1e-6
    with pytest.raises(SystemExit) as e:
        launch.parse_args(["--cpu", "--stall-timeout", "9.99e-7", str(script)])
    assert e.value.code == 2


# -- resources: open files and threads ---------------------------------------------


def _with_open_file_limit(soft):
    import resource

    def lower():
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    return lower


def test_more_workers_than_open_files_allow_exit_2_naming_np(job):
    """Each worker takes two of the launcher's file descriptors (its output
    pipes): -np 40 under a limit of 64 died midway with "Too many open
    files" (a traceback from free_ports, or "could not start worker 27")
    after starting workers. Now exit status 2 naming -np, its value and the
    limit, before any worker starts; a count that fits still runs."""
    argv = job.argv(["-np", "40", "--no-horovod"], "marker")
    p = subprocess.run(argv, env=_env(), capture_output=True, check=False,
                       timeout=RUN_TIMEOUT_S, preexec_fn=_with_open_file_limit(64))
    err = p.stderr.decode()
    assert p.returncode == 2, err
    assert "sok_graph.launch: error: -np 40 needs about " in err, err
    assert "more than this process may open: 64 (RLIMIT_NOFILE, `ulimit -n`" in err, err
    assert "Traceback" not in err and "Too many open files" not in err, err
    assert not (job.piddir / "started").exists()
    assert job.pids() == []

    argv = job.argv(["-np", "12", "--no-horovod"], "report")
    p = subprocess.run(argv, env=_env(), capture_output=True, check=False,
                       timeout=RUN_TIMEOUT_S, preexec_fn=_with_open_file_limit(64))
    assert p.returncode == 0, p.stderr.decode()
    assert sorted(_lines_by_rank(p.stdout.decode())) == list(range(12))


def test_descriptor_shortfall_counts_per_worker_and_its_own():
    # 3 open + 16 of its own + 2 per worker (3 with Horovod's connection).
    assert launch_cli.descriptor_shortfall(10, False, limits=(39, 100), in_use=3) is None
    assert launch_cli.descriptor_shortfall(10, True, limits=(49, 100), in_use=3) is None
    assert launch_cli.descriptor_shortfall(10, True, limits=(48, 100), in_use=3) == (
        "-np 10 needs about 49 open file descriptors in the launcher (3 per worker for its "
        "output pipes and its connection to Horovod's rendezvous, and 19 of its own), more "
        "than this process may open: 48 (RLIMIT_NOFILE, `ulimit -n`; its hard limit is 100); "
        "use -np <= 9, or raise the limit (`ulimit -n 49` in the shell that runs the launcher)"
    )
    assert launch_cli.descriptor_shortfall(2, False, limits=(20, -1), in_use=3) == (
        "-np 2 needs about 23 open file descriptors in the launcher (2 per worker for its "
        "output pipes, and 19 of its own), more than this process may open: 20 (RLIMIT_NOFILE, "
        "`ulimit -n`; its hard limit is unlimited); raise the limit (`ulimit -n 23` in the "
        "shell that runs the launcher)"
    )
    assert launch_cli.descriptor_shortfall(10 ** 6, True, limits=(-1, -1), in_use=3) is None


def test_a_reader_thread_that_cannot_start_stops_every_worker(job, monkeypatch):
    """"can't start new thread" after the workers were started raised out of
    _start, and run() stopped none of them: they ran on unwatched. Now the
    started workers are killed and the error is a LaunchError."""
    import threading
    import types

    from sok_graph.launch import supervisor

    procs = []
    popen = subprocess.Popen

    def recording_popen(*args, **kwargs):
        procs.append(popen(*args, **kwargs))
        return procs[-1]

    starts = []
    real_start = threading.Thread.start

    def start(self):
        if len(starts) == 3:
            raise RuntimeError("can't start new thread")
        starts.append(self)
        real_start(self)

    monkeypatch.setattr(supervisor.subprocess, "Popen", recording_popen)
    monkeypatch.setattr(threading.Thread, "start", start)
    monkeypatch.setattr(supervisor, "_die_with_parent_hook", lambda: None)
    args = types.SimpleNamespace(np=3, gpus=None, tf_config=True, stall_timeout=30.0,
                                 script=str(job.script),
                                 script_args=[str(job.piddir), "sleep", "obey"])
    monkeypatch.setattr(os, "environ", dict(_env()))
    with pytest.raises(supervisor.LaunchError, match=r"could not start the thread that reads a "
                                                     r"worker's output \(3 of 6 started\): "
                                                     r"can't start new thread; use a smaller "
                                                     r"-np \(now 3\)"):
        supervisor._start(args, supervisor._Output(), None)
    assert len(procs) == 3
    assert all(p.poll() is not None for p in procs), [p.pid for p in procs]


def test_ports_that_cannot_be_had_are_a_launch_error(monkeypatch):
    import types

    from sok_graph.launch import supervisor

    def no_ports(count):
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(supervisor, "free_ports", no_ports)
    args = types.SimpleNamespace(np=5)
    with pytest.raises(supervisor.LaunchError, match=r"could not find 6 free ports for 5 "
                                                     r"worker\(s\) on 127\.0\.0\.1: \[Errno 24\] "
                                                     r"Too many open files"):
        supervisor._start(args, supervisor._Output(), None)


def test_a_long_output_line_arrives_whole(tmp_path):
    """Lines were read 64 KiB at a time, each piece printed as a line of
    its own with the rank in front: a worker's 100 KB JSON line reached the
    launcher's stdout as two lines, neither of them JSON. Lines of up to
    1 MiB now arrive whole; a longer one comes in 1 MiB lines, each with
    the rank in front. A failed worker's report keeps 4 KiB of a line."""
    script = tmp_path / "long.py"
    script.write_text(
        "import json, sys\n"
        "sys.stdout.write(json.dumps({'k': 'x' * 100000}) + '\\n')\n"
        "sys.stdout.write('y' * (2 * 1048576 + 5))\n"
        "sys.stdout.flush()\n"
        "sys.stderr.write('z' * 10000 + '\\n')\n"
        "sys.exit(3)\n"
    )
    p = _launch(script, ["--no-horovod"])
    out = p.stdout.decode().split("\n")
    assert out[0] == '[0] {"k": "' + "x" * 100000 + '"}'
    assert out[1:] == ["[0] " + "y" * 1048576, "[0] " + "y" * 1048576, "[0] yyyyy", ""]
    err = p.stderr.decode()
    assert p.returncode == 3 and "[0] " + "z" * 10000 + "\n" in err, err[-300:]
    assert "[0] " + "z" * 4096 + " [...]\n" in err.split("the last lines of its stderr:")[1]


def test_a_failed_workers_report_names_its_error_before_a_long_traceback(tmp_path):
    """TensorFlow prints an error's message and then the traceback of the
    failing op's creation: the report of a failed worker, its last 20
    stderr lines, showed only that traceback (a multi-worker test's failure
    said where it failed, not what). The report now also gives the last
    line that names an exception."""
    script = tmp_path / "fails.py"
    script.write_text(
        "import sys\n"
        "sys.stderr.write('Traceback (most recent call last):\\n')\n"
        "sys.stderr.write('tensorflow.python.framework.errors_impl.DeadlineExceededError: '\n"
        "                 'Collective ops timed out after 5 s\\n')\n"
        "for i in range(30):\n"
        "    sys.stderr.write('  File \"model.py\", line %d, in step\\n' % i)\n"
        "sys.exit(1)\n"
    )
    p = _launch(script, ["--no-horovod"])
    err = p.stderr.decode()
    assert p.returncode == 1, err[-2000:]
    report = err.split("the last lines of its stderr:\n")[1]
    assert report.startswith(
        "its last error, before the last lines: [0] tensorflow.python.framework.errors_impl."
        "DeadlineExceededError: Collective ops timed out after 5 s\n"), report[:500]
    lines = report.splitlines()
    assert lines[1:21] == ['[0]   File "model.py", line %d, in step' % i for i in range(10, 30)], report
    # An error among the last lines is not repeated.
    script.write_text("import sys\nsys.stderr.write('ValueError: bad\\n')\nsys.exit(2)\n")
    err = _launch(script, ["--no-horovod"]).stderr.decode()
    assert err.split("the last lines of its stderr:\n")[1].startswith("[0] ValueError: bad\n"), err


def test_a_child_a_worker_left_running_is_ended_with_the_job(job):
    """A worker that exits 0 and leaves a process it started running: the
    launcher used to return 0 and leave the child running (its output pipes
    held open for the drain's 2 s). It now stops the worker's process group."""
    rc, out, err, _ = job.run(["-np", "2", "--grace", "2"], "leave_child")
    assert rc == 0, err
    assert "exited and left processes running in their process group" in err
    children = [int((job.piddir / f"child{r}").read_text()) for r in (0, 1)]
    deadline = time.monotonic() + 10
    while any(_alive(pid, "left-by") for pid in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in children if _alive(pid, "left-by")]


@pytest.mark.parametrize("closed", ["stdout", "stderr"])
def test_a_launcher_started_with_a_closed_output_returns_its_workers_status(job, closed):
    """`>&-` or `2>&-`: the launcher has no sys.stdout (sys.stderr); it
    drops what would go there. It used to fail in its reader threads and
    report 1 for a job that succeeded (stdout) or whose worker exited 3."""
    descriptor = {"stdout": 1, "stderr": 2}[closed]
    for mode, expected in (("flood", 0), ("fail", 3)):
        argv = job.argv(["-np", "3", "--grace", "1"], mode, "200")
        p = subprocess.run(["bash", "-c", f'exec "$@" {descriptor}>&-', "launch"] + argv,
                           env=_env(), capture_output=True, check=False,
                           timeout=RUN_TIMEOUT_S)
        assert p.returncode == expected, (mode, p.returncode, p.stdout[-2000:], p.stderr[-2000:])
        assert not [pid for pid in job.pids() if _alive(pid, str(job.script))]
        for f in os.listdir(job.piddir):
            os.remove(job.piddir / f)


# -- the workers' stdin -------------------------------------------------------------

STDIN_REPORT = """
import json, sys
print(json.dumps(sys.stdin.read()))
"""


def _stdin_reports(tmp_path, argv_prefix=(), **run_kwargs):
    """{rank: what it read from stdin} of a 2-worker run; `argv_prefix` runs
    the launcher through a shell that rearranges its descriptors."""
    script = tmp_path / "stdin.py"
    script.write_text(STDIN_REPORT)
    # --timeout: a rank 0 that waits on a stdin that never ends fails the
    # test in seconds instead of hanging it.
    argv = [sys.executable, LAUNCH_PY, "-np", "2", "--no-horovod", "--timeout", "20",
            str(script)]
    p = subprocess.run(list(argv_prefix) + argv, env=_env(), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, check=False, timeout=RUN_TIMEOUT_S, **run_kwargs)
    assert p.returncode == 0, (p.returncode, p.stderr.decode()[-2000:])
    by_rank = _lines_by_rank(p.stdout.decode())
    return {r: json.loads(by_rank[r][0]) for r in sorted(k for k in by_rank if k is not None)}


def test_piped_input_is_rank_0s_stdin(tmp_path):
    """`echo hello | python -m sok_graph.launch -np 2 script.py`: every
    worker read 0 bytes (each had /dev/null), and the input was dropped
    without a word. Rank 0 now reads the launcher's stdin, as with mpirun;
    the others read /dev/null, so no two workers race for one pipe."""
    data = "hello\n" + "x" * 100000 + "\nlast"
    assert _stdin_reports(tmp_path, input=data.encode()) == {0: data, 1: ""}


@pytest.mark.parametrize("stdin", ["terminal", "closed"])
def test_a_terminal_or_closed_stdin_is_kept_from_rank_0(tmp_path, stdin):
    """A terminal: a worker runs in a session of its own, where job control
    would not stop it from reading the terminal with the launcher in the
    background; it reads /dev/null. Closed (`<&-`): the launcher's first
    descriptor would take the number 0 and be what rank 0 inherits (its own
    output pipe, closed in it: no stdin at all, sys.stdin None); it reads
    /dev/null. Here a rank 0 given the terminal waits for input no one
    types, and the run ends in --timeout's 124."""
    if stdin == "terminal":
        import pty

        master, slave = pty.openpty()
        try:
            reports = _stdin_reports(tmp_path, stdin=slave)
        finally:
            os.close(slave)
            os.close(master)
    else:
        reports = _stdin_reports(tmp_path, ["bash", "-c", 'exec "$@" <&-', "launch"])
    assert reports == {0: "", 1: ""}
