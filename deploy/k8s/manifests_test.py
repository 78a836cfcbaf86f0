#!/usr/bin/python3
"""Checks the Kubernetes manifests in deploy/k8s against the real binaries.

Parses every manifest the kustomization lists and checks: the kinds and the
fields the deployment relies on (indexed worker Job, server StatefulSet with
its headless Service, scheduler Deployment and Service, probes, preStop and
grace periods); that every container runs a binary of the image directly
(PID 1, so it receives SIGTERM) with only flags that binary accepts, taken
from its `--helpfull`; that the ports in flags, containers, probes and
Services agree; that --config points into the ConfigMap's mount; and that
the ConfigMap's job config is valid (`scheduler_main --describe`) and sized
like the StatefulSet and the Job; and that every pod mounts the Secret of
the keys its security block names, not readable by other users.

Usage (bazel test //deploy/k8s:manifests_test runs it):
  manifests_test.py KUSTOMIZATION_YAML SCHEDULER_MAIN SERVER_MAIN TRAINER MAKE_JOB_KEYS
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

import yaml

K8S_DIR = ""
MAKE_JOB_KEYS = ""  # deploy/security/make_job_keys
KEYS_MOUNT = "/etc/ps-keys"  # where the Secret ps-job-keys is mounted
BINARIES = {}  # container command name -> path of the built binary


def load_manifests():
    with open(os.path.join(K8S_DIR, "kustomization.yaml")) as f:
        kustomization = yaml.safe_load(f)
    docs = []
    for name in kustomization["resources"]:
        with open(os.path.join(K8S_DIR, name)) as f:
            docs.extend(d for d in yaml.safe_load_all(f) if d is not None)
    return kustomization, docs


def parse_flags(args):
    """['--a=1', '--b'] -> {'a': '1', 'b': None}; other words -> error."""
    flags = {}
    for arg in args:
        m = re.fullmatch(r"--([A-Za-z0-9_]+)(?:=(.*))?", arg, re.S)
        if not m:
            raise AssertionError("not a --flag[=value] argument: %r" % arg)
        flags[m.group(1)] = m.group(2)
    return flags


_helpfull_cache = {}


def accepted_flags(binary):
    """The flag names binary's --helpfull lists (absl: '    --name (...')."""
    if binary not in _helpfull_cache:
        out = subprocess.run([BINARIES[binary], "--helpfull"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, timeout=30).stdout
        names = set(re.findall(r"^\s+--([A-Za-z0-9_]+) \(", out, re.M))
        if not names:
            raise AssertionError("%s --helpfull listed no flags:\n%s" % (binary, out))
        _helpfull_cache[binary] = names
    return _helpfull_cache[binary]


def pod_templates(docs):
    """(workload kind, name, pod template) for every workload."""
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet", "Job"):
            yield d["kind"], d["metadata"]["name"], d["spec"]["template"]


def containers(docs):
    for kind, name, template in pod_templates(docs):
        for c in template["spec"]["containers"]:
            yield kind, name, template, c


def container_port(container, port):
    """A probe's or targetPort's port (number or name) as a number."""
    if isinstance(port, int):
        return port
    for p in container.get("ports", []):
        if p.get("name") == port:
            return p["containerPort"]
    raise AssertionError("container %s has no port named %r" % (container["name"], port))


def labels_match(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())


class ManifestsTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.kustomization, cls.docs = load_manifests()

    def get(self, kind, name):
        found = [d for d in self.docs
                 if d["kind"] == kind and d["metadata"]["name"] == name]
        self.assertEqual(len(found), 1, "want exactly one %s %s" % (kind, name))
        return found[0]

    def container_of(self, kind, name):
        spec = self.get(kind, name)["spec"]["template"]["spec"]
        self.assertEqual(len(spec["containers"]), 1, "%s %s" % (kind, name))
        return spec["containers"][0]

    def flags_of(self, kind, name):
        return parse_flags(self.container_of(kind, name).get("args", []))

    def job_description(self):
        """servers, workers, mode of the ConfigMap's job, by scheduler_main.

        The key files the config names are made by make_job_keys.sh in a
        temporary directory standing in for the Secret's mount, so their
        names must be the script's."""
        data = self.get("ConfigMap", "ps-job")["data"]
        with tempfile.TemporaryDirectory() as keys, \
             tempfile.NamedTemporaryFile("w", suffix=".pbtxt") as f:
            subprocess.run([MAKE_JOB_KEYS, keys + "/k"], check=True,
                           stdout=subprocess.DEVNULL, timeout=60)
            f.write(data["job.pbtxt"].replace(KEYS_MOUNT + "/", keys + "/k/"))
            f.flush()
            r = subprocess.run([BINARIES["scheduler_main"], "--config=" + f.name,
                                "--describe"], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, "invalid job config:\n" + r.stdout)
        return dict(kv.split("=", 1) for kv in r.stdout.split())

    def test_every_manifest_is_in_the_kustomization(self):
        listed = set(self.kustomization["resources"])
        present = {f for f in os.listdir(K8S_DIR)
                   if f.endswith(".yaml") and f != "kustomization.yaml"}
        self.assertEqual(listed, present)

    def test_kinds(self):
        self.assertEqual(self.get("Deployment", "ps-scheduler")["spec"]["replicas"], 1)
        self.assertEqual(self.get("Deployment", "ps-scheduler")["spec"]["strategy"]["type"],
                         "Recreate", "two schedulers must never run at once")
        self.get("Service", "ps-scheduler")
        sts = self.get("StatefulSet", "ps-server")
        self.assertEqual(sts["spec"]["podManagementPolicy"], "Parallel")
        headless = self.get("Service", sts["spec"]["serviceName"])
        self.assertEqual(headless["spec"]["clusterIP"], "None")
        self.assertTrue(headless["spec"].get("publishNotReadyAddresses"))
        job = self.get("Job", "ps-worker")
        self.assertEqual(job["spec"]["completionMode"], "Indexed")
        self.assertIn(job["spec"]["template"]["spec"]["restartPolicy"], ("Never", "OnFailure"))
        self.assertIn("job.pbtxt", self.get("ConfigMap", "ps-job")["data"])

    def test_job_config_is_valid_and_sizes_the_workloads(self):
        job = self.job_description()
        self.assertEqual(self.get("StatefulSet", "ps-server")["spec"]["replicas"],
                         int(job["servers"]))
        spec = self.get("Job", "ps-worker")["spec"]
        self.assertEqual(spec["completions"], int(job["workers"]))
        self.assertEqual(spec["parallelism"], int(job["workers"]))

    def test_commands_are_binaries_with_flags_they_accept(self):
        for kind, name, _, c in containers(self.docs):
            with self.subTest(workload=name):
                command = c["command"]
                # Exactly the binary: a shell in between would get the
                # SIGTERM instead of it.
                self.assertEqual(len(command), 1, command)
                self.assertIn(command[0], BINARIES)
                unknown = set(parse_flags(c.get("args", []))) - accepted_flags(command[0])
                self.assertFalse(unknown, "%s does not accept --%s" %
                                 (command[0], ", --".join(sorted(unknown))))

    def test_env_references_are_defined(self):
        # Kubernetes leaves an undefined $(VAR) in args as it is.
        for kind, name, _, c in containers(self.docs):
            env = {e["name"]: e for e in c.get("env", [])}
            for arg in c.get("args", []):
                for var in re.findall(r"\$\(([A-Za-z0-9_]+)\)", arg):
                    self.assertIn(var, env, "%s: %s" % (name, arg))

    def test_probes_and_metrics_on_the_http_port(self):
        for kind, name, template, c in containers(self.docs):
            with self.subTest(workload=name):
                flags = parse_flags(c["args"])
                self.assertEqual(flags.get("http_host"), "0.0.0.0",
                                 "the kubelet probes the pod IP, not loopback")
                port = int(flags["http_port"])
                self.assertGreater(port, 0)
                self.assertEqual(container_port(c, "http"), port)
                for probe, path in (("livenessProbe", "/healthz"),
                                    ("readinessProbe", "/readyz")):
                    get = c[probe]["httpGet"]
                    self.assertEqual(get["path"], path)
                    self.assertEqual(container_port(c, get["port"]), port)
                annotations = template["metadata"].get("annotations", {})
                self.assertEqual(annotations.get("prometheus.io/port"), str(port))
                self.assertEqual(annotations.get("prometheus.io/path"), "/metrics")

    def test_services_select_their_pods_and_reach_their_ports(self):
        # Service -> (workload kind, name, {service port name: flag giving the port}).
        expected = {
            "ps-scheduler": ("Deployment", "ps-scheduler", {"grpc": "port", "http": "http_port"}),
            "ps-server": ("StatefulSet", "ps-server", {"data": "bind", "http": "http_port"}),
        }
        for service, (kind, name, port_flags) in expected.items():
            with self.subTest(service=service):
                svc = self.get("Service", service)
                workload = self.get(kind, name)
                labels = workload["spec"]["template"]["metadata"]["labels"]
                self.assertTrue(labels_match(svc["spec"]["selector"], labels))
                self.assertTrue(labels_match(workload["spec"]["selector"]["matchLabels"], labels))
                c = self.container_of(kind, name)
                flags = parse_flags(c["args"])
                ports = {p["name"]: p for p in svc["spec"]["ports"]}
                self.assertEqual(set(ports), set(port_flags))
                for port_name, flag in port_flags.items():
                    value = flags[flag]
                    if flag == "bind":
                        m = re.fullmatch(r"tcp://0\.0\.0\.0:(\d+)", value)
                        self.assertTrue(m, "--bind=%s: want tcp://0.0.0.0:PORT" % value)
                        value = m.group(1)
                    target = ports[port_name].get("targetPort", ports[port_name]["port"])
                    self.assertEqual(container_port(c, target), int(value), port_name)

    def test_everyone_reaches_the_scheduler_through_its_service(self):
        flags = self.flags_of("Deployment", "ps-scheduler")
        self.assertEqual(flags["host"], "0.0.0.0")
        svc = self.get("Service", "ps-scheduler")
        c = self.container_of("Deployment", "ps-scheduler")
        grpc = [p for p in svc["spec"]["ports"]
                if container_port(c, p.get("targetPort", p["port"])) == int(flags["port"])]
        self.assertEqual(len(grpc), 1, "no Service port reaches --port")
        want = "ps-scheduler:%d" % grpc[0]["port"]
        for kind, name in (("StatefulSet", "ps-server"), ("Job", "ps-worker")):
            self.assertEqual(self.flags_of(kind, name)["scheduler"], want, name)

    def test_servers_advertise_their_stable_dns_name(self):
        sts = self.get("StatefulSet", "ps-server")
        c = self.container_of("StatefulSet", "ps-server")
        host = parse_flags(c["args"])["advertise_host"]
        labels = host.split(".")
        self.assertEqual(labels[0], "$(POD_NAME)")
        self.assertEqual(labels[1], sts["spec"]["serviceName"])
        env = {e["name"]: e for e in c["env"]}
        self.assertEqual(env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"], "metadata.name")
        if "$(POD_NAMESPACE)" in host:
            self.assertEqual(labels[2], "$(POD_NAMESPACE)")
            self.assertEqual(env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"],
                             "metadata.namespace")

    def test_the_scheduler_takes_its_launch_id_from_the_pod(self):
        # A new pod (a new job of the same config) never resumes the journal
        # of another; a restarted container of the same pod does.
        c = self.container_of("Deployment", "ps-scheduler")
        self.assertEqual(parse_flags(c["args"])["launch_id"], "$(PS_LAUNCH_ID)")
        env = {e["name"]: e for e in c["env"]}
        self.assertEqual(env["PS_LAUNCH_ID"]["valueFrom"]["fieldRef"]["fieldPath"],
                         "metadata.uid")

    def test_config_flag_points_into_the_configmap_mount(self):
        data = self.get("ConfigMap", "ps-job")["data"]
        for kind, name, template, c in containers(self.docs):
            with self.subTest(workload=name):
                path = parse_flags(c["args"])["config"]
                volumes = {v["name"]: v for v in template["spec"]["volumes"]}
                mounts = [m for m in c["volumeMounts"]
                          if volumes[m["name"]].get("configMap", {}).get("name") == "ps-job"]
                self.assertEqual(len(mounts), 1)
                self.assertEqual(os.path.dirname(path), mounts[0]["mountPath"].rstrip("/"))
                self.assertIn(os.path.basename(path), data)

    def test_every_pod_mounts_the_keys_the_config_names(self):
        config = self.get("ConfigMap", "ps-job")["data"]["job.pbtxt"]
        paths = re.findall(r'_file: "([^"]+)"', config)
        self.assertEqual(len(paths), 5, "tls (3 files) and curve (2) expected")
        for path in paths:
            self.assertEqual(os.path.dirname(path), KEYS_MOUNT)
        for kind, name, template, c in containers(self.docs):
            with self.subTest(workload=name):
                volumes = {v["name"]: v for v in template["spec"]["volumes"]}
                mounts = [m for m in c["volumeMounts"]
                          if volumes[m["name"]].get("secret", {}).get("secretName")
                          == "ps-job-keys"]
                self.assertEqual(len(mounts), 1)
                self.assertEqual(mounts[0]["mountPath"], KEYS_MOUNT)
                self.assertTrue(mounts[0]["readOnly"])
                mode = volumes[mounts[0]["name"]]["secret"]["defaultMode"]
                # The processes refuse keys readable by every user; the pod's
                # group reads them.
                self.assertEqual(mode & 0o007, 0, oct(mode))
                self.assertEqual(mode & 0o040, 0o040, oct(mode))
                ctx = template["spec"]["securityContext"]
                self.assertEqual(ctx["fsGroup"], ctx["runAsGroup"])

    def test_graceful_termination(self):
        for kind, name, template, c in containers(self.docs):
            with self.subTest(workload=name):
                grace = template["spec"]["terminationGracePeriodSeconds"]
                command = c["lifecycle"]["preStop"]["exec"]["command"]
                self.assertEqual(command[0], "sleep")
                # The grace period covers the preStop hook and then the
                # binary's own shutdown after the SIGTERM.
                self.assertGreaterEqual(grace, float(command[1]) + 20)
        # A preempted server may checkpoint for up to 60 s before leaving.
        spec = self.get("StatefulSet", "ps-server")["spec"]["template"]["spec"]
        self.assertGreater(spec["terminationGracePeriodSeconds"], 60)

    def test_one_image_set_by_the_kustomization(self):
        names = {i["name"] for i in self.kustomization.get("images", [])}
        for kind, name, _, c in containers(self.docs):
            self.assertIn(c["image"].split(":")[0], names, name)

    @unittest.skipUnless(shutil.which("kubectl"), "kubectl is not installed")
    def test_kustomize_renders_every_object(self):
        # Copies, not the runfiles' symlinks: kustomize loads no file from
        # outside the kustomization's directory.
        with tempfile.TemporaryDirectory() as tmp:
            for name in os.listdir(K8S_DIR):
                if name.endswith(".yaml"):
                    shutil.copy(os.path.join(K8S_DIR, name), tmp)
            r = subprocess.run(["kubectl", "kustomize", tmp], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        rendered = [d for d in yaml.safe_load_all(r.stdout) if d is not None]
        key = lambda d: (d["kind"], d["metadata"]["name"])
        self.assertEqual(sorted(map(key, rendered)), sorted(map(key, self.docs)))
        for d in rendered:
            self.assertEqual(d["metadata"]["labels"]["app.kubernetes.io/part-of"], "ps")


if __name__ == "__main__":
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    K8S_DIR = os.path.dirname(os.path.abspath(sys.argv[1]))
    BINARIES.update(scheduler_main=sys.argv[2], server_main=sys.argv[3], trainer=sys.argv[4])
    MAKE_JOB_KEYS = os.path.abspath(sys.argv[5])
    unittest.main(argv=sys.argv[:1], verbosity=2)
