"""Whether a job's workers run on this machine, and the local paths a
cluster elsewhere cannot use (refused before any work is submitted).

The rule ("on this machine"): the workers share this machine's files when

* the runner is Beam's local runner (DirectRunner, run as the FnApiRunner);
* Dask: dpsynth starts the cluster (no ``--dask_client_address`` and no
  ``--dask_scheduler_file``), or the scheduler's address (given, or read
  from the scheduler file) is on this machine: a loopback or unspecified
  address, ``localhost``, or one of this host's own interface addresses (a
  host name counts when every address it resolves to does);
* a portable runner (Prism, Flink, Spark, PortableRunner): its job server
  (``--job_endpoint``) and cluster (``--flink_master``,
  ``--spark_master_url``) are started here or are on this machine by the
  address rule, and its SDK workers are this process (``LOOPBACK``,
  Beam's default for Prism and for Flink's and Spark's local masters),
  processes of that local runner (``PROCESS``) or a worker pool on this
  machine (``EXTERNAL`` with a local ``--environment_config``).

Anything else is elsewhere: Dataflow, a remote scheduler or job server,
SDK workers in Docker containers (their own file system), and runners
dpsynth does not know. Deciding reads only the flags (and a scheduler
file): no engine is contacted, so every refusal below comes before one is.

On a cluster elsewhere dpsynth refuses, in one line naming the flag, every
local path the run would use (``check_paths``): the workers would read or
write their own host's folders, so a run failed after reading the data, or
wrote its release where nobody looks. And it needs
``--noise-key-location`` (``noise_key_refusal``): the job graph travels to
the cluster over the network and a key pickled into it would let its
readers remove the noise.
"""

from __future__ import annotations

import ipaddress
import json
import re
import socket
import urllib.parse
from typing import Optional

from dpsynth.pipelines.runners import runner_names

# Flags whose value names where Beam itself writes (Beam's own options).
BEAM_PATH_FLAGS = (("temp_location", "--temp_location"),
                   ("staging_location", "--staging_location"))
SHARED_EXAMPLE = "gs://BUCKET/PATH"
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_LOCAL_RUNNERS = {*runner_names.LOCAL_RUNNERS, "bundlebaseddirectrunner",
                  "switchingdirectrunner", "testdirectrunner"}
_PORTABLE = ("prism", "flink", "spark", "portablerunner")
_FLINK_EMBEDDED = ("[local]", "[auto]", "[collection]")


def is_local_path(path: str) -> bool:
    """A path of this machine's file system: no URL scheme, or ``file://``
    (gs://, s3://, hdfs://, azfs:// name shared storage)."""
    match = _SCHEME.match(path)
    return match is None or match.group(1).lower() == "file"


def address_host(address: str) -> Optional[str]:
    """The host of ``tcp://HOST:PORT``, ``HOST:PORT``, ``[::1]:PORT``,
    ``http://HOST:PORT/...`` or ``HOST``; None when there is none."""
    text = address.strip()
    if "://" not in text:
        text = "tcp://" + text
    try:
        return urllib.parse.urlsplit(text).hostname
    except ValueError:
        return None


def own_addresses() -> set:
    """This host's interface addresses (psutil, which Dask needs; else what
    the host name resolves to)."""
    found: set = set()
    try:
        import psutil
        for addrs in psutil.net_if_addrs().values():
            found.update(a.address for a in addrs
                         if a.family in (socket.AF_INET, socket.AF_INET6))
    except ImportError:
        found.update(_resolve(socket.gethostname()))
    return {ip for ip in map(_ip, found) if ip is not None}


def _ip(text: str):
    try:
        return ipaddress.ip_address(text.split("%", 1)[0])  # fe80::1%eth0
    except ValueError:
        return None


def _resolve(host: str) -> list[str]:
    try:
        return [info[4][0] for info in socket.getaddrinfo(host, None)]
    except (OSError, UnicodeError):
        return []


