"""Several "nodes" on one machine: Linux network namespaces joined by a bridge, each with its
own address, hostname and, optionally, a bandwidth-limited link, so multi-node launches
(torchrun's c10d rendezvous, horovodrun over SSH, a SLURM cluster's slurmd per node) run for
real without a second machine.

Each node is a network namespace holding `eth0` (one end of a veth pair whose other end is a
port of the bridge) and `lo`. The bridge itself has an address in the root namespace, so
daemons there (a SLURM controller) reach every node. A node's processes see its own hostname
(a UTS namespace per command) and resolve the others' names through `/etc/netns/<ns>/hosts`,
mounted over /etc/hosts (a mount namespace per command, as `ip netns exec` does). A link limit
is a token bucket (`tc tbf`) on both ends of the node's veth, so it holds in each direction;
latency is not emulated (these kernels have no `netem`). Needs root. Everything made here is
removed on exit, on failure too.
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpt2dist.errors import UsageError
from gpt2dist.launch.lifetime import stop
from gpt2dist.system.parent_death import ends_with_this_process

NETNS_ETC = Path("/etc/netns")
NETNS_RUN = Path("/run/netns")  # where `ip netns add` keeps a namespace's handle
INTERFACE = "eth0"  # the same name on every node: horovodrun routes over interfaces all hosts share
SUBNETS = ipaddress.ip_network("10.213.0.0/16")
PREFIX = "g2d"  # names of what is made here: g2d<pid>-<n>b (bridge), g2d<pid>-<n>n<k> (node k), pid in hex
MADE_HERE = re.compile(rf"^{PREFIX}(?P<pid>[0-9a-f]+)-[0-9a-f]+(?:b|n\d+)$")
SSH_KEYS = "gpt2dist-ssh-"  # ssh_between's keys, in the temporary directory: gpt2dist-ssh-<pid>-..., pid in hex
KEYS_MADE_HERE = re.compile(rf"^{SSH_KEYS}(?P<pid>[0-9a-f]+)-")
TBF_LATENCY = "50ms"  # how long a packet may wait in the bucket's queue before it is dropped
_made = itertools.count()


@dataclass(frozen=True)
class Node:
    name: str
    address: str
    netns: str

    def command(self, argv: Sequence[str]) -> list[str]:
        """`argv` as a process of this node: its network namespace, its hostname (a UTS namespace) and
        its files from /etc/netns/<ns>/ mounted over /etc (a private mount namespace). Not `ip netns
        exec`, which also remounts /sys for the namespace and so hides the cgroup tree slurmd needs."""
        script = 'hostname "$0" && for f in "$1"/*; do mount --bind "$f" "/etc/${f##*/}" || exit 1; done && shift && exec "$@"'
        return ["nsenter", f"--net={NETNS_RUN / self.netns}", "unshare", "--uts", "--mount", "--propagation",
                "private", "--", "sh", "-c", script, self.name, str(NETNS_ETC / self.netns), *argv]

    def interface_bytes(self) -> dict[str, int]:
        """Bytes this node's link has sent and received since it was made."""
        shown = _run("ip", "-n", self.netns, "-s", "-j", "link", "show", INTERFACE)
        stats = json.loads(shown)[0]["stats64"]
        return {"tx_bytes": stats["tx"]["bytes"], "rx_bytes": stats["rx"]["bytes"]}


@dataclass(frozen=True)
class EmulatedNodes:
    nodes: list[Node]
    bridge: str
    host_address: str  # the bridge's address: how a node reaches the root namespace
    link_mbit: float | None

    def hosts_entries(self) -> str:
        return "".join(f"{node.address} {node.name}\n" for node in self.nodes)


