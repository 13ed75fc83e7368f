"""Shared fixtures: one real embedded nats-server (JetStream) per test session, SmolLM2's
tokenizer."""

from __future__ import annotations

import gc
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from agentrl.core.gcstart import raise_young_generation

# the tiny engine and checkpoints of the serving, release and bench tests; the CPU report;
# xdist workers sharing the assertion rewriting of a fresh checkout
pytest_plugins = ["deploy_fixtures", "cpu_report", "rewrite_share"]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One torch (OpenMP) thread in the test processes and every process they start, unless a
# process sets its own: the suite runs two workers on two cores, and OpenMP's second thread
# waits on barriers against the other worker (the product's own finding: `pick_threads`,
# `engine_threads`). It also ends an order dependence: a test that called
# torch.set_num_threads(1) made every later test of its worker single-threaded. Measured at
# load 5-6 (CPU-s, 2 threads -> 1): tests/learners/test_tooluse_learn.py 40.7 -> 16.0, the
# training service's two heaviest tests 36.5 -> 29.8, tests/llm/test_llm_ddp.py 15.7 -> 12.4.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Property tests check properties, not speed: Hypothesis' clock-based checks (a per-example
# deadline, "input generation is slow") fail on a loaded host. At load 14 one parser test
# failed its health check ("only generated 2 valid inputs after 2.19 seconds", 2026-11-30).
settings.register_profile(
    "suite", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.load_profile("suite")


def _ca_certificates_on_demand() -> None:
    """The system's CA certificates from OpenSSL's hashed directory, read at a handshake,
    instead of a bundle file parsed whole for every SSL context. httpx and httpx2 (openai's)
    build a context per client, and with SSL_CERT_FILE set (this machine sets it; without
    it, certifi's bundle) that costs ~55 ms of CPU a client: the tests build hundreds, each
    for plain http on loopback (tests/capture with two tests/app files: 144, 9 CPU-s at
    load 12); from the directory ~1 ms. Here and in every process the tests start. The same
    certificates: HTTPS still verifies (no test leaves the machine).

    SSL_CERT_FILE is set empty, not removed: OpenSSL's default paths (`ssl.create_default_
    context()` without a cafile: aiohttp builds one on import) read the file SSL_CERT_FILE
    names, else the built-in one (here a link to the same bundle), whole, beside the
    directory: 55 ms a context, 0.7 ms with SSL_CERT_FILE empty (`import aiohttp.connector`
    0.45-0.47 -> 0.34-0.37 CPU-s at load 8, 2026-11-30). An empty name loads no file
    (OpenSSL ignores the failed load) and httpx reads an empty SSL_CERT_FILE as unset."""
    import re
    import ssl

    capath = ssl.get_default_verify_paths().openssl_capath
    if not os.path.isdir(capath) or not any(
        re.fullmatch(r"[0-9a-f]{8}\.\d+", name) for name in os.listdir(capath)
    ):
        return  # no hashed directory here: the bundle it is
    os.environ["SSL_CERT_FILE"] = ""
    os.environ["SSL_CERT_DIR"] = capath


_ca_certificates_on_demand()

# A test process's collector as an agentrl process's (`agentrl.core.gcstart`), from before
# the collection's imports (torch, transformers: no full collection walks them meanwhile)
raise_young_generation()

# The file whose one test is the longest (the tool-use quick loop, 1-1.5 minutes): handed out
# first, beside the other worker's largest file, instead of last (xdist gives out files by
# their number of tests, most first, and a one-test file at the end kept the other worker idle)
FIRST = ("tests/app/test_loop_tooluse.py",)

# Files of one to four tests that take 25 s or more (wall on 2 cores at load 6-10,
# `--cpu-report`, 2026-11-29): in xdist's order they came last (a one-minute file of one test
# at the end of the run is a minute of one worker alone). Each counts as LONG_COUNT tests,
# which hands them out in the first quarter of the run, between files of other kinds, and
# leaves the short files for the end. (All of the long files first was measured worse
# on 2026-11-27: the quick loops ran side by side.)
LONG = (
    "tests/training/test_runner_replicas.py",
    "tests/app/test_loop_quick.py",
    "tests/offpolicy/test_offpolicy_apex.py",
    "tests/serving/test_gateway_replicas.py",
    "tests/app/test_up_replicas.py",
    "tests/rewards/test_replicas.py",
    "tests/training/test_runner_partition.py",
    "tests/llm/test_llm_ddp.py",
    "tests/warehouse/test_ingester.py",
    "tests/warehouse/test_ingester_replicas.py",
    "tests/rewards/test_rewards_crash.py",
    "tests/capture/test_stack_capture.py",
    "tests/training/test_tooluse_job_hints.py",
    "tests/bench/test_bench_canary.py",
)
LONG_COUNT = 8

# Files that wait for something `scripts/test.sh` starts beside pytest: last, when it is done
# (the compiled gateway front's build, ~1-2 min from a cold target dir)
LAST = ("tests/serving/test_gateway_front.py",)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files in xdist's own order (most tests first, `scripts/test.sh` passes
    `--no-loadscope-reorder`), `FIRST` at the front, `LAST` at the end and `LONG` counted
    as `LONG_COUNT`."""

    def file_of(item: pytest.Item) -> str:
        return item.nodeid.split("::")[0]

    count = Counter(file_of(item) for item in items)

    def rank(item: pytest.Item) -> tuple[int, int]:
        name = file_of(item)
        n = max(count[name], LONG_COUNT) if name in LONG else count[name]
        return (0 if name in FIRST else 2 if name in LAST else 1, -n)

    items.sort(key=rank)  # stable: the tests of a file keep their order


# a session of this many test files or more starts a job launcher (`job_launcher`)
LAUNCHER_FILES = 6
# set by xdist's controller for its workers: the socket of the one launcher it starts for
# all of them once they collected (`pytest_xdist_node_collection_finished`)
SHARED_LAUNCHER = "AGENTRL_TEST_SHARED_LAUNCHER"


def _launcher_wanted(files: int) -> bool:
    """AGENTRL_TEST_LAUNCHER=1 or 0: always, never; else for runs of many files (its own
    imports cost what one job's do); never where the environment names one already."""
    if os.environ.get("AGENTRL_TRAINING_LAUNCHER"):
        return False
    return os.environ.get("AGENTRL_TEST_LAUNCHER", "1" if files >= LAUNCHER_FILES else "0") == "1"


class _Launcher:
    """A job launcher process (`python -m agentrl.training.worker --launcher PATH`)."""

    def __init__(self, path: Path) -> None:
        import subprocess
        import sys

        self.path = path
        self.log = open(f"{path}.log", "wb")  # noqa: SIM115 - the launcher's, closed in stop
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agentrl.training.worker", "--launcher", str(path)],
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=self.log,
            start_new_session=True,
        )

    def stop(self) -> None:
        import subprocess

        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        Path(f"{self.path}.log").unlink(missing_ok=True)