def on_this_machine(host: Optional[str]) -> bool:
    """The address rule: loopback, unspecified (0.0.0.0, ::),
    ``localhost`` or one of this host's interface addresses; a name only
    when every address it resolves to is (one that does not resolve is
    not)."""
    if not host:
        return False
    if host.lower() == "localhost":
        return True
    ip = _ip(host)
    addresses = [ip] if ip is not None else [
        a for a in map(_ip, _resolve(host)) if a is not None]
    if not addresses:
        return False
    own = None
    for ip in addresses:
        if ip.is_loopback or ip.is_unspecified:
            continue
        own = own_addresses() if own is None else own
        if ip not in own:
            return False
    return True


def _here(address: str) -> bool:
    return address.strip().startswith("inproc://") or on_this_machine(
        address_host(address))


def _runner(opts: dict) -> str:
    return str(opts.get("runner") or "DirectRunner").lower()


def elsewhere(opts: dict) -> Optional[str]:
    """None when the job's workers run on this machine (the rule in the
    module docstring); else a clause saying what runs them elsewhere, for
    one-line messages. ``opts``: ``PipelineOptions.get_all_options()``."""
    runner = _runner(opts)
    short = runner.rsplit(".", 1)[-1]
    if runner in _LOCAL_RUNNERS or short in _LOCAL_RUNNERS:
        return None
    if runner_names.is_dask(runner):
        return _dask_elsewhere(opts)
    if "dataflow" in short:
        return "Dataflow's workers are not on this machine"
    if short.startswith(_PORTABLE):
        return _portable_elsewhere(opts, short)
    return (f"runner {opts.get('runner')} is not known to run on this "
            "machine")


def _dask_elsewhere(opts: dict) -> Optional[str]:
    address, scheduler_file = opts.get("address"), opts.get("scheduler_file")
    if scheduler_file:
        address = scheduler_file_address(scheduler_file)
        if address is None:
            return (f"the Dask scheduler of --dask_scheduler_file "
                    f"{scheduler_file} (unreadable here) is not known to be "
                    "on this machine")
        where = f"--dask_scheduler_file {scheduler_file}: {address}"
    else:
        where = f"--dask_client_address {address}"
    if not address or _here(address):
        return None  # dpsynth's LocalCluster, or a scheduler here
    return f"the Dask scheduler ({where}) is not on this machine"


def scheduler_file_address(path: str) -> Optional[str]:
    """The scheduler address a Dask scheduler file holds (public
    configuration, not data), or None."""
    try:
        with open(path, encoding="utf-8") as f:
            address = json.load(f).get("address")
    except (OSError, ValueError, AttributeError):
        return None
    return address if isinstance(address, str) else None


def _portable_elsewhere(opts: dict, runner: str) -> Optional[str]:
    """A portable runner's job server, cluster and SDK workers."""
    endpoint = opts.get("job_endpoint")
    if endpoint and endpoint != "embed" and not _here(endpoint):
        return f"the job server (--job_endpoint {endpoint}) is not on this machine"
    local_master = True
    if runner.startswith("flink"):
        master = opts.get("flink_master") or "[auto]"
        local_master = master in _FLINK_EMBEDDED
        if not local_master and not _here(master):
            return (f"the Flink cluster (--flink_master {master}) is not on "
                    "this machine")
    if runner.startswith("spark"):
        master = opts.get("spark_master_url") or "local[4]"
        local_master = re.match(r"^local(\[.+\])?$", master) is not None
        if not local_master and not _here(master):
            return (f"the Spark cluster (--spark_master_url {master}) is not "
                    "on this machine")
    env = str(opts.get("environment_type") or "").upper()
    if not env:  # Beam's defaults (its runners' default_environment)
        env = "LOOPBACK" if (runner.startswith("prism")
                             or (runner.startswith(("flink", "spark"))
                                 and local_master)) else "DOCKER"
    if env in ("LOOPBACK", "PROCESS"):
        return None
    config = str(opts.get("environment_config") or "")
    if env == "EXTERNAL" and config and _here(config):
        return None
    if env == "EXTERNAL":
        return (f"the SDK worker pool (--environment_config {config or '?'}) "
                "is not on this machine")
    return (f"the SDK workers (--environment_type {env}) are not on this "
            "machine's file system")


