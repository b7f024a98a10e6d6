"""Headless Chromium (Debian's package) driven by Playwright, for the playground tests.

`browser_page(url, fake_mic=None)` opens a fresh page and collects its console
errors and uncaught exceptions; the browser and its profile are gone afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from playwright.async_api import Page, async_playwright

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
BASE_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--autoplay-policy=no-user-gesture-required",
    "--use-fake-ui-for-media-stream",
]
PAGE_TIMEOUT_MS = 120_000
"""Longest a page action or wait may take (the default assistant answers in seconds on 2 busy cores)."""


@dataclass
class BrowserPage:
    page: Page
    errors: list[str] = field(default_factory=list)
    """Console errors and uncaught exceptions."""
    refused: list[tuple[int, str]] = field(default_factory=list)
    """(status, path) of every answer >= 400 the page got."""


COUNT_AUDIO_CONTEXTS = """(() => {
  const Base = window.AudioContext;
  window.__audioContexts = [];
  window.AudioContext = class extends Base {
    constructor(...args) { super(...args); window.__audioContexts.push(this); }
  };
})();"""
"""Every AudioContext the page makes, in `window.__audioContexts` (a page holds only a few at once)."""


@contextlib.asynccontextmanager
async def browser_page(url: str, fake_mic: Path | None = None, api_key: str | None = None,
                       enforce_csp: bool = False, host_alias: str | None = None) -> AsyncIterator[BrowserPage]:
    """`api_key`: put in the tab's session storage before the page loads (as if entered earlier).
    `enforce_csp`: the page's Content-Security-Policy holds, as in a user's browser (what it refuses is a
    console error); else it is bypassed so that `wait_for_function` may evaluate strings.
    `host_alias`: the page is opened by this host name (resolved to the url's host by Chromium alone), as a
    user opens a server on another machine: plain http there is not a secure page (no microphone)."""
    args = list(BASE_ARGS)
    if host_alias is not None:
        parts = urlsplit(url)
        args.append(f"--host-resolver-rules=MAP {host_alias} {parts.hostname}")
        url = parts._replace(netloc=f"{host_alias}:{parts.port}").geturl()
    if fake_mic is not None:
        args += ["--use-fake-device-for-media-stream", f"--use-file-for-fake-audio-capture={fake_mic}"]
    with tempfile.TemporaryDirectory(prefix="omni-chromium-") as home:
        profile, runtime = Path(home) / "profile", Path(home) / "runtime"
        runtime.mkdir(mode=0o700)
        # Chromium's audio client makes a /tmp/pulse-* folder it never removes unless it has a
        # runtime directory of its own: this one goes with the profile.
        env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
        async with async_playwright() as pw:
            ctx = await pw.chromium.launch_persistent_context(
                profile, executable_path=CHROMIUM, headless=True, args=args, env=env,
                permissions=["microphone"], bypass_csp=not enforce_csp,
            )
            try:
                await ctx.add_init_script(COUNT_AUDIO_CONTEXTS)
                if api_key is not None:
                    await ctx.add_init_script(f"sessionStorage.setItem('omni-actors.api-key', {json.dumps(api_key)})")
                page = ctx.pages[0] if ctx.pages else await ctx.new_page()
                page.set_default_timeout(PAGE_TIMEOUT_MS)
                out = BrowserPage(page)
                page.on("console", lambda msg: out.errors.append(msg.text) if msg.type == "error" else None)
                page.on("pageerror", lambda exc: out.errors.append(f"uncaught: {exc}"))
                page.on("response", lambda r: out.refused.append((r.status, urlsplit(r.url).path))
                        if r.status >= 400 else None)
                await page.goto(url)
                yield out
            finally:
                await ctx.close()