def _launcher_path() -> Path:
    import tempfile

    return Path(tempfile.gettempdir()) / f"agentrl-test-launcher-{os.getpid()}.sock"


_shared: list[_Launcher] = []  # the controller's launcher for its workers
# a worker's wait for the controller's launcher to bind its socket (it binds before its
# imports): a job ordered before would start a process of its own (~9 CPU-s)
SHARED_WAIT_S = 60.0


def _bound(path: Path, timeout: float) -> bool:
    import time

    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def pytest_configure(config: pytest.Config) -> None:
    """xdist's controller names the socket of one launcher for all its workers (they inherit
    the environment): one launcher's imports instead of one per worker (~9 CPU-s each; in
    the suite of 2026-11-30 one worker's launcher forked 1 job)."""
    controller = not hasattr(config, "workerinput") and (
        config.getoption("numprocesses", None) or 0
    )
    if controller and not os.environ.get("AGENTRL_TRAINING_LAUNCHER"):
        os.environ[SHARED_LAUNCHER] = str(_launcher_path())
    if not controller:
        # A process that collects: its collector off until `pytest_collection_finish`
        # collects once and freezes. The collection's imports (torch, transformers) and test
        # modules are nearly all kept to the end; with the collector on meanwhile each
        # worker spent 0.86-0.99 CPU-s in 133 collections (2 full) before its first test,
        # with it off 0.56-0.61 in 50 (tests/learners, serving, release at -n 2,
        # `gc.callbacks`, load 3-10). Not in xdist's controller: it collects no tests (no
        # `pytest_collection_finish`).
        gc.disable()