def path_flags(spec) -> list[tuple[str, Optional[str]]]:
    """(flag, path) of every path a `generate` run's workers or its lifetime
    ledger use; path None where the flag is unset and its default is on
    this machine (the demo's rows, ./dpsynth-releases)."""
    out: list[tuple[str, Optional[str]]] = []
    if spec.input.images is not None:
        out += image_flags(spec.input.images)
    else:
        out.append(("--input", spec.input.path))
    out.append(("--output", spec.output.path))
    if spec.budget.store is not None:
        out.append(("--budget-store", spec.budget.store))
    if spec.run.noise_key_location is not None:
        out.append(("--noise-key-location", spec.run.noise_key_location))
    return out


def image_flags(images) -> list[tuple[str, str]]:
    """(flag, path) of the files an ``ImageOptions`` has workers read or
    write: the images, the bad-images report, the encoder's weights or
    model file."""
    out = [("--images", images.path)]
    if images.bad_images_report:
        out.append(("--bad-images-report", images.bad_images_report))
    if images.encoder_weights:
        out.append(("--encoder-weights", images.encoder_weights))
    kind, sep, model = images.encoder.partition(":")
    if sep and kind in ("keras", "onnx"):
        out.append(("--encoder", model))
    return out


def local_path_refusal(flag: str, path: Optional[str],
                       clause: str) -> str:
    """The one line refusing ``flag``'s local ``path`` (None: its local
    default) on a cluster elsewhere (``clause``: ``elsewhere``'s)."""
    what = {"--input": "the built-in demo reads its rows from this "
                       "machine's temporary folder",
            "--output": "the default ./dpsynth-releases/<run id> is a "
                        "local path"}
    named = (f"{flag} not given: {what[flag]}" if path is None
             else f"{flag} {path} is a local path")
    why = ("a cluster's runs need one lifetime ledger that every launcher "
           "shares" if flag == "--budget-store" else
           "the workers cannot use this machine's files")
    return (f"{named}, but {clause}: {why}; a shared location "
            f"({SHARED_EXAMPLE}) is needed")


def local_paths(spec, opts: dict) -> list[tuple[str, Optional[str]]]:
    """(flag, path) of a `generate` run's local paths, Beam's
    --temp_location and --staging_location included; path None: a local
    default."""
    return _local(path_flags(spec), opts)


def _local(flags: list, opts: dict) -> list[tuple[str, Optional[str]]]:
    found = [*flags, *((flag, opts[key]) for key, flag in BEAM_PATH_FLAGS
                       if opts.get(key))]
    return [(flag, path) for flag, path in found
            if path is None or is_local_path(path)]


def check_paths(spec, opts: dict) -> None:
    """ValueError (one line naming the flag) for the first local path of a
    `generate` run whose workers are elsewhere; nothing is read."""
    _refuse(path_flags(spec), opts)


def check_encode_paths(spec, opts: dict) -> None:
    """``check_paths`` for `dpsynth encode` (``EncodeSpec``)."""
    _refuse([*image_flags(spec.images), ("--output", spec.output)], opts)


def _refuse(flags: list, opts: dict) -> None:
    clause = elsewhere(opts)
    found = _local(flags, opts) if clause is not None else []
    if found:
        raise ValueError(local_path_refusal(*found[0], clause))


def noise_key_refusal(opts: dict) -> Optional[str]:
    """Why ``--noise-key-location`` is needed (a secure run on a cluster
    elsewhere), or None. Dataflow has its own line (``job``)."""
    clause = elsewhere(opts)
    return None if clause is None else noise_key_message(clause)


def noise_key_message(clause: str) -> str:
    """The one line asking for ``--noise-key-location``, after ``clause``
    (what runs elsewhere)."""
    return (f"{clause}: the job graph travels to it over the network and "
            "stays in its memory, and a noise key pickled into it would let "
            "whoever reads either remove the noise: pass "
            f"--noise-key-location {SHARED_EXAMPLE}, readable only by the "
            "workers (the key is written there for the run and deleted "
            "after it)")


def cleartext_refusal(clause: str, address: str) -> str:
    """The one line refusing a secure run's traffic in clear text."""
    return (f"{clause}, and the scheduler ({address}) speaks plain TCP: the "
            "run's partial sums and counts would cross the network in clear "
            "text; give the cluster TLS (a tls:// scheduler; the launcher's "
            "certificate in Dask's distributed.comm.tls settings, "
            "deploy/README.md \"Dask\")")
