"""Headless Chromium driven over the Chrome DevTools protocol, with the standard
library only.

The Temporal Web UI is a single-page app that keeps polling the server, so
``chromium --dump-dom`` either returns the empty shell or never settles. A test
needs to wait for a condition in the page (poll ``document.body.innerText`` with a
deadline) and click through tabs, which takes the DevTools protocol: a WebSocket
with JSON commands. This module is a minimal RFC 6455 client (text frames,
client-side masking, ping/pong) and a session on one page target; no Playwright,
which would download its own browser.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import socket
import struct
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tests.e2e.procs import start_process, stop_process

__all__ = ["Browser", "CdpError", "chromium_binary"]

_PAGE_TEXT = """(() => {
  const parts = [document.body ? document.body.innerText : ''];
  for (const f of document.querySelectorAll('iframe')) {
    try {
      const body = f.contentDocument && f.contentDocument.body;
      if (body) parts.push(body.innerText);
    } catch (e) { /* another origin */ }
  }
  return parts.join('\\n');
})()"""
_OP_TEXT, _OP_CLOSE, _OP_PING, _OP_PONG, _OP_CONT = 0x1, 0x8, 0x9, 0xA, 0x0


class CdpError(RuntimeError):
    """The browser refused a command, closed the connection or did not start."""


def chromium_binary() -> str | None:
    """``FORGE_CHROMIUM``, else Debian's ``/usr/bin/chromium``, else one on PATH."""
    for candidate in (os.environ.get("FORGE_CHROMIUM"), "/usr/bin/chromium"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("chromium") or shutil.which("chromium-browser")


class _WebSocket:
    def __init__(self, url: str, timeout: float) -> None:
        parts = urlsplit(url)
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        self._sock = socket.create_connection((host, port), timeout=timeout)
        self._in = self._sock.makefile("rb")
        key = base64.b64encode(os.urandom(16)).decode()
        self._sock.sendall(
            (
                f"GET {parts.path or '/'} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        status = self._in.readline()
        if b" 101 " not in status:
            raise CdpError(f"WebSocket handshake refused: {status!r}")
        while self._in.readline() not in (b"\r\n", b""):
            pass

    def send(self, text: str) -> None:
        self._frame(_OP_TEXT, text.encode())

    def _frame(self, opcode: int, data: bytes) -> None:
        n = len(data)
        if n < 126:
            head = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
        elif n < 1 << 16:
            head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
        else:
            head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
        mask = os.urandom(4)
        body = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
        self._sock.sendall(head + mask + body)

    def _read(self, n: int) -> bytes:
        data = self._in.read(n)
        if data is None or len(data) < n:
            raise CdpError("the browser closed the DevTools connection")
        return data

    def recv(self) -> str:
        chunks: list[bytes] = []
        while True:
            b0, b1 = self._read(2)
            fin, opcode, n = b0 & 0x80, b0 & 0x0F, b1 & 0x7F
            if n == 126:
                (n,) = struct.unpack("!H", self._read(2))
            elif n == 127:
                (n,) = struct.unpack("!Q", self._read(8))
            mask = self._read(4) if b1 & 0x80 else b""
            data = self._read(n)
            if mask:
                data = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
            if opcode == _OP_PING:
                self._frame(_OP_PONG, data)
                continue
            if opcode == _OP_CLOSE:
                raise CdpError("the browser closed the DevTools connection")
            if opcode in (_OP_TEXT, _OP_CONT):
                chunks.append(data)
                if fin:
                    return b"".join(chunks).decode()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._frame(_OP_CLOSE, b"")
        self._in.close()
        self._sock.close()


class Browser:
    """One headless Chromium process and a DevTools session on its page.

    ``with Browser(path, profile_dir) as b: b.goto(url); b.wait_for_text("x")``.
    """

    def __init__(
        self, binary: str, profile: Path, *, width: int = 1400, height: int = 1000
    ) -> None:
        self.profile = profile
        profile.mkdir(parents=True, exist_ok=True)
        # in a session of its own: closing it kills its zygote and renderers too
        self.proc = start_process(
            [
                binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", "--no-default-browser-check", "--disable-extensions",
                "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1",
                f"--user-data-dir={profile}", f"--window-size={width},{height}", "about:blank",
            ],
            profile / "chromium.log",
        )  # fmt: skip
        self._next_id = 0
        self.console: list[str] = []
        try:
            self._ws = _WebSocket(self._page_target(timeout=60), timeout=60)
            self.call("Page.enable")
            self.call("Runtime.enable")
        except BaseException:
            self.close()
            raise

    def _page_target(self, timeout: float) -> str:
        """Chromium writes its DevTools port to DevToolsActivePort once it listens."""
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise CdpError(f"chromium exited with {self.proc.returncode}: {self.log_tail()}")
            with contextlib.suppress(OSError, ValueError, IndexError):
                port = int(port_file.read_text().split()[0])
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as r:
                    targets = json.load(r)
                pages = [t for t in targets if t.get("type") == "page"]
                if pages:
                    return str(pages[0]["webSocketDebuggerUrl"])
            time.sleep(0.1)  # poll interval while the browser starts
        raise CdpError(f"chromium did not open DevTools in {timeout:g} s: {self.log_tail()}")

    def log_tail(self) -> str:
        try:
            return (self.profile / "chromium.log").read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self._next_id += 1
        ident = self._next_id
        self._ws.send(json.dumps({"id": ident, "method": method, "params": params or {}}))
        while True:
            message = json.loads(self._ws.recv())
            if message.get("method") == "Runtime.consoleAPICalled":
                args = message["params"].get("args", [])
                words = (str(a.get("value", a.get("description"))) for a in args)
                self.console.append(" ".join(words))
            if message.get("id") != ident:
                continue  # an event
            if "error" in message:
                raise CdpError(f"{method}: {message['error']}")
            result: dict[str, Any] = message.get("result", {})
            return result

    def goto(self, url: str) -> None:
        self.call("Page.navigate", {"url": url})

    def evaluate(self, expression: str) -> Any:
        reply = self.call(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in reply:
            raise CdpError(f"{expression[:80]}: {reply['exceptionDetails'].get('text')}")
        return reply.get("result", {}).get("value")

    def text(self) -> str:
        """The page's visible text, then that of its same-origin frames (the UI
        renders markdown, such as a workflow's current details, in an iframe)."""
        return str(self.evaluate(_PAGE_TEXT) or "")

    def wait_for(self, expression: str, *, timeout: float = 30.0, what: str = "") -> Any:
        """Poll a JS expression until it is truthy; its value, or AssertionError with
        the page text after ``timeout``. The value crosses as JSON, so an expression
        that yields a DOM element must be turned into a boolean (``!!(...)``): an
        element arrives as ``{}``, which is falsy here."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{what or expression} not seen in {timeout:g} s; page text:\n"
                    + self.text()[:3000]
                )
            time.sleep(0.2)  # poll interval for the page's own fetches

    def wait_for_text(self, needle: str, *, timeout: float = 30.0) -> str:
        """The page text once it contains ``needle`` (that very text: a page still
        rendering may have changed by the next read)."""
        return self.wait_until(lambda text: needle in text, timeout=timeout, what=repr(needle))

    def wait_for_match(self, pattern: str, *, timeout: float = 30.0) -> str:
        """The page text once ``pattern`` (a Python regex) matches in it."""
        regex = re.compile(pattern)
        return self.wait_until(
            lambda text: regex.search(text) is not None, timeout=timeout, what=f"/{pattern}/"
        )

    def wait_until(
        self, pred: Callable[[str], bool], *, timeout: float = 30.0, what: str = "condition"
    ) -> str:
        """Poll the page text until ``pred`` holds for it; that text (the one the
        condition held for, so assertions on it see what the wait saw), or
        AssertionError with the last text after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.text()
            if pred(text):
                return text
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} not seen in {timeout:g} s; page text:\n{text[:3000]}")
            time.sleep(0.2)  # poll interval for the page's own fetches

    def click_text(self, text: str, selector: str = "a, button, [role=tab]") -> None:
        """Click the first element matching ``selector`` whose first line of text is
        ``text`` (a tab's label, without the count under it)."""
        found = self.evaluate(
            f"""(() => {{
              const want = {json.dumps(text)};
              for (const el of document.querySelectorAll({json.dumps(selector)})) {{
                const first = (el.innerText || '').trim().split('\\n')[0].trim();
                if (first === want) {{ el.click(); return true; }}
              }}
              return false;
            }})()"""
        )
        if not found:
            page = self.text()[:3000]
            raise AssertionError(f"no {selector} with text {text!r}; page text:\n{page}")

    def screenshot(self, path: Path) -> Path:
        params = {"format": "png", "captureBeyondViewport": True}
        reply = self.call("Page.captureScreenshot", params)
        path.write_bytes(base64.b64decode(reply["data"]))
        return path

    def close(self) -> None:
        ws = getattr(self, "_ws", None)
        if ws is not None:
            ws.close()
        stop_process(self.proc, timeout=10)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