@pytest.hookimpl(optionalhook=True)  # (xdist's hook: no error under -p no:xdist)
def pytest_xdist_node_collection_finished(node: object, ids: list[str]) -> None:
    """The controller starts the shared launcher once a worker collected a run of many
    files (every worker collects the same tests, and decides the same: `job_launcher`)."""
    path = os.environ.get(SHARED_LAUNCHER)
    if _shared or not path:
        return
    if _launcher_wanted(len({nodeid.split("::")[0] for nodeid in ids})):
        _shared.append(_Launcher(Path(path)))


def pytest_collection_finish(session: pytest.Session) -> None:
    """What a test process's imports and the collection built, frozen: the ~240,000 objects
    it keeps to its end are walked by no later full collection. tests/rewards at -n 0: 20
    full collections took 2.99 of the process's 32.9 CPU-s, and 0.31 with this and the
    young generation raised at this file's import (26.5 CPU-s all, load 5-6). The collector,
    off since `pytest_configure`, is on again from here."""
    gc.collect()
    gc.freeze()
    gc.enable()


def pytest_unconfigure(config: pytest.Config) -> None:
    while _shared:
        _shared.pop().stop()


@pytest.fixture(scope="session", autouse=True)
def job_launcher(request: pytest.FixtureRequest) -> Iterator[Path | None]:
    """One job launcher per test run (`agentrl.training.launcher`), named to every training
    service the tests start, in this process or in processes it starts
    (AGENTRL_TRAINING_LAUNCHER): a job forks from it instead of importing torch,
    transformers and peft again (~6 CPU-s a job, ~60 jobs in the suite). Started for runs
    of many files (`_launcher_wanted`); under xdist the controller's, shared by its workers
    (`pytest_configure`), else this process's own. Tests of the plain job process take it
    away (`no_launcher`)."""
    files = len({item.nodeid.split("::")[0] for item in request.session.items})
    if not _launcher_wanted(files):
        yield None
        return
    shared = os.environ.get(SHARED_LAUNCHER)
    if shared and not _bound(Path(shared), SHARED_WAIT_S):
        shared = None  # the controller's never came: this process's own
    own = None if shared else _Launcher(_launcher_path())
    path = Path(shared) if shared else own.path  # type: ignore[union-attr]
    os.environ["AGENTRL_TRAINING_LAUNCHER"] = str(path)
    try:
        yield path
    finally:
        os.environ.pop("AGENTRL_TRAINING_LAUNCHER", None)
        if own is not None:
            own.stop()


@pytest.fixture()
def no_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    """This test's training services start each job as a process of its own."""
    monkeypatch.delenv("AGENTRL_TRAINING_LAUNCHER", raising=False)


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A real nats-server with JetStream on a free loopback port, for the whole session."""
    from agentrl.bus.server import EmbeddedNats

    server = EmbeddedNats(data_dir=tmp_path_factory.mktemp("nats-session"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def nats_url(nats_server: object) -> str:
    return nats_server.url  # type: ignore[attr-defined, no-any-return]


@pytest.fixture()
def data_dir(tmp_path: Path) -> Path:
    """A fresh agentrl data dir for one test."""
    d = tmp_path / "agentrl-data"
    d.mkdir()
    return d


@pytest.fixture()
def fresh_label_caps() -> Iterator[None]:
    """Empty metric label caps: earlier tests in the same process (the gateway, the deployer,
    other lineages) may have used up a cap's values, after which a new version or lineage is
    counted as "other" — correct in production, not what a test of the labels looks at."""
    from agentrl.observability import instrument, metrics

    for cap in vars(metrics).values():
        if isinstance(cap, metrics.LabelCap | metrics.VersionLabels):
            cap.reset()
    metrics._lineage_of.clear()
    instrument._clear_children()
    was_on = metrics.enabled()
    metrics.set_enabled(True)
    yield
    metrics.set_enabled(was_on)


@pytest.fixture(scope="session")
def smol_tokenizer():  # type: ignore[no-untyped-def]
    """SmolLM2's tokenizer (from the packaged GGUF; seconds, no network): the llm, learners,
    app and training tests' prompts and tokens."""
    from agentrl.llm.loading import load_smollm2_tokenizer

    return load_smollm2_tokenizer()
