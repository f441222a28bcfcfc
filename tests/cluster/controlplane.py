"""A local Kubernetes 1.20 cluster from binaries, for Rota's real-cluster tests.

    python3 tests/cluster/controlplane.py up      start it; the last line printed is
                                                  `export KUBECONFIG=<path>`
    python3 tests/cluster/controlplane.py down    stop it and remove its state
    python3 tests/cluster/controlplane.py env     print the export line of a running one
    python3 tests/cluster/controlplane.py load-images
                                                  import the images of tests/cluster/images.sh

One node on this machine, as root: etcd, kube-apiserver (RBAC and Node
authorization, a static token per identity), kube-controller-manager,
kube-scheduler, containerd with runc and Debian's CNI plugins (one bridge), a
kubelet and kube-proxy (iptables). The Kubernetes binaries come from
tests/cluster/build-kubernetes.sh (cached in ROTA_CACHE, default ~/.cache/rota);
the state lives in ROTA_CLUSTER_DIR (default /var/tmp/rota-cluster) and goes
with `down`. Only the standard library is used, so any python3 runs it.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
K8S_DEB_VERSION = os.environ.get("K8S_DEB_VERSION", "1.20.5+really1.20.2-1.1+deb12u1")
CACHE = Path(os.environ.get("ROTA_CACHE", Path.home() / ".cache" / "rota"))
BIN = CACHE / f"kubernetes-{K8S_DEB_VERSION}" / "bin"
STATE = Path(os.environ.get("ROTA_CLUSTER_DIR", "/var/tmp/rota-cluster"))
PKI = STATE / "pki"
LOGS = STATE / "logs"
PIDS = STATE / "pids"
CONTAINERD_SOCK = STATE / "containerd" / "containerd.sock"
ADMIN_KUBECONFIG = STATE / "admin.kubeconfig"

NODE = "rota-node"
ETCD_PORT = int(os.environ.get("ROTA_ETCD_PORT", "12379"))
API_PORT = int(os.environ.get("ROTA_API_PORT", "16443"))
SERVICE_CIDR = "10.0.0.0/24"
POD_SUBNET = "10.244.0.0/24"
POD_GATEWAY = "10.244.0.1"
BRIDGE = "rota0"
PAUSE_IMAGE = "localhost/rota-pause:1"

# Start order; `down` stops them the other way round.
COMPONENTS = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "cluster-dns",
    "containerd",
    "kubelet",
    "kube-proxy",
]


def log(message: str) -> None:
    print(f"==> {message}", file=sys.stderr, flush=True)


class ClusterError(RuntimeError):
    pass


def run(*args: str | Path, check: bool = True, quiet: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(a) for a in args],
        check=check,
        stdout=subprocess.DEVNULL if quiet else None,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(what: str, test: Callable[[], bool], timeout: float, component: str = "") -> None:
    deadline = time.monotonic() + timeout
    while True:
        if component and not alive(component):
            raise ClusterError(f"{component} exited while waiting for {what}:\n{tail(component)}")
        try:
            if test():
                return
        except (OSError, subprocess.SubprocessError, ValueError):
            pass
        if time.monotonic() >= deadline:
            hint = f"\n{tail(component)}" if component else ""
            raise ClusterError(f"{what}: not within {timeout:.0f}s{hint}")
        time.sleep(0.5)


def tail(component: str, lines: int = 25) -> str:
    path = LOGS / f"{component}.log"
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


# -- processes ---------------------------------------------------------------


def pid_of(component: str) -> int | None:
    path = PIDS / f"{component}.pid"
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


def alive(component: str) -> bool:
    pid = pid_of(component)
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie of ours or a reused pid does not count.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def start(component: str, args: list[str | Path], env: dict[str, str] | None = None) -> None:
    LOGS.mkdir(parents=True, exist_ok=True)
    PIDS.mkdir(parents=True, exist_ok=True)
    with open(LOGS / f"{component}.log", "ab") as out:
        process = subprocess.Popen(
            [str(a) for a in args],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
    (PIDS / f"{component}.pid").write_text(str(process.pid))


def stop(component: str, timeout: float = 20) -> None:
    pid = pid_of(component)
    if pid is None:
        return
    if alive(component):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while alive(component) and time.monotonic() < deadline:
            time.sleep(0.2)
        if alive(component):
            os.kill(pid, signal.SIGKILL)
    (PIDS / f"{component}.pid").unlink(missing_ok=True)


# -- certificates, tokens, kubeconfigs ---------------------------------------


def host_ip() -> str:
    """The address other hosts (and the pods, through the bridge) reach this one at."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("8.8.8.8", 53))  # UDP: no packet is sent, the kernel only picks a route
        return str(s.getsockname()[0])


