"""Python workers start wherever C++ workers do: deploy/local/demo.sh and
psnode (Kubeflow TFJob's TF_CONFIG) run the job config's
launch.worker_command, and a TFJob evaluator task runs its
launch.evaluator_command as an observer beside the training job."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import ps.testing

from conftest import timeout_scale

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE_CONFIG = ROOT / "examples" / "python" / "lr_numpy.pbtxt"


def small_config(tmp_path: pathlib.Path, extra: str = "") -> pathlib.Path:
    """The example's config, smaller, with its script beside it."""
    text = EXAMPLE_CONFIG.read_text()
    text = text.replace("num_train: 1000000", "num_train: 200000")
    text = text.replace("num_test: 100000", "num_test: 20000")
    assert "num_train: 200000" in text
    config = tmp_path / "lr_numpy.pbtxt"
    config.write_text(text + extra)
    shutil.copy(ROOT / "examples" / "python" / "lr_numpy.py", tmp_path / "lr_numpy.py")
    return config


def test_demo_runs_the_configs_python_workers(tmp_path):
    config = small_config(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("scheduler_main", "server_main", "trainer"):
        os.symlink(ps.testing.binary(name), bin_dir / name)
    env = dict(os.environ, PS_BIN_DIR=str(bin_dir), PS_RUN_DIR=str(tmp_path / "run"),
               PS_PYTHON=sys.executable,
               PS_PYTHONPATH=str(pathlib.Path(ps.__file__).resolve().parent.parent))
    out = subprocess.run(["bash", str(ROOT / "deploy" / "local" / "demo.sh"), str(config)],
                         capture_output=True, text=True, env=env,
                         timeout=300 * timeout_scale())
    assert out.returncode == 0, out.stderr[-4000:]
    assert "(python3 lr_numpy.py)" in out.stderr or "lr_numpy.py" in out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["model"] == "LR-numpy"
    assert summary["workers"] == 2 and summary["servers"] == 2
    assert abs(summary["test_auc"] - summary["oracle_auc"]) < 0.01, summary


EVALUATOR = '''
import json, os, sys, time
import ps, ps.data, ps.metrics
args = dict(a[2:].split("=", 1) for a in sys.argv[1:])
assert os.environ["PS_ROLE"] == "evaluator"
with ps.observe(args["config"], args["scheduler"]) as o:
    data = ps.data.SyntheticCtr(args["config"])
    b = data.fill(1, 0, 5000)
    sparse, dense = o.table("ctr_sparse"), o.table("ctr_dense")
    aucs = []
    while len(aucs) < 3:
        f = dense.pull()
        d = f.result(timeout=30)
        if f.min_clock < 30:  # judge a model the workers have trained a while
            time.sleep(0.1)
            continue
        uniq, inv = __import__("numpy").unique(b.keys.reshape(-1), return_inverse=True)
        w = sparse.pull(uniq).result(timeout=30)[:, 0]
        s = w[inv].reshape(b.keys.shape).sum(1) + b.numeric @ d[:-1] + d[-1]
        aucs.append(ps.metrics.auc(s, b.labels))
        time.sleep(0.2)
    print(json.dumps({"evaluations": aucs}), flush=True)
'''


def test_tfjob_tasks_run_python_workers_and_an_evaluator(tmp_path):
    config = small_config(tmp_path)
    text = config.read_text().replace(
        "launch {", 'launch {\n  evaluator_command: ["python3", "{config_dir}/evaluator.py"]')
    assert "evaluator_command" in text
    text = text.replace("epochs: 3", "epochs: 6")  # train long enough to be observed
    config.write_text(text)
    (tmp_path / "evaluator.py").write_text(EVALUATOR)
    psnode = ps.testing.binary("psnode")
    # TFJob gives every task an address; only the chief's and the ps tasks'
    # are listened on.
    a = [f"127.0.0.1:{_free_port()}" for _ in range(6)]
    cluster = {"chief": [a[0]], "ps": a[1:3], "worker": a[3:5], "evaluator": a[5:6]}
    procs = {}
    env = dict(os.environ, PS_PYTHON=sys.executable,
               PYTHONPATH=str(pathlib.Path(ps.__file__).resolve().parent.parent))
    env.pop("DMLC_ROLE", None)
    logs = {}
    try:
        for task, count in (("chief", 1), ("ps", 2), ("worker", 2), ("evaluator", 1)):
            for i in range(count):
                e = dict(env, TF_CONFIG=json.dumps(
                    {"cluster": cluster, "task": {"type": task, "index": i}}))
                name = f"{task}{i}"
                logs[name] = open(tmp_path / f"{name}.log", "w+")
                procs[name] = subprocess.Popen(
                    [psnode, f"--config={config}", "--listen_host=127.0.0.1",
                     "--advertise_host=127.0.0.1", f"--bin_dir={_bin_dir(tmp_path)}"],
                    env=e, stdout=subprocess.PIPE if task == "evaluator" else logs[name],
                    stderr=logs[name], text=True)
        codes = {n: p.wait(timeout=300 * timeout_scale()) for n, p in procs.items()}
        assert set(codes.values()) == {0}, (codes, {n: (tmp_path / f"{n}.log").read_text()[-1500:]
                                                   for n in codes})
        evaluations = json.loads(procs["evaluator0"].stdout.read().strip().splitlines()[-1])
        assert len(evaluations["evaluations"]) == 3
        assert max(evaluations["evaluations"]) > 0.7, evaluations
        worker_out = (tmp_path / "worker0.log").read_text() + (tmp_path / "worker1.log").read_text()
        assert "joined as worker" in worker_out
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
        for f in logs.values():
            f.close()


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bin_dir(tmp_path: pathlib.Path) -> str:
    d = tmp_path / "bin"
    if not d.exists():
        d.mkdir()
        for name in ("scheduler_main", "server_main", "trainer"):
            os.symlink(ps.testing.binary(name), d / name)
    return str(d)
