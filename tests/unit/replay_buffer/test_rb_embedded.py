"""The embedded Redis: AOF on, restartable on the same directory, clean stop, no server left behind."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from procs import alive

from services.replay_buffer import embedded
from services.replay_buffer.embedded import start_embedded_redis


def test_data_survives_a_crash_and_a_restart_on_the_same_directory(tmp_path: Path) -> None:
    url, server = start_embedded_redis(tmp_path / "r")
    try:
        client = redis.Redis.from_url(url)
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("appendfsync") == {"appendfsync": "everysec"}
        client.xadd("s", {"k": "v"})
        client.close()
    finally:
        server.kill()  # a crash: no shutdown, no final fsync beyond what Redis wrote already
    assert (tmp_path / "r" / "appendonly.aof").exists()
    url2, server2 = start_embedded_redis(tmp_path / "r", appendfsync="always")
    try:
        client = redis.Redis.from_url(url2)
        assert url2 == url
        assert [fields for _, fields in client.xrange("s")] == [{b"k": b"v"}]
        assert client.config_get("appendfsync") == {"appendfsync": "always"}
        client.close()
    finally:
        assert server2.stop() == 0


def test_a_server_left_running_by_a_dead_owner_is_shut_down_first(tmp_path: Path) -> None:
    # A child process starts a server and is SIGKILLed; on Linux the server dies with it (parent-death signal);
    # either way a new start must find the directory free and the data intact.
    code = (
        "import sys, time, redis\n"
        "from services.replay_buffer.embedded import start_embedded_redis\n"
        f"url, s = start_embedded_redis({str(tmp_path / 'r')!r})\n"
        "redis.Redis.from_url(url).set('k', 'v')\n"
        "print(s.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    redis_pid = int(owner.stdout.readline())
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    url, server = start_embedded_redis(tmp_path / "r")
    try:
        assert redis.Redis.from_url(url).get("k") == b"v"
        assert server.pid != redis_pid
    finally:
        server.stop()
    deadline = time.monotonic() + 10
    while alive(redis_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(redis_pid)



def test_long_directories_get_a_socket_in_the_temp_dir(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 120)
    sock = embedded.socket_path_for(deep)
    assert len(str(sock)) < 100 and sock == embedded.socket_path_for(deep)
    assert embedded.socket_path_for(tmp_path) == tmp_path / "redis.sock"


def test_bad_appendfsync_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="appendfsync"):
        start_embedded_redis(tmp_path, appendfsync="sometimes")


def test_importable_without_grpc() -> None:
    code = (
        "import sys; sys.modules['grpc'] = None\n"
        "import services.replay_buffer.embedded as e\n"
        "assert 'grpc' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