def openssl(*args: str | Path) -> None:
    run("openssl", *args)


def make_pki(ip: str) -> None:
    PKI.mkdir(parents=True, exist_ok=True)
    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "30",
        "-subj",
        "/CN=rota-cluster-ca",
        "-keyout",
        PKI / "ca.key",
        "-out",
        PKI / "ca.crt",
    )
    sans = ",".join(
        [
            "DNS:kubernetes",
            "DNS:kubernetes.default",
            "DNS:kubernetes.default.svc",
            "DNS:kubernetes.default.svc.cluster.local",
            "DNS:localhost",
            "IP:127.0.0.1",
            "IP:10.0.0.1",
            f"IP:{ip}",
        ]
    )
    signed("apiserver", "/CN=kube-apiserver", sans)
    # The API server's client certificate towards the kubelet (logs, exec).
    signed("apiserver-kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client")
    signed("kubelet", f"/CN={NODE}", f"DNS:{NODE},IP:{ip},IP:127.0.0.1")
    openssl("genrsa", "-out", PKI / "sa.key", "2048")
    openssl("rsa", "-in", PKI / "sa.key", "-pubout", "-out", PKI / "sa.pub")


def signed(name: str, subject: str, sans: str | None = None) -> None:
    key, csr, crt = (PKI / f"{name}.{ext}" for ext in ("key", "csr", "crt"))
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", subject, "-keyout", key, "-out", csr)
    ext = PKI / f"{name}.ext"
    lines = ["basicConstraints=CA:FALSE", "keyUsage=digitalSignature,keyEncipherment"]
    lines.append("extendedKeyUsage=serverAuth,clientAuth")
    if sans:
        lines.append(f"subjectAltName={sans}")
    ext.write_text("\n".join(lines) + "\n")
    openssl(
        "x509",
        "-req",
        "-in",
        csr,
        "-CA",
        PKI / "ca.crt",
        "-CAkey",
        PKI / "ca.key",
        "-CAcreateserial",
        "-days",
        "30",
        "-extfile",
        ext,
        "-out",
        crt,
    )
    csr.unlink()
    ext.unlink()


# One token per identity; the built-in RBAC bindings give each what it needs.
IDENTITIES = {
    "admin": ("admin", "system:masters"),
    "controller-manager": ("system:kube-controller-manager", ""),
    "scheduler": ("system:kube-scheduler", ""),
    "kubelet": (f"system:node:{NODE}", "system:nodes"),
    "kube-proxy": ("system:kube-proxy", ""),
}


def make_tokens() -> dict[str, str]:
    tokens = {name: secrets.token_hex(16) for name in IDENTITIES}
    lines = []
    for name, (user, groups) in IDENTITIES.items():
        lines.append(
            f'{tokens[name]},{user},{user},"{groups}"'
            if groups
            else f"{tokens[name]},{user},{user}"
        )
    path = PKI / "tokens.csv"
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o600)
    return tokens


def kubeconfig(name: str, token: str, server: str) -> Path:
    ca = base64.b64encode((PKI / "ca.crt").read_bytes()).decode()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "rota", "cluster": {"server": server, "certificate-authority-data": ca}}
        ],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": "rota", "context": {"cluster": "rota", "user": name}}],
        "current-context": "rota",
    }
    path = STATE / f"{name}.kubeconfig"
    path.write_text(json.dumps(config, indent=2) + "\n")
    path.chmod(0o600)
    return path