def unavailable() -> str | None:
    """Why nodes cannot be emulated here, or None."""
    if os.geteuid() != 0:
        return "emulated nodes need root (network namespaces and veth links)"
    missing = [tool for tool in ("ip", "tc", "unshare", "nsenter") if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not installed (apt-get install iproute2 util-linux)"
    return None


def ssh_unavailable() -> str | None:
    """Why horovodrun cannot reach emulated nodes here (it needs an sshd on each), or None."""
    if shutil.which("sshd", path=f"{os.environ.get('PATH', '')}:/usr/sbin") is None or shutil.which("ssh-keygen") is None:
        return "sshd not installed (apt-get install openssh-server)"
    return None


def _run(*argv: str) -> str:
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 of SUBNETS that no interface of the root namespace uses yet."""
    used = set()
    for link in json.loads(_run("ip", "-j", "addr", "show")):
        for address in link.get("addr_info", []):
            if address.get("family") == "inet":
                used.add(ipaddress.ip_interface(f"{address['local']}/{address['prefixlen']}").network)
    for subnet in SUBNETS.subnets(new_prefix=24):
        if not any(subnet.overlaps(other) for other in used):
            return subnet
    raise RuntimeError(f"every /24 of {SUBNETS} is in use; remove stale bridges (ip link show type bridge)")


def _shape(device: str, link_mbit: float, netns: str | None = None) -> None:
    """A token bucket of `link_mbit` on a device's egress; its burst holds one GSO packet and 1 ms at rate."""
    burst = max(65536 * 2, int(link_mbit * 1e6 / 8 / 1000))
    prefix = ("ip", "netns", "exec", netns) if netns else ()
    _run(*prefix, "tc", "qdisc", "replace", "dev", device, "root", "tbf", "rate", f"{link_mbit}mbit",
         "burst", str(burst), "latency", TBF_LATENCY)


@contextlib.contextmanager
def emulated_nodes(count: int, link_mbit: float | None = None) -> Iterator[EmulatedNodes]:
    """`count` nodes named node1..nodeN, each with `link_mbit` Mbit/s each way (None: unshaped)."""
    reason = unavailable()
    if reason:
        raise UsageError(reason)
    if count < 1:
        raise UsageError(f"emulated node count must be at least 1, got {count}")
    if link_mbit is not None and link_mbit <= 0:
        raise UsageError(f"link bandwidth must be positive Mbit/s, got {link_mbit}")
    _remove_stale()
    tag = f"{PREFIX}{os.getpid():x}-{next(_made):x}"  # interface names have at most 15 characters
    subnet = _free_subnet()
    hosts = list(subnet.hosts())
    nodes = [Node(f"node{i + 1}", str(hosts[i]), f"{tag}n{i + 1}") for i in range(count)]
    made = EmulatedNodes(nodes, f"{tag}b", str(hosts[-1]), link_mbit)
    try:
        _run("ip", "link", "add", made.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{made.host_address}/{subnet.prefixlen}", "dev", made.bridge)
        _run("ip", "link", "set", made.bridge, "up")
        for node in nodes:
            _run("ip", "netns", "add", node.netns)
            port = node.netns  # the veth end in the root namespace, a bridge port
            _run("ip", "link", "add", port, "type", "veth", "peer", "name", INTERFACE, "netns", node.netns)
            _run("ip", "link", "set", port, "master", made.bridge, "up")
            _run("ip", "-n", node.netns, "addr", "add", f"{node.address}/{subnet.prefixlen}", "dev", INTERFACE)
            _run("ip", "-n", node.netns, "link", "set", INTERFACE, "up")
            _run("ip", "-n", node.netns, "link", "set", "lo", "up")
            if link_mbit is not None:
                _shape(port, link_mbit)
                _shape(INTERFACE, link_mbit, node.netns)
            etc = NETNS_ETC / node.netns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(f"127.0.0.1 localhost\n{made.host_address} gpt2dist-host\n"
                                       + made.hosts_entries())
        yield made
    finally:
        _remove(made)


def _remove(made: EmulatedNodes) -> None:
    """Delete the nodes (ending only processes started inside them), then the bridge."""
    for node in made.nodes:
        _remove_node(node.netns)
    with contextlib.suppress(OSError):
        NETNS_ETC.rmdir()  # only when no other namespace keeps files there
    subprocess.run(["ip", "link", "del", made.bridge], capture_output=True)


def _remove_node(netns: str) -> None:
    _end_processes(netns)
    # deleting the root namespace's veth end removes both ends now; a deleted namespace frees its end later
    subprocess.run(["ip", "link", "del", netns], capture_output=True)
    subprocess.run(["ip", "netns", "del", netns], capture_output=True)
    shutil.rmtree(NETNS_ETC / netns, ignore_errors=True)


def _remove_stale() -> None:
    """Remove nodes, bridges and ssh keys left by a process that died without its clean-up (SIGKILL)."""
    def stale(name: str, made_here: re.Pattern = MADE_HERE) -> bool:
        match = made_here.match(name)
        return bool(match) and not Path(f"/proc/{int(match['pid'], 16)}").exists()

    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.splitlines()
    for netns in filter(stale, (line.split()[0] for line in listed if line.strip())):
        _remove_node(netns)
    for link in filter(stale, (link["ifname"] for link in json.loads(_run("ip", "-j", "link", "show")))):
        subprocess.run(["ip", "link", "del", link], capture_output=True)  # bridges
    for keys in Path(tempfile.gettempdir()).glob(f"{SSH_KEYS}*"):
        if stale(keys.name, KEYS_MADE_HERE):
            shutil.rmtree(keys, ignore_errors=True)


def _end_processes(netns: str, grace_s: float = 10.0) -> None:
    listed = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True)
    pids = [int(pid) for pid in listed.stdout.split()]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while pids and time.monotonic() < deadline:
        pids = [pid for pid in pids if Path(f"/proc/{pid}").exists()]
        time.sleep(0.1)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def ssh_between(made: EmulatedNodes, timeout_s: float = 30.0) -> Iterator[None]:
    """An sshd on every node that lets root in with a key made here, and an ssh client configuration
    that uses it: what `horovodrun -H` needs to start ranks on other hosts. Both live in each node's
    /etc/ssh (mounted by Node.command), so neither the machine's sshd nor root's known_hosts change."""
    missing = ssh_unavailable()
    if missing:
        raise UsageError(f"{missing}: horovodrun reaches other nodes over ssh")
    keys = Path(tempfile.mkdtemp(prefix=f"{SSH_KEYS}{os.getpid():x}-"))
    privilege_separation = Path("/run/sshd")  # sshd refuses to start without it; Debian makes it at boot
    made_privilege_separation = not privilege_separation.exists()
    daemons: list[subprocess.Popen] = []
    try:
        privilege_separation.mkdir(mode=0o755, exist_ok=True)
        for name in ("id_ed25519", "host_ed25519"):
            _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpt2dist-emulated-nodes", "-f", str(keys / name))
        shutil.copy(keys / "id_ed25519.pub", keys / "authorized_keys")
        for node in made.nodes:
            etc = NETNS_ETC / node.netns / "ssh"
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "sshd_config").write_text(
                f"ListenAddress {node.address}\nHostKey {keys / 'host_ed25519'}\n"
                f"AuthorizedKeysFile {keys / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
                "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
                "StrictModes no\nPidFile none\n")  # StrictModes: the keys lie under world-writable /tmp
            (etc / "ssh_config").write_text(
                f"Host *\n  IdentityFile {keys / 'id_ed25519'}\n  UserKnownHostsFile {keys / 'known_hosts'}\n"
                "  StrictHostKeyChecking accept-new\n  BatchMode yes\n  LogLevel ERROR\n")
        for node in made.nodes:
            log = open(keys / f"sshd-{node.name}.log", "w")
            # a SIGKILLed launcher runs no clean-up: the kernel ends the daemons with it
            daemons.append(subprocess.Popen(node.command(["/usr/sbin/sshd", "-D", "-e"]), stdin=subprocess.DEVNULL,
                                            stdout=log, stderr=log, preexec_fn=ends_with_this_process(signal.SIGKILL)))
        for node, daemon in zip(made.nodes, daemons):
            _wait_for_port(node.address, 22, daemon, timeout_s, keys / f"sshd-{node.name}.log")
        yield
    finally:
        for daemon in daemons:
            stop(daemon, grace_s=10)
        for node in made.nodes:
            shutil.rmtree(NETNS_ETC / node.netns / "ssh", ignore_errors=True)
        shutil.rmtree(keys, ignore_errors=True)
        if made_privilege_separation:
            with contextlib.suppress(OSError):
                privilege_separation.rmdir()


def _wait_for_port(address: str, port: int, daemon: subprocess.Popen, timeout_s: float, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if daemon.poll() is not None:
            raise RuntimeError(f"sshd on {address} exited with {daemon.returncode}: {log.read_text()[-2000:]}")
        with socket.socket() as probe:
            probe.settimeout(1)
            if probe.connect_ex((address, port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"sshd on {address}:{port} did not accept connections in {timeout_s:.0f} s: "
                       f"{log.read_text()[-2000:]}")
