#!/usr/bin/python3
"""Builds the container image from this checkout and runs a whole job from it.

Steps (every failure names its step: "FAIL [step]: ..."):
  build     deploy/docker/build.sh: the debian:12 base image (made once with
            debootstrap), then `buildah bud --layers` of deploy/docker/Dockerfile
            with the checkout as context.
  contents  the image holds every binary of the README's list in
            /usr/local/bin, the example configs, the Python package with its
            native library, and runs as the Dockerfile's USER (uid 1000).
  runtime   the runtime stage holds only the base image's packages, those of
            runtime_packages.txt and their dependencies; no compiler, Bazel or
            JDK file; and its size above the base stays under RUNTIME_BOUND_MB
            (a toolchain leaking in adds 150 MB and more).
  job       the Kubernetes manifests (deploy/k8s) replayed with
            `buildah run --isolation chroot --user UID`: the scheduler, 2
            servers and 2 workers, each in a container of the image with the
            manifest's command, args and env, the ConfigMap's job config at
            /etc/ps/job.pbtxt, the job's keys (make_job_keys, as the Secret)
            at /etc/ps-keys. Host loopback stands in for the cluster network:
            the Services' names resolve to 127.0.0.1 (buildah from --add-host)
            and the fixed ports become free ones. Checks that every process
            exits 0 and the summary JSON's test AUC is within 0.01 of
            oracle_auc.
  python    the same job with the worker command the deploy README gives for
            Python workers (python3 /opt/ps/examples/python/lr_numpy.py).

Cost, measured on the 2-core machine shared with other builds (load 6), under
nice: a full rebuild from nothing takes about 10 min (the debian:12 base
image 1 min, the two stages' apt layers 2 min, the bazel build 6.7 min, 4
min when the machine is idle). Later runs reuse the base image, the apt
layers and Bazel's output base (the Dockerfile's cache mount): a source
change costs what an incremental bazel build of the image's binaries costs
(17 s for a change no binary depends on), an unchanged checkout 3 s. The C++
job then takes 10 s and the Python one 30 s.

Needs root and buildah + debootstrap (deploy/install_deps.sh --tests); it
installs them with apt-get when missing, and skips with the reason when not
root. Environment: PS_DOCKERFILE (a Dockerfile to build instead of
deploy/docker/Dockerfile: how the failure messages were checked),
PS_IMAGE_CONTEXT (the build context, default the checkout this test was
built from), PS_IMAGE_TEST_PYTHON=0 (leave out the python step).
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import yaml

TAG = "localhost/ps:image-test"
BASE_IMAGE = "docker.io/library/debian:12"
# The binaries the deploy README lists in /usr/local/bin.
BINARIES = ["scheduler_main", "server_main", "trainer", "psnode", "psctl",
            "kv_tool", "ckpt_tool", "predict", "make_data"]
# The runtime stage's bytes above the base image (packages, binaries, Python
# package, examples); measured 2026-11: 269 MB (43 packages, 8 MB of binaries).
# g++ with its compiler, binutils and headers alone adds about 170 MB.
RUNTIME_BOUND_MB = 340
# Files of a build toolchain that must not reach the runtime stage.
TOOLCHAIN = re.compile(r"^(g\+\+|c\+\+|gcc|cc1plus|cc1|ld\.bfd|ld\.gold|bazel|javac|protoc|"
                       r"grpc_cpp_plugin)(-[0-9.]+)?$")
JOB_TIMEOUT_S = 900
NAMESPACE = "default"
# The pods' metadata.uid suffix: new each run, as a new pod's uid is.
RUN_UID = f"{os.getpid()}-{int(time.time())}"


class Failure(Exception):
    def __init__(self, step, message):
        super().__init__(f"FAIL [{step}]: {message}")


def run(cmd, step, **kw):
    """Runs cmd; its stdout, or Failure naming step with the command's stderr."""
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        raise Failure(step, f"{' '.join(cmd)} exited {p.returncode}: {p.stderr.strip()[-2000:]}")
    return p.stdout