# -- the API ------------------------------------------------------------------


def api_get(path: str, token: str) -> dict:
    context = ssl.create_default_context(cafile=str(PKI / "ca.crt"))
    request = urllib.request.Request(
        f"https://127.0.0.1:{API_PORT}{path}", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, context=context, timeout=5) as response:
        body = response.read()
    try:
        return dict(json.loads(body))
    except ValueError:
        return {"body": body.decode()}


def admin_token() -> str:
    config = json.loads(ADMIN_KUBECONFIG.read_text())
    return str(config["users"][0]["user"]["token"])


def node_ready(token: str) -> bool:
    node = api_get(f"/api/v1/nodes/{NODE}", token)
    conditions = node.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


# -- bring up -------------------------------------------------------------------


def preflight() -> None:
    if os.geteuid() != 0:
        raise ClusterError("the local cluster runs as root (containerd, kubelet, iptables)")
    missing = [
        name
        for name in (
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kubelet",
            "kube-proxy",
        )
        if not (BIN / name).exists()
    ]
    if missing:
        raise ClusterError(
            f"{', '.join(missing)} not built in {BIN}: run tests/cluster/build-kubernetes.sh"
        )
    needed = (
        "etcd",
        "containerd",
        "containerd-shim-runc-v2",
        "runc",
        "ctr",
        "iptables",
        "conntrack",
        "openssl",
        "ip",
        "dnsmasq",
    )
    absent = [name for name in needed if shutil.which(name) is None]
    if absent:
        raise ClusterError(f"missing commands: {' '.join(absent)} (see tests/cluster/deps.sh)")


