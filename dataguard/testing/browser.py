"""Drive a real headless Chromium over the DevTools protocol, to check and screenshot reports.

Uses ``--remote-debugging-pipe`` (NUL-delimited JSON on file descriptors 3 and 4), so it
needs no TCP port (nothing for parallel test runs to collide on) and no third-party
package. Used by the browser tests, the report benchmark and the README screenshot.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM = os.environ.get("DATAGUARD_CHROMIUM", "/usr/bin/chromium")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", "--no-default-browser-check", "--disable-extensions",
         "--disable-sync", "--disable-default-apps", "--mute-audio", "--hide-scrollbars",
         "--disable-dev-shm-usage", "--remote-debugging-pipe")

STARTS = 2  # a hung start is retried once with a fresh process


class BrowserError(RuntimeError):
    """Chromium could not be started, or a DevTools command failed or timed out."""


def chromium_path() -> str | None:
    """The Chromium executable to use, or None when none is installed."""
    if os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK):
        return CHROMIUM
    return shutil.which("chromium")


@dataclass
class PageLoad:
    """What happened while a page loaded: console output, errors and network requests."""

    url: str
    seconds: float
    console: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    blocked: dict[str, str] = field(default_factory=dict)  # url -> why the browser refused it (e.g. "csp")
    _ids: dict[str, str] = field(default_factory=dict, repr=False)


class Chromium:
    """One headless Chromium with one page (tab). Use as a context manager."""

    def __init__(self, width: int = 1280, height: int = 900, timeout: float = 30.0,
                 executable: str | None = None) -> None:
        exe = executable or chromium_path()
        if not exe:
            raise BrowserError("chromium not found (run scripts/install_chromium.sh)")
        self.timeout = timeout
        for attempt in range(STARTS):
            self._launch(exe, width, height)
            try:
                target = self.send("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
                break
            except BrowserError:
                self._kill()  # a start that hangs (seen once in CI): a fresh process and profile
                if attempt == STARTS - 1:
                    raise
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True},
                                 session=False)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable")
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})

    def _launch(self, exe: str, width: int, height: int) -> None:
        """Start one Chromium on a fresh profile, its DevTools pipe on fds 3 and 4."""
        self._profile = tempfile.mkdtemp(prefix="dataguard-chromium-")
        to_child_r, self._to_child_w = os.pipe()
        self._from_child_r, from_child_w = os.pipe()

        def wire() -> None:  # in the child: the pipes become fds 3 (commands) and 4 (replies)
            high_r = fcntl.fcntl(to_child_r, fcntl.F_DUPFD, 10)  # step aside first: either may be 3 or 4
            high_w = fcntl.fcntl(from_child_w, fcntl.F_DUPFD, 10)
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)

        self._proc = subprocess.Popen(
            [exe, *FLAGS, f"--user-data-dir={self._profile}", f"--window-size={width},{height}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=wire, close_fds=False)  # other fds are non-inheritable (PEP 446)
        os.close(to_child_r)
        os.close(from_child_w)
        self._next_id = 0
        self._replies: dict[int, dict] = {}
        self._events: queue.Queue[dict] = queue.Queue()
        self._cond = threading.Condition()
        # the reader holds this process's pipe and reply table: a killed start's reader never
        # touches the next start's
        self._reader = threading.Thread(target=self._read_loop, daemon=True,
                                        args=(self._from_child_r, self._replies, self._cond, self._events))
        self._reader.start()
        self.session: str | None = None

    def _kill(self) -> None:
        self._proc.kill()
        self._proc.wait()
        self._reader.join(timeout=5)  # it sees the pipe close and ends
        self._release()

    def _release(self) -> None:
        """Close this start's pipe ends and remove its profile folder (ours: made by mkdtemp)."""
        for fd in (self._to_child_w, self._from_child_r):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self._profile, ignore_errors=True)

    def _read_loop(self, fd: int, replies: dict[int, dict], cond: threading.Condition,
                   events: queue.Queue[dict]) -> None:
        buf = b""
        while True:
            try:
                chunk = os.read(fd, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                with cond:
                    replies[-1] = {"error": {"message": "chromium closed the pipe"}}
                    cond.notify_all()
                return
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                msg = json.loads(raw)
                if "id" in msg:
                    with cond:
                        replies[msg["id"]] = msg
                        cond.notify_all()
                else:
                    events.put(msg)

    def send(self, method: str, params: dict | None = None, session: bool = True) -> dict:
        """Send one DevTools command and wait for its result."""
        self._next_id += 1
        mid = self._next_id
        msg: dict[str, Any] = {"id": mid, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self._to_child_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        with self._cond:
            while mid not in self._replies and -1 not in self._replies:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BrowserError(f"timeout waiting for {method}")
                self._cond.wait(left)
            reply = self._replies.pop(mid, None) or self._replies[-1]
        if "error" in reply:
            raise BrowserError(f"{method}: {reply['error'].get('message')}")
        return reply.get("result", {})

    def _drain(self, load: PageLoad | None, until: str | None = None, timeout: float = 0.0) -> bool:
        """Collect queued events into ``load``; optionally wait for an event named ``until``."""
        deadline = time.monotonic() + timeout
        seen = False
        while True:
            left = deadline - time.monotonic()
            try:
                ev = self._events.get(timeout=max(left, 0.0)) if until and not seen else self._events.get_nowait()
            except queue.Empty:
                return seen
            method, p = ev.get("method"), ev.get("params", {})
            if until and method == until:
                seen = True
            if load is None:
                continue
            if method == "Network.requestWillBeSent":
                load.requests.append(p.get("request", {}).get("url", ""))
                load._ids[p.get("requestId", "")] = load.requests[-1]
            elif method == "Network.loadingFailed" and p.get("blockedReason"):
                load.blocked[load._ids.get(p.get("requestId", ""), "?")] = p["blockedReason"]
            elif method == "Runtime.consoleAPICalled":
                text = " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", []))
                load.console.append({"level": p.get("type"), "text": text})
                if p.get("type") in ("error", "assert"):
                    load.errors.append(f"console.{p.get('type')}: {text}")
            elif method == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails", {})
                load.errors.append("exception: " + str(d.get("exception", {}).get("description") or d.get("text")))
            elif method == "Log.entryAdded":
                e = p.get("entry", {})
                load.console.append({"level": e.get("level"), "text": e.get("text"), "source": e.get("source")})
                if e.get("level") == "error":
                    load.errors.append(f"log[{e.get('source')}]: {e.get('text')}")

    def load(self, path_or_url: str | Path, settle: float = 0.3) -> PageLoad:
        """Navigate and wait for the load event; return console, errors and requests seen."""
        url = str(path_or_url)
        if "://" not in url and not url.startswith(("about:", "data:")):
            url = Path(url).resolve().as_uri()
        self._drain(None)
        t0 = time.monotonic()
        result = PageLoad(url=url, seconds=0.0)
        nav = self.send("Page.navigate", {"url": url})
        if nav.get("errorText"):
            raise BrowserError(f"navigation failed: {nav['errorText']}")
        if not self._drain(result, until="Page.loadEventFired", timeout=self.timeout):
            raise BrowserError(f"no load event for {url}")
        result.seconds = time.monotonic() - t0
        time.sleep(settle)
        self._drain(result)
        return result

    def evaluate(self, expression: str) -> Any:
        """Evaluate JavaScript in the page and return its JSON value."""
        r = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in r:
            raise BrowserError(f"evaluate failed: {r['exceptionDetails'].get('text')}")
        return r.get("result", {}).get("value")

    def screenshot(self, path: str | Path, full_page: bool = False, max_height: int = 12000,
                   clip_height: int | None = None) -> Path:
        """Save a PNG of the viewport, the first ``clip_height`` pixels, or the full page."""
        params: dict[str, Any] = {"format": "png"}
        if full_page or clip_height:
            size = self.send("Page.getLayoutMetrics")["cssContentSize"]
            h = min(int(size["height"]), max_height) if full_page else int(clip_height or 0)
            params.update({"captureBeyondViewport": True,
                           "clip": {"x": 0, "y": 0, "width": size["width"], "height": h, "scale": 1}})
        data = self.send("Page.captureScreenshot", params)["data"]
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(base64.b64decode(data))
        return out

    def close(self) -> None:
        try:
            self.send("Browser.close", session=False)
        except (BrowserError, OSError):
            pass
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._release()

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
