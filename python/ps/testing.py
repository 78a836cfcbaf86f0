"""A local job for tests and notebooks: a real scheduler and real servers
as child processes on loopback, with ports picked by the kernel.

    with ps.testing.LocalCluster("job.pbtxt") as c:
        sess = ps.Session("job.pbtxt", c.scheduler)

Binaries are taken from $PS_BIN_DIR (a directory with scheduler_main and
server_main, e.g. a bundle's ps/bin), else from bazel-bin of the checkout
holding this package. Each process's log is in `dir`/NAME.log.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence, Union


def _find_binary(name: str, bazel_path: str) -> str:
    d = os.environ.get("PS_BIN_DIR")
    if d:
        p = pathlib.Path(d) / name
        if p.exists():
            return str(p)
    root = pathlib.Path(__file__).resolve().parent.parent.parent
    bases = []
    if os.environ.get("PS_RUNFILES"):  # a Bazel test's runfiles (python/tests)
        bases.append(pathlib.Path(os.environ["PS_RUNFILES"]))
    bases.append(root / "bazel-bin")
    bases.append(root)  # the package inside a runfiles tree
    for base in bases:
        p = base / bazel_path
        if p.exists():
            return str(p)
    raise FileNotFoundError(
        f"{name} not found: set PS_BIN_DIR or build it (bazel build --config=opt "
        f"//{os.path.dirname(bazel_path)}:{name})")


def binary(name: str) -> str:
    """Path of one of the job's programs: scheduler_main, server_main,
    trainer, kv_tool, psctl, ckpt_tool, psnode."""
    where = {"scheduler_main": "scheduler/scheduler_main",
             "server_main": "server/server_main",
             "trainer": "worker/trainer",
             "kv_tool": "worker/kv_tool",
             "psctl": "scheduler/psctl",
             "ckpt_tool": "server/ckpt_tool",
             "psnode": "deploy/launch/psnode"}
    return _find_binary(name, where[name])


class LocalCluster:
    """A scheduler and the config's servers as child processes.

    Args:
      config: the job config file.
      num_servers, num_workers: override the config's sizes (0 keeps them).
      dir: where logs go (a temporary directory by default).
      log_level: of the scheduler and servers.
      extra_server_flags: more flags for every server.
    """

    def __init__(self, config: Union[str, os.PathLike], num_servers: int = 0,
                 num_workers: int = 0, dir: Optional[str] = None,
                 log_level: str = "warn", extra_server_flags: Sequence[str] = (),
                 start_servers: bool = True) -> None:
        self.config = os.fspath(config)
        self.dir = dir or tempfile.mkdtemp(prefix="ps-local-")
        os.makedirs(self.dir, exist_ok=True)
        self.num_servers_override = num_servers
        self.num_workers_override = num_workers
        self.log_level = log_level
        self.extra_server_flags = list(extra_server_flags)
        self.procs: Dict[str, subprocess.Popen] = {}
        self._server_count = 0
        self.scheduler = self._start_scheduler()
        if start_servers:
            from .data import describe_config
            n = describe_config(self.config, num_servers, num_workers)["num_servers"]
            for _ in range(n):
                self.start_server()

    def _size_flags(self) -> List[str]:
        flags = []
        if self.num_servers_override:
            flags.append(f"--num_servers={self.num_servers_override}")
        if self.num_workers_override:
            flags.append(f"--num_workers={self.num_workers_override}")
        return flags

    def _spawn(self, name: str, argv: List[str], env: Optional[dict] = None) -> subprocess.Popen:
        log = open(os.path.join(self.dir, name + ".log"), "wb")
        out = open(os.path.join(self.dir, name + ".out"), "wb")
        p = subprocess.Popen(argv, stdout=out, stderr=log, stdin=subprocess.DEVNULL,
                             env=env, start_new_session=True)
        log.close()
        out.close()
        self.procs[name] = p
        return p

    def _start_scheduler(self) -> str:
        port_file = os.path.join(self.dir, "scheduler.port")
        if os.path.exists(port_file):
            os.unlink(port_file)
        self._spawn("scheduler", [binary("scheduler_main"), f"--config={self.config}",
                                  f"--port_file={port_file}", "--http_port=-1",
                                  # The journal beside the logs: a cluster of
                                  # its own never resumes another's job.
                                  f"--state_dir={os.path.join(self.dir, 'scheduler-state')}",
                                  f"--log_level={self.log_level}"] + self._size_flags())
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if os.path.exists(port_file):
                text = open(port_file).read().strip()
                if text:
                    return f"127.0.0.1:{int(text)}"
            if self.procs["scheduler"].poll() is not None:
                break
            time.sleep(0.02)
        raise RuntimeError("the scheduler did not start: " + self.log("scheduler")[-2000:])

    def start_server(self) -> subprocess.Popen:
        """Starts one more server (a replacement takes a free rank)."""
        name = f"server{self._server_count}"
        self._server_count += 1
        return self._spawn(name, [binary("server_main"), f"--config={self.config}",
                                  f"--scheduler={self.scheduler}", "--http_port=-1",
                                  f"--log_level={self.log_level}"] + self._size_flags()
                           + self.extra_server_flags)

    def start_process(self, name: str, argv: List[str],
                      env: Optional[dict] = None) -> subprocess.Popen:
        """Starts another process of the job (a worker), logged like the rest."""
        return self._spawn(name, argv, env)

    def python_worker(self, name: str, script: str, args: Sequence[str] = (),
                      env: Optional[dict] = None) -> subprocess.Popen:
        """Starts `script` with this Python, PS_SCHEDULER set to this job."""
        e = dict(os.environ)
        e["PS_SCHEDULER"] = self.scheduler
        if self.num_servers_override:
            e["PS_NUM_SERVERS"] = str(self.num_servers_override)
        if self.num_workers_override:
            e["PS_NUM_WORKERS"] = str(self.num_workers_override)
        pkg = str(pathlib.Path(__file__).resolve().parent.parent)
        e["PYTHONPATH"] = pkg + os.pathsep + e.get("PYTHONPATH", "")
        if env:
            e.update(env)
        return self._spawn(name, [sys.executable, script, *args], e)

    def log(self, name: str) -> str:
        path = os.path.join(self.dir, name + ".log")
        return open(path, errors="replace").read() if os.path.exists(path) else ""

    def output(self, name: str) -> str:
        path = os.path.join(self.dir, name + ".out")
        return open(path, errors="replace").read() if os.path.exists(path) else ""

    def wait(self, name: str, timeout: float = 120) -> int:
        """Waits for process `name` to exit; returns its exit code
        (-signal when killed)."""
        return self.procs[name].wait(timeout=timeout)

    def wait_all(self, timeout: float = 120) -> Dict[str, int]:
        """Waits for every process (the servers exit when the job is over)."""
        deadline = time.monotonic() + timeout
        codes = {}
        for name, p in self.procs.items():
            codes[name] = p.wait(timeout=max(0.1, deadline - time.monotonic()))
        return codes

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        p = self.procs[name]
        if p.poll() is None:
            p.send_signal(sig)

    def close(self) -> None:
        """Kills whatever is still running."""
        for p in self.procs.values():
            if p.poll() is None:
                try:
                    p.kill()
                except ProcessLookupError:
                    pass
        for p in self.procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