def up() -> None:
    preflight()
    if alive("kube-apiserver"):
        log("the cluster is already running")
        print(f"export KUBECONFIG={ADMIN_KUBECONFIG}")
        return
    down(quiet=True)
    started = time.monotonic()
    for sub in ("etcd", "kubelet", "cni/net.d", "containerd"):
        (STATE / sub).mkdir(parents=True, exist_ok=True)
    ip = host_ip()
    make_pki(ip)
    tokens = make_tokens()
    server = f"https://127.0.0.1:{API_PORT}"
    configs = {name: kubeconfig(name, token, server) for name, token in tokens.items()}

    log("etcd")
    start(
        "etcd",
        [
            "etcd",
            "--name",
            "rota",
            "--data-dir",
            STATE / "etcd",
            "--listen-client-urls",
            f"http://127.0.0.1:{ETCD_PORT}",
            "--advertise-client-urls",
            f"http://127.0.0.1:{ETCD_PORT}",
            "--listen-peer-urls",
            f"http://127.0.0.1:{ETCD_PORT + 1}",
            "--initial-advertise-peer-urls",
            f"http://127.0.0.1:{ETCD_PORT + 1}",
            "--initial-cluster",
            f"rota=http://127.0.0.1:{ETCD_PORT + 1}",
            "--unsafe-no-fsync",
            "--log-level",
            "warn",
        ],
    )

    log("kube-apiserver")
    start(
        "kube-apiserver",
        [
            BIN / "kube-apiserver",
            f"--etcd-servers=http://127.0.0.1:{ETCD_PORT}",
            "--bind-address=0.0.0.0",
            f"--secure-port={API_PORT}",
            "--insecure-port=0",
            f"--advertise-address={ip}",
            f"--tls-cert-file={PKI / 'apiserver.crt'}",
            f"--tls-private-key-file={PKI / 'apiserver.key'}",
            f"--client-ca-file={PKI / 'ca.crt'}",
            f"--token-auth-file={PKI / 'tokens.csv'}",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            f"--service-account-key-file={PKI / 'sa.pub'}",
            f"--service-account-signing-key-file={PKI / 'sa.key'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--kubelet-client-certificate={PKI / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={PKI / 'apiserver-kubelet-client.key'}",
            "--kubelet-preferred-address-types=InternalIP",
            "--allow-privileged=true",
            "--profiling=false",
            "--v=1",
        ],
    )
    wait_for(
        "kube-apiserver ready",
        lambda: api_get("/readyz", tokens["admin"]).get("body", "").strip() == "ok",
        120,
        "kube-apiserver",
    )

    log("kube-controller-manager and kube-scheduler")
    start(
        "kube-controller-manager",
        [
            BIN / "kube-controller-manager",
            f"--kubeconfig={configs['controller-manager']}",
            f"--authentication-kubeconfig={configs['controller-manager']}",
            f"--authorization-kubeconfig={configs['controller-manager']}",
            f"--service-account-private-key-file={PKI / 'sa.key'}",
            f"--root-ca-file={PKI / 'ca.crt'}",
            "--use-service-account-credentials=true",
            "--leader-elect=false",
            "--port=0",
            "--bind-address=127.0.0.1",
            "--controllers=*,-nodeipam,-cloud-node-lifecycle,-bootstrapsigner,-tokencleaner",
            "--v=1",
        ],
    )
    start(
        "kube-scheduler",
        [
            BIN / "kube-scheduler",
            f"--kubeconfig={configs['scheduler']}",
            f"--authentication-kubeconfig={configs['scheduler']}",
            f"--authorization-kubeconfig={configs['scheduler']}",
            "--leader-elect=false",
            "--port=0",
            "--bind-address=127.0.0.1",
            "--v=1",
        ],
    )

    log("cluster DNS and containerd")
    network()
    cluster_dns()
    start("containerd", ["containerd", "--config", containerd_config()])
    wait_for("containerd socket", CONTAINERD_SOCK.exists, 30, "containerd")
    wait_for(
        "containerd answering",
        lambda: run("ctr", "--address", CONTAINERD_SOCK, "version", check=False).returncode == 0,
        30,
        "containerd",
    )
    pause_image()

    log("kubelet and kube-proxy")
    start(
        "kubelet",
        [
            BIN / "kubelet",
            f"--config={kubelet_config()}",
            f"--kubeconfig={configs['kubelet']}",
            "--container-runtime=remote",
            f"--container-runtime-endpoint=unix://{CONTAINERD_SOCK}",
            f"--root-dir={STATE / 'kubelet'}",
            f"--hostname-override={NODE}",
            f"--node-ip={ip}",
            "--oom-score-adj=0",
            "--v=1",
        ],
    )
    start(
        "kube-proxy",
        [
            BIN / "kube-proxy",
            f"--kubeconfig={configs['kube-proxy']}",
            "--proxy-mode=iptables",
            "--cluster-cidr=10.244.0.0/16",
            f"--hostname-override={NODE}",
            "--conntrack-max-per-core=0",
            "--metrics-bind-address=127.0.0.1:10249",
            "--healthz-bind-address=127.0.0.1:10256",
            "--v=1",
        ],
    )
    wait_for("node Ready", lambda: node_ready(tokens["admin"]), 120, "kubelet")
    # Pods start only once the namespace's default ServiceAccount exists.
    wait_for(
        "default ServiceAccount",
        lambda: (
            api_get("/api/v1/namespaces/default/serviceaccounts/default", tokens["admin"]).get(
                "kind"
            )
            == "ServiceAccount"
        ),
        60,
        "kube-controller-manager",
    )
    log(f"cluster up in {time.monotonic() - started:.1f}s (state in {STATE})")
    print(f"export KUBECONFIG={ADMIN_KUBECONFIG}", flush=True)