def runfile(path):
    return os.path.join(os.environ["TEST_SRCDIR"], os.environ["TEST_WORKSPACE"], path)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prerequisites():
    if os.environ.get("PS_SANITIZER") == "1":
        # The image is always built with --config=opt from the sources, not
        # from this configuration's binaries: the opt run of the suite covers it.
        print("SKIPPED: image_test builds the same --config=opt image in every configuration; "
              "it runs in the opt run")
        sys.exit(0)
    if os.geteuid() != 0:
        print(f"SKIPPED: image_test needs root (buildah's chroot isolation; running as uid {os.geteuid()})")
        sys.exit(0)
    os.environ["PATH"] += ":/usr/sbin:/sbin"
    missing = [c for c in ("buildah", "debootstrap") if shutil.which(c) is None]
    if missing:
        print(f"image_test: installing {' '.join(missing)} (apt-get)", flush=True)
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        run(["apt-get", "install", "-y", "-qq", "--no-install-recommends"] + missing,
            "prerequisites", env=env)


def build(dockerfile, context):
    start = time.time()
    env = dict(os.environ, PS_DOCKERFILE=dockerfile)
    p = subprocess.run(["bash", os.path.join(context, "deploy/docker/build.sh"), TAG],
                       cwd=context, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        # build.sh's own message names the Dockerfile's step that failed.
        lines = p.stderr.splitlines()
        at = max([i for i, l in enumerate(lines) if "build.sh: FAILED" in l] or [len(lines) - 10])
        raise Failure("build", "\n".join(lines[max(at, 0):]).strip())
    print(p.stderr[-3000:])
    print(f"image_test: build took {time.time() - start:.0f} s", flush=True)


class Mounted:
    """A working container of an image, mounted read-only for inspection."""

    def __init__(self, image, step):
        self.image, self.step = image, step

    def __enter__(self):
        self.ctr = run(["buildah", "from", "--pull-never", self.image], self.step).strip()
        self.root = run(["buildah", "mount", self.ctr], self.step).strip()
        return self

    def __exit__(self, *exc):
        subprocess.run(["buildah", "rm", self.ctr], capture_output=True)


def installed_packages(root):
    pkgs, name = set(), None
    with open(os.path.join(root, "var/lib/dpkg/status"), encoding="utf-8") as f:
        for line in f:
            if line.startswith("Package: "):
                name = line.split()[1]
            elif line.startswith("Status: ") and line.split()[1:] == ["install", "ok", "installed"]:
                pkgs.add(name)
    return pkgs


def du(root, paths):
    total = 0
    for p in paths:
        for d, _, files in os.walk(os.path.join(root, p)):
            for f in files:
                fp = os.path.join(d, f)
                if not os.path.islink(fp):
                    total += os.lstat(fp).st_size
    return total


def check_image(dockerfile):
    """Steps contents and runtime; returns the uid the image runs as."""
    with Mounted(TAG, "contents") as img:
        r = img.root
        for b in BINARIES:
            if not os.access(os.path.join(r, "usr/local/bin", b), os.X_OK):
                raise Failure("contents", f"/usr/local/bin/{b} is not in the image "
                              f"(the Dockerfile's PS_TARGETS or COPY --from=build /out/bin/)")
        for f in ["opt/ps/examples/ctr/async.pbtxt", "opt/ps/examples/python/lr_numpy.py",
                  "usr/lib/python3/dist-packages/ps/__init__.py",
                  "usr/lib/python3/dist-packages/ps/libps_native.so"]:
            if not os.path.exists(os.path.join(r, f)):
                raise Failure("contents", f"/{f} is not in the image")
        config = json.loads(run(["buildah", "inspect", "--type", "image", TAG], "contents"))
        user = config.get("Docker", {}).get("config", {}).get("User") or \
            config.get("OCIv1", {}).get("config", {}).get("User", "")
        want = [l.split(None, 1)[1].strip() for l in open(dockerfile) if l.startswith("USER ")]
        if not want or user != want[-1]:
            raise Failure("contents", f"the image runs as user {user!r}, the Dockerfile says {want}")
        uid = None
        for line in open(os.path.join(r, "etc/passwd")):
            f = line.split(":")
            if f[0] == user or f[2] == user:
                uid = int(f[2])
        if uid is None or uid == 0:
            raise Failure("contents", f"user {user!r} is not an unprivileged user of the image's /etc/passwd")

        # --- runtime
        pkgs = installed_packages(r)
        with Mounted(BASE_IMAGE, "runtime") as base:
            base_pkgs = installed_packages(base.root)
            base_bytes = du(base.root, ["usr", "etc", "var", "opt"])
        listed = []
        for line in open(runfile("deploy/docker/runtime_packages.txt")):
            listed += line.split("#")[0].split()
        closure = set(run(["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests",
                           "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances"] + listed,
                          "runtime").split("\n"))
        closure = {l.strip().split(":")[0] for l in closure if l and not l.startswith(" ")}
        extra = sorted(pkgs - base_pkgs - closure)
        if extra:
            raise Failure("runtime", f"packages in the runtime stage that neither debian:12 nor "
                          f"runtime_packages.txt (with dependencies) bring: {' '.join(extra)}")
        leaked = []
        for d, _, files in os.walk(r):
            leaked += [os.path.join(d, f)[len(r):] for f in files if TOOLCHAIN.match(f)]
        if leaked:
            raise Failure("runtime", f"build toolchain files in the runtime stage: {' '.join(leaked[:10])}")
        added = du(r, ["usr", "etc", "var", "opt"]) - base_bytes
        binaries = du(r, ["usr/local/bin"])
        print(f"image_test: runtime stage adds {added / 2**20:.0f} MB to debian:12 "
              f"({base_bytes / 2**20:.0f} MB): binaries {binaries / 2**20:.0f} MB, "
              f"{len(pkgs - base_pkgs)} packages; bound {RUNTIME_BOUND_MB} MB", flush=True)
        if added > RUNTIME_BOUND_MB * 2**20:
            raise Failure("runtime", f"the runtime stage adds {added / 2**20:.0f} MB to debian:12, "
                          f"over the bound of {RUNTIME_BOUND_MB} MB: a build toolchain or the build "
                          f"tree leaked in?")
    return uid


def manifests():
    """{'scheduler'|'server'|'worker': (pod spec's container, manifest)} and the job config."""
    k8s = os.path.dirname(runfile("deploy/k8s/kustomization.yaml"))
    kust = yaml.safe_load(open(os.path.join(k8s, "kustomization.yaml")))
    found, job_config = {}, None
    for name in kust["resources"]:
        for doc in yaml.safe_load_all(open(os.path.join(k8s, name))):
            if not doc:
                continue
            if doc["kind"] == "ConfigMap":
                job_config = doc["data"]["job.pbtxt"]
            elif doc["kind"] in ("Deployment", "StatefulSet", "Job"):
                c = doc["spec"]["template"]["spec"]["containers"][0]
                role = {"scheduler_main": "scheduler", "server_main": "server",
                        "trainer": "worker"}[c["command"][0]]
                found[role] = (c, doc)
    if set(found) != {"scheduler", "server", "worker"} or job_config is None:
        raise Failure("job", f"deploy/k8s lacks a role or the ConfigMap: {sorted(found)}")
    return found, job_config


class Job:
    """The processes of one job, each `buildah run` in its own container."""

    def __init__(self, uid, workdir, volumes, hosts):
        self.uid, self.workdir, self.volumes, self.hosts = uid, workdir, volumes, hosts
        self.procs, self.containers = [], []

    def start(self, name, command, env):
        ctr = run(["buildah", "from", "--pull-never", "--name", f"ps-image-test-{name}-{os.getpid()}"]
                  + [f"--add-host={h}:127.0.0.1" for h in self.hosts] + [TAG], "job").strip()
        self.containers.append(ctr)
        cmd = ["buildah", "run", "--isolation", "chroot", "--user", f"{self.uid}:{self.uid}"]
        for host, path, mode in self.volumes:
            cmd += ["--volume", f"{host}:{path}:{mode}"]
        for k, v in env.items():
            cmd += ["--env", f"{k}={v}"]
        cmd += [ctr, "--"] + command
        out = open(os.path.join(self.workdir, f"{name}.out"), "w")
        err = open(os.path.join(self.workdir, f"{name}.log"), "w")
        p = subprocess.Popen(cmd, stdout=out, stderr=err, start_new_session=True)
        self.procs.append((name, p))
        print(f"image_test: {name}: {' '.join(command)}", flush=True)
        return p

    def tail(self):
        text = ""
        for name, _ in self.procs:
            for ext in ("log", "out"):
                lines = open(os.path.join(self.workdir, f"{name}.{ext}")).read().splitlines()
                if lines:
                    text += f"\n---- last lines of {name}.{ext}\n" + "\n".join(lines[-12:])
        return text

    def stop(self):
        for _, p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for _, p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for c in self.containers:
            subprocess.run(["buildah", "rm", c], capture_output=True)


def expand(arg, env):
    """Kubernetes' $(VAR) expansion of args from the container's env."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), arg)


def pod_env(container, pod_name, index):
    env = {}
    for e in container.get("env", []):
        if "value" in e:
            # Kubernetes expands $(VAR) of variables defined before it.
            env[e["name"]] = expand(e["value"], env)
            continue
        path = e["valueFrom"]["fieldRef"]["fieldPath"]
        # metadata.uid: one per pod object, new for every run of the test.
        # status.podIP: every pod of this test runs on host loopback.
        values = {"metadata.name": pod_name, "metadata.namespace": NAMESPACE,
                  "status.podIP": "127.0.0.1",
                  "metadata.uid": f"{pod_name}-{RUN_UID}",
                  "metadata.annotations['batch.kubernetes.io/job-completion-index']": str(index)}
        if path not in values:
            raise Failure("job", f"{pod_name}: env {e['name']} from fieldRef {path}, which this test "
                          f"does not know")
        env[e["name"]] = values[path]
    return env


def localize(args, ports):
    """The manifest's args on host loopback: 0.0.0.0 -> 127.0.0.1, the
    containers' fixed ports -> the free ports of `ports` ({old: new})."""
    out = []
    for a in args:
        a = a.replace("0.0.0.0", "127.0.0.1")
        for old, new in ports.items():
            a = re.sub(rf"(?<![0-9]){old}(?![0-9])", str(new), a)
        out.append(a)
    return out


def wait_http(port, path, proc, step, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise Failure(step, f"exited {proc.returncode} at start")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise Failure(step, f"no answer on http://127.0.0.1:{port}{path} after {timeout} s")


def run_job(step, uid, worker_command=None):
    """One job from the manifests; worker_command replaces the worker
    container's command and args (the Python worker)."""
    roles, job_config = manifests()
    sched_c, _ = roles["scheduler"]
    server_c, server_doc = roles["server"]
    worker_c, worker_doc = roles["worker"]
    num_servers = server_doc["spec"]["replicas"]
    num_workers = worker_doc["spec"]["completions"]
    sched_service = "ps-scheduler"
    server_service = server_doc["spec"]["serviceName"]

    work = tempfile.mkdtemp(prefix=f"ps-image-test-{step}-", dir=os.environ.get("TEST_TMPDIR"))
    os.chmod(work, 0o755)
    cfg_dir, keys, state = (os.path.join(work, d) for d in ("config", "keys", "scheduler-state"))
    os.makedirs(cfg_dir)
    os.makedirs(state)
    os.chown(state, uid, uid)
    with open(os.path.join(cfg_dir, "job.pbtxt"), "w") as f:
        f.write(job_config)
    os.chmod(cfg_dir, 0o755)
    os.chmod(os.path.join(cfg_dir, "job.pbtxt"), 0o644)
    # The Secret ps-job-keys as the README makes it, mounted with
    # defaultMode 0440 and group fsGroup.
    run([runfile("deploy/security/make_job_keys"), keys, sched_service], step)
    os.chmod(keys, 0o750)
    os.chown(keys, 0, uid)
    for f in os.listdir(keys):
        os.chown(os.path.join(keys, f), 0, uid)
        os.chmod(os.path.join(keys, f), 0o440)
    mounts = {m["name"]: m["mountPath"] for m in sched_c.get("volumeMounts", [])}
    volumes = [(cfg_dir, "/etc/ps", "ro"), (keys, mounts.get("job-keys", "/etc/ps-keys"), "ro"),
               (state, mounts.get("scheduler-state", "/var/lib/ps-scheduler"), "rw")]
    server_pods = [f"{server_doc['metadata']['name']}-{i}" for i in range(num_servers)]
    hosts = [sched_service] + [f"{p}.{server_service}.{NAMESPACE}.svc" for p in server_pods]
    job = Job(uid, work, volumes, hosts)

    def port_map(container):
        return {p["containerPort"]: free_port() for p in container.get("ports", [])}

    try:
        sched_ports = port_map(sched_c)
        grpc_port = next(p["containerPort"] for p in sched_c["ports"] if p["name"] == "grpc")
        sched_http = next(sched_ports[p["containerPort"]] for p in sched_c["ports"] if p["name"] == "http")
        sched = job.start("scheduler", sched_c["command"] + localize(sched_c["args"], sched_ports),
                          pod_env(sched_c, "ps-scheduler", 0))
        wait_http(sched_http, "/healthz", sched, step)
        servers = []
        for i, pod in enumerate(server_pods):
            ports = {**port_map(server_c), grpc_port: sched_ports[grpc_port]}
            env = pod_env(server_c, pod, i)
            args = [expand(a, env) for a in localize(server_c["args"], ports)]
            servers.append(job.start(f"server{i}", server_c["command"] + args, env))
        workers = []
        for i in range(num_workers):
            ports = {**port_map(worker_c), grpc_port: sched_ports[grpc_port]}
            env = pod_env(worker_c, f"ps-worker-{i}", i)
            if worker_command:
                command = localize(worker_command, {grpc_port: sched_ports[grpc_port]})
            else:
                command = worker_c["command"] + localize(worker_c["args"], ports)
            workers.append(job.start(f"worker{i}", [expand(a, env) for a in command], env))

        deadline = time.time() + JOB_TIMEOUT_S
        for name, p in job.procs:
            try:
                rc = p.wait(timeout=max(1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                raise Failure(step, f"{name} still running after {JOB_TIMEOUT_S} s" + job.tail())
            if rc != 0:
                raise Failure(step, f"{name} exited {rc}" + job.tail())

        summaries = []
        for name, _ in job.procs:
            if not name.startswith("worker"):
                continue
            for line in open(os.path.join(work, f"{name}.out")):
                if line.startswith("{") and "test_auc" in line:
                    summaries.append(json.loads(line))
        if len(summaries) != 1:
            raise Failure(step, f"{len(summaries)} summary JSON lines in the workers' output, want 1"
                          + job.tail())
        s = summaries[0]
        print(f"image_test: {step}: {json.dumps(s)}", flush=True)
        if not abs(s["test_auc"] - s["oracle_auc"]) <= 0.01:
            raise Failure(step, f"test AUC {s['test_auc']} is not within 0.01 of the oracle's "
                          f"{s['oracle_auc']}")
    finally:
        job.stop()
        shutil.rmtree(work, ignore_errors=True)


def main():
    prerequisites()
    src = os.path.realpath(runfile("deploy/docker/Dockerfile"))
    context = os.environ.get("PS_IMAGE_CONTEXT") or os.path.dirname(os.path.dirname(os.path.dirname(src)))
    dockerfile = os.environ.get("PS_DOCKERFILE") or os.path.join(context, "deploy/docker/Dockerfile")
    print(f"image_test: context {context}, Dockerfile {dockerfile}", flush=True)
    try:
        build(dockerfile, context)
        uid = check_image(dockerfile)
        start = time.time()
        run_job("job", uid)
        print(f"image_test: job took {time.time() - start:.0f} s", flush=True)
        if os.environ.get("PS_IMAGE_TEST_PYTHON", "1") != "0":
            start = time.time()
            run_job("python", uid, ["python3", "/opt/ps/examples/python/lr_numpy.py",
                                    "--config=/etc/ps/job.pbtxt", "--scheduler=ps-scheduler:7070"])
            print(f"image_test: python job took {time.time() - start:.0f} s", flush=True)
    except Failure as e:
        print(e, flush=True)
        sys.exit(1)
    print("PASS", flush=True)


if __name__ == "__main__":
    main()
