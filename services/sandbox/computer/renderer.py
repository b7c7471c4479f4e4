"""One headless Chromium in bubblewrap, driven over its DevTools pipe: load a page, act, screenshot, evaluate.

Isolation, outermost first (the same floors as a task's tests, `services/sandbox/bwrap.py`):
  cgroup    the executor's per-task group when it has them (`sandbox.task_memory_mb`, `sandbox.max_processes`): the
            memory bound of the browser and all its processes together. There is no RLIMIT_AS: V8 reserves
            terabytes of address space it never touches, so an address-space limit only stops Chromium starting.
  prlimit   RLIMIT_NPROC / FSIZE / CORE.
  bwrap     new pid/net/ipc/uts namespaces (`--unshare-net`: no network at all, not even the host's loopback),
            `sandbox.visible_paths` read-only and nothing else of the host (no task set, no work root, no /root),
            a private tmpfs `/tmp` holding the fresh profile (`--user-data-dir`) and home, `--die-with-parent` so
            the browser never outlives the executor.
  setpriv   (executor as root) the session's own uid, no capabilities, no new privileges.
Chromium's own sandbox is off (`--no-sandbox`): it needs user namespaces or a setuid helper that bwrap already
replaces. Pages arrive as `data:` URLs over the pipe; the browser reads no file of the task set.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import fcntl
import os
import shutil
import signal
from dataclasses import dataclass, field
from typing import Any

from services.sandbox.cgroups import TaskCgroup
from services.sandbox.computer.cdp import CdpError, CdpPipe, RendererGone
from services.sandbox.process import TailBuffer

CHROMIUM_ENV = "GRPO_FLEET_CHROMIUM"
_CANDIDATES = ("/usr/lib/chromium/chromium", "chromium", "chromium-browser", "google-chrome")
_PROFILE, _HOME = "/tmp/profile", "/tmp/home"
_CHECK_WORLD = "grpo-check"
# The pipe ends dup'ed onto the fd numbers --remote-debugging-pipe uses (3: commands in, 4: answers out) by bash
# (dash refuses fds above 9); the parent's ends sit at 10 and above so the remap never overwrites one with the other.
_REMAP = 'exec 3<&"$1" 4>&"$2" {a}<&- {b}>&- && shift 2 && exec "$@"'
_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
          "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-quic",
          "--disable-extensions", "--disable-breakpad", "--disable-dev-shm-usage", "--mute-audio",
          "--hide-scrollbars", "--force-device-scale-factor=1", "--font-render-hinting=none",
          "--disable-features=Translate,MediaRouter,OptimizationHints,DialMediaRouteProvider",
          "--remote-debugging-pipe")
# Key name -> (code, windowsVirtualKeyCode, text). Single characters are built in `_key_event`.
KEY_CODES: dict[str, tuple[str, int, str]] = {
    "Enter": ("Enter", 13, "\r"), "Tab": ("Tab", 9, ""), "Backspace": ("Backspace", 8, ""),
    "Escape": ("Escape", 27, ""), "ArrowUp": ("ArrowUp", 38, ""), "ArrowDown": ("ArrowDown", 40, ""),
    "ArrowLeft": ("ArrowLeft", 37, ""), "ArrowRight": ("ArrowRight", 39, ""),
}


def find_chromium() -> str:
    """The browser binary (GRPO_FLEET_CHROMIUM, else Debian's); RuntimeError naming the package when absent."""
    for name in (os.environ.get(CHROMIUM_ENV), *_CANDIDATES):
        path = shutil.which(name) if name else None
        if path:
            return path
    raise RuntimeError(f"no Chromium found (tried {', '.join(_CANDIDATES)}; set {CHROMIUM_ENV}): install it with "
                       "`apt-get install chromium` (scripts/setup.sh does)")


@dataclass(frozen=True)
class RendererSpec:
    """What one browser gets: its viewport, uid, and the host view the sandbox config allows."""

    width: int
    height: int
    marker: str
    """A `--grpo-session=` flag on the browser's command line: how a test finds its process."""
    uid: int | None = None
    use_bwrap: bool = True
    visible_paths: tuple[str, ...] = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc")
    tmpfs_mb: int = 512
    max_processes: int = 256
    max_file_mb: int = 64
    tools: dict[str, str] = field(default_factory=dict)


def _visible(paths: tuple[str, ...]) -> list[str]:
    args: list[str] = []
    for path in dict.fromkeys(os.path.normpath(p) for p in paths):
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", os.path.realpath(path), path]
    if os.path.isdir("/var/cache/fontconfig"):  # without it every start rescans the fonts
        args += ["--ro-bind", "/var/cache/fontconfig", "/var/cache/fontconfig"]
    return args


def renderer_argv(spec: RendererSpec, chromium: str, fds: tuple[int, int]) -> list[str]:
    """The full command line: fd remap, prlimit, bwrap, setpriv, chromium."""
    tool = spec.tools.get
    browser = [chromium, *_FLAGS, f"--user-data-dir={_PROFILE}", f"--window-size={spec.width},{spec.height}",
               f"--grpo-session={spec.marker}", "about:blank"]
    limits = [tool("prlimit", "prlimit"), f"--nproc={spec.max_processes}", f"--fsize={spec.max_file_mb << 20}",
              "--core=0", "--"]
    head = ["/bin/bash", "-c", _REMAP.format(a=fds[0], b=fds[1]), "bash", str(fds[0]), str(fds[1])]
    if not spec.use_bwrap:
        return [*head, *limits, *browser]
    args = [tool("bwrap", "bwrap"), "--die-with-parent", "--new-session", "--hostname", "sandbox",
            "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
            *_visible(spec.visible_paths), "--dev", "/dev", "--perms", "1777", "--tmpfs", "/dev/shm",
            "--proc", "/proc", "--perms", "1777", "--size", str(spec.tmpfs_mb << 20), "--tmpfs", "/tmp",
            "--chdir", "/tmp"]
    inner = browser
    if spec.uid is not None:
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        inner = [tool("setpriv", "setpriv"), f"--reuid={spec.uid}", f"--regid={spec.uid}", "--clear-groups",
                 "--inh-caps=-all", "--no-new-privs", "--", *browser]
    elif os.geteuid() != 0:
        args += ["--unshare-user", "--disable-userns"]
    return [*head, *limits, *args, "--", *inner]


def _env() -> dict[str, str]:
    """A clean environment: nothing of the executor's (tokens included) reaches the browser."""
    return {"PATH": "/usr/bin:/bin", "HOME": _HOME, "TMPDIR": "/tmp", "LANG": "C.UTF-8",
            "XDG_CONFIG_HOME": f"{_HOME}/.config", "XDG_CACHE_HOME": f"{_HOME}/.cache"}


def _high_pipe() -> tuple[int, int]:
    r, w = os.pipe()
    hr, hw = fcntl.fcntl(r, fcntl.F_DUPFD_CLOEXEC, 10), fcntl.fcntl(w, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(r)
    os.close(w)
    return hr, hw


def _key_event(key: str) -> dict[str, Any]:
    if key in KEY_CODES:
        code, vk, text = KEY_CODES[key]
    else:  # one character
        upper = key.upper()
        code = f"Key{upper}" if upper.isascii() and upper.isalpha() else f"Digit{key}" if key.isdigit() else ""
        vk = ord(upper) if upper.isascii() and upper.isalnum() else 32 if key == " " else 0
        text = key
    event: dict[str, Any] = {"key": key, "code": code, "windowsVirtualKeyCode": vk, "nativeVirtualKeyCode": vk}
    if text:
        event.update(text=text, unmodifiedText=text)
    return event


class Renderer:
    """A running browser with one page. `await Renderer.launch(spec, ...)`; every method may raise RendererGone."""

    def __init__(self, spec: RendererSpec, proc: asyncio.subprocess.Process, cdp: CdpPipe, stderr: TailBuffer,
                 cgroup: TaskCgroup | None) -> None:
        self.spec, self.proc, self.cdp, self.stderr, self.cgroup = spec, proc, cdp, stderr, cgroup
        self.page = ""
        self.frame = ""
        self._drain: asyncio.Task[None] | None = None

    @classmethod
    async def launch(cls, spec: RendererSpec, *, chromium: str, cgroup: TaskCgroup | None = None,
                     timeout_s: float = 30.0) -> Renderer:
        to_child, from_parent = _high_pipe()  # chromium reads commands on fd 3
        to_parent, from_child = _high_pipe()  # and writes answers on fd 4
        argv = renderer_argv(spec, chromium, (to_child, from_child))
        try:
            proc = await asyncio.create_subprocess_exec(
                *(cgroup.wrap(argv) if cgroup else argv), stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, env=_env(), cwd="/",
                start_new_session=True, pass_fds=(to_child, from_child))
        except BaseException:
            for fd in (to_child, from_parent, to_parent, from_child):
                os.close(fd)
            raise
        os.close(to_child)  # the child's ends: ours must close, or EOF never comes when the browser exits
        os.close(from_child)
        cdp = CdpPipe(to_parent, from_parent)
        stderr = TailBuffer(8 << 10)
        self = cls(spec, proc, cdp, stderr, cgroup)
        self._drain = asyncio.create_task(self._read_stderr(), name="renderer-stderr")
        try:
            await cdp.start()
            await asyncio.wait_for(self._attach(timeout_s), timeout_s)
        except (TimeoutError, RendererGone, CdpError, OSError) as exc:
            tail = self.stderr.text().strip().splitlines()[-3:]
            await self.close()
            raise RendererGone(f"the renderer did not start: {exc}; stderr: {' | '.join(tail)}") from None
        except BaseException:
            await self.close()
            raise
        return self

    async def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        while chunk := await self.proc.stderr.read(65536):
            self.stderr.feed(chunk)

    async def _attach(self, timeout_s: float) -> None:
        targets = await self.cdp.call("Target.getTargets", limit_s=timeout_s)
        page = next(t for t in targets["targetInfos"] if t["type"] == "page")
        attached = await self.cdp.call("Target.attachToTarget", {"targetId": page["targetId"], "flatten": True},
                                       limit_s=timeout_s)
        self.page = attached["sessionId"]
        await self.call("Page.enable", limit_s=timeout_s)
        await self.call("Emulation.setDeviceMetricsOverride", {"width": self.spec.width, "height": self.spec.height,
                                                               "deviceScaleFactor": 1, "mobile": False},
                        limit_s=timeout_s)

    async def call(self, method: str, params: dict[str, Any] | None = None, *, limit_s: float) -> dict[str, Any]:
        """A command for the page; a dead process is RendererGone even if the pipe has not said so yet."""
        if self.proc.returncode is not None:
            self.cdp.fail(f"the renderer exited (status {self.proc.returncode})")
        return await self.cdp.call(method, params, session=self.page, limit_s=limit_s)

    # -- page ----------------------------------------------------------------------------------------------------
    async def load(self, html: str, *, limit_s: float) -> None:
        loaded = self.cdp.expect("Page.loadEventFired", session=self.page)
        url = "data:text/html;charset=utf-8;base64," + base64.b64encode(html.encode()).decode()
        nav = await self.call("Page.navigate", {"url": url}, limit_s=limit_s)
        if nav.get("errorText"):
            raise CdpError(f"the task page did not load: {nav['errorText']}")
        self.frame = str(nav["frameId"])
        try:
            await asyncio.wait_for(loaded, limit_s)
        except TimeoutError:
            self.cdp.fail(f"the task page did not load within {limit_s:g} s (renderer hung)")
            raise RendererGone(self.cdp.gone or "") from None

    async def screenshot(self, *, limit_s: float) -> bytes:
        """A PNG of the viewport, after the page has painted what the last input changed."""
        await self.call("Runtime.evaluate", {"expression": _TWO_FRAMES, "awaitPromise": True}, limit_s=limit_s)
        shot = await self.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": False},
                               limit_s=limit_s)
        return base64.b64decode(shot["data"])

    async def click(self, x: int, y: int, *, limit_s: float) -> None:
        base = {"x": x, "y": y, "button": "left", "clickCount": 1}
        await self.call("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y}, limit_s=limit_s)
        await self.call("Input.dispatchMouseEvent", {"type": "mousePressed", "buttons": 1, **base}, limit_s=limit_s)
        await self.call("Input.dispatchMouseEvent", {"type": "mouseReleased", "buttons": 0, **base}, limit_s=limit_s)

    async def type_text(self, text: str, *, limit_s: float) -> None:
        await self.call("Input.insertText", {"text": text}, limit_s=limit_s)

    async def key(self, key: str, *, limit_s: float) -> None:
        event = _key_event(key)
        await self.call("Input.dispatchKeyEvent", {"type": "keyDown", **event}, limit_s=limit_s)
        await self.call("Input.dispatchKeyEvent", {"type": "keyUp", **{k: v for k, v in event.items()
                                                                     if "ext" not in k}}, limit_s=limit_s)

    async def scroll(self, dx: int, dy: int, *, limit_s: float) -> None:
        x, y = self.spec.width // 2, self.spec.height // 2
        await self.call("Input.dispatchMouseEvent", {"type": "mouseWheel", "x": x, "y": y, "deltaX": dx,
                                                     "deltaY": dy}, limit_s=limit_s)

    async def evaluate_isolated(self, expression: str, *, limit_s: float) -> Any:
        """`expression`'s value (JSON) in a fresh isolated world of the page: it shares the page's DOM but none of
        its scripts' globals, so nothing the page's scripts did to `window` or prototypes changes what it reads."""
        tree = await self.call("Page.getFrameTree", limit_s=limit_s)
        frame = tree["frameTree"]["frame"]["id"]
        world = await self.call("Page.createIsolatedWorld", {"frameId": frame, "worldName": _CHECK_WORLD,
                                                             "grantUniveralAccess": False}, limit_s=limit_s)
        result = await self.call("Runtime.evaluate", {"expression": expression, "contextId":
                                                      world["executionContextId"], "returnByValue": True,
                                                      "awaitPromise": True}, limit_s=limit_s)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text", "exception")
            raise CdpError(f"the check threw: {str(text)[:300]}")
        return result["result"].get("value")

    # -- lifecycle -----------------------------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self.proc.returncode is None and self.cdp.gone is None

    async def close(self) -> None:
        """Kill the whole sandbox (bwrap leads the process group; its pid namespace takes every browser process)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(TimeoutError, ProcessLookupError):
            await asyncio.wait_for(self.proc.wait(), 10)
        await self.cdp.close()
        if self._drain is not None:
            self._drain.cancel()
            await asyncio.gather(self._drain, return_exceptions=True)
        if self.cgroup is not None:
            await self.cgroup.remove()


# rAF callbacks run before the next paint; the second one runs after it, so the frame holds the last input's effect.
_TWO_FRAMES = "new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => r(0))))"