def network() -> None:
    Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n")
    # The bridge exists before the first pod, so the cluster DNS can listen on it;
    # the CNI bridge plugin then takes it as it is.
    run("ip", "link", "add", BRIDGE, "type", "bridge", check=False)
    run("ip", "addr", "replace", f"{POD_GATEWAY}/24", "dev", BRIDGE)
    run("ip", "link", "set", BRIDGE, "up")
    conf = {
        "cniVersion": "0.4.0",
        "name": "rota",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": True,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_SUBNET, "gateway": POD_GATEWAY}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(STATE / "cni" / "ipam"),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }
    (STATE / "cni" / "net.d" / "10-rota.conflist").write_text(json.dumps(conf, indent=2))


def cluster_dns() -> None:
    """The cluster's DNS, reduced to what Rota's pods ask: the API server's Service.

    kopf logs in as https://kubernetes.default.svc, so pods need that name; dnsmasq
    answers it, says no to every other cluster.local name and forwards the rest to
    this machine's resolvers.
    """
    start(
        "cluster-dns",
        [
            "dnsmasq",
            "--keep-in-foreground",
            "--log-facility=-",
            "--no-hosts",
            "--pid-file=",
            f"--listen-address={POD_GATEWAY}",
            "--bind-interfaces",
            "--resolv-file=/etc/resolv.conf",
            "--local=/cluster.local/",
            "--address=/kubernetes.default.svc.cluster.local/10.0.0.1",
            "--address=/kubernetes.default.svc/10.0.0.1",
        ],
    )
    wait_for("cluster DNS", lambda: alive("cluster-dns"), 10, "cluster-dns")


def cni_bin_dir() -> str:
    for candidate in ("/usr/lib/cni", "/opt/cni/bin"):
        if Path(candidate, "bridge").exists():
            return candidate
    raise ClusterError("no CNI plugins: apt-get install containernetworking-plugins")


def containerd_config() -> Path:
    # The image store outlives the cluster (images load once); containers do not.
    root, state = CACHE / "containerd", STATE / "containerd" / "state"
    text = f"""version = 2
root = "{root}"
state = "{state}"
[grpc]
  address = "{CONTAINERD_SOCK}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  enable_selinux = false
  # Without CAP_SYS_RESOURCE (some VMs and containers) no process may lower its
  # oom_score_adj, and runc fails to start the sandbox at -998: keep them >= ours.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni_bin_dir()}"
    conf_dir = "{STATE / "cni" / "net.d"}"
"""
    path = STATE / "containerd" / "config.toml"
    path.write_text(text)
    return path


def pause_image() -> None:
    """The pod sandbox image, built here: a static Go program that waits for a signal."""
    archive = CACHE / "images" / "rota-pause.tar"
    if not archive.exists():
        log("building the pod sandbox image")
        work = CACHE / "images" / "pause"
        work.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                "go",
                "build",
                "-trimpath",
                "-ldflags=-s -w",
                "-o",
                str(work / "pause"),
                str(HERE / "pause.go"),
            ],
            check=True,
            env={
                **os.environ,
                "CGO_ENABLED": "0",
                "GOCACHE": str(CACHE / "go-build"),
                "GO111MODULE": "off",
            },
        )
        container = subprocess.run(
            ["buildah", "from", "scratch"], check=True, capture_output=True, text=True
        ).stdout.strip()
        try:
            run("buildah", "copy", container, work / "pause", "/pause")
            run("buildah", "config", "--entrypoint", '["/pause"]', container)
            run("buildah", "commit", "--quiet", container, PAUSE_IMAGE)
        finally:
            run("buildah", "rm", container, check=False)
        run(
            "podman",
            "save",
            "--quiet",
            "--format",
            "docker-archive",
            "-o",
            f"{archive}.part",
            PAUSE_IMAGE,
        )
        Path(f"{archive}.part").rename(archive)
    run("ctr", "--address", CONTAINERD_SOCK, "-n", "k8s.io", "images", "import", archive)


def kubelet_config() -> Path:
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(PKI / "ca.crt")},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "tlsCertFile": str(PKI / "kubelet.crt"),
        "tlsPrivateKeyFile": str(PKI / "kubelet.key"),
        "cgroupDriver": "cgroupfs",
        "failSwapOn": False,
        "readOnlyPort": 0,
        "resolvConf": "/etc/resolv.conf",
        "clusterDomain": "cluster.local",
        "clusterDNS": [POD_GATEWAY],
        "serializeImagePulls": False,
        "imageGCHighThresholdPercent": 100,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
        },
        "nodeStatusUpdateFrequency": "4s",
        "syncFrequency": "10s",
        "fileCheckFrequency": "10s",
    }
    path = STATE / "kubelet" / "config.json"
    path.write_text(json.dumps(config, indent=2))
    return path


# -- tear down ------------------------------------------------------------------


def down(quiet: bool = False) -> None:
    if not STATE.exists():
        return
    if not quiet:
        log("stopping the cluster")
    for component in ("kube-proxy", "kubelet"):
        stop(component)
    remove_containers()
    for component in reversed(COMPONENTS):
        stop(component)
    if (BIN / "kube-proxy").exists():
        run(BIN / "kube-proxy", "--cleanup", check=False)
    run("ip", "link", "delete", BRIDGE, check=False)
    remove_masquerade_rules()
    unmount_under(STATE)
    shutil.rmtree(STATE, ignore_errors=True)
    if not quiet:
        log("cluster stopped")


def remove_containers() -> None:
    """Stop what the kubelet ran: containerd's tasks, then its containers and pod netns."""
    if not alive("containerd"):
        return
    ctr = ["ctr", "--address", str(CONTAINERD_SOCK), "-n", "k8s.io"]
    listed = subprocess.run([*ctr, "tasks", "ls", "-q"], capture_output=True, text=True)
    for task in listed.stdout.split():
        subprocess.run([*ctr, "tasks", "kill", "-s", "SIGKILL", task], capture_output=True)
    deadline = time.monotonic() + 20
    for task in listed.stdout.split():
        while time.monotonic() < deadline:
            done = subprocess.run([*ctr, "tasks", "delete", task], capture_output=True)
            if done.returncode == 0 or b"not found" in done.stderr:
                break
            time.sleep(0.3)
    listed = subprocess.run([*ctr, "containers", "ls", "-q"], capture_output=True, text=True)
    for container in listed.stdout.split():
        subprocess.run([*ctr, "containers", "rm", container], capture_output=True)
    netns = Path("/var/run/netns")
    if netns.is_dir():
        for entry in netns.glob("cni-*"):
            subprocess.run(["umount", str(entry)], capture_output=True)
            entry.unlink(missing_ok=True)


def remove_masquerade_rules() -> None:
    """The bridge plugin's NAT rules of pods that never saw a CNI DEL (killed, not stopped)."""
    listed = subprocess.run(
        ["iptables", "-t", "nat", "-S", "POSTROUTING"], capture_output=True, text=True
    )
    for rule in listed.stdout.splitlines():
        if '"name: \\"rota\\"' not in rule or " -j CNI-" not in rule:
            continue
        chain = rule.rsplit(" -j ", 1)[1].strip()
        spec = shlex.split(rule)[2:]
        subprocess.run(["iptables", "-t", "nat", "-D", "POSTROUTING", *spec], capture_output=True)
        subprocess.run(["iptables", "-t", "nat", "-F", chain], capture_output=True)
        subprocess.run(["iptables", "-t", "nat", "-X", chain], capture_output=True)


def unmount_under(root: Path) -> None:
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for target in sorted((m for m in mounts if m.startswith(f"{root}/")), reverse=True):
        subprocess.run(["umount", "-l", target], capture_output=True)


def main(argv: list[str]) -> int:
    command = argv[1] if len(argv) > 1 else ""
    try:
        if command == "up":
            up()
        elif command == "down":
            down()
        elif command == "load-images":
            if not alive("containerd"):
                raise ClusterError("the local cluster is not running: make cluster-up")
            subprocess.run(
                ["bash", str(HERE / "images.sh"), "load", str(CONTAINERD_SOCK)], check=True
            )
        elif command == "env":
            if not alive("kube-apiserver"):
                print("the local cluster is not running: make cluster-up", file=sys.stderr)
                return 1
            print(f"export KUBECONFIG={ADMIN_KUBECONFIG}")
        else:
            print("usage: controlplane.py up | down | env | load-images", file=sys.stderr)
            return 2
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
