"""Real headless Chromium for tests: Debian's ``/usr/bin/chromium`` driven by Playwright.

No browser is ever downloaded (``playwright install`` is not used): Playwright launches the
system Chromium. A missing browser or library makes the tests FAIL with what to install.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import pytest_asyncio

from tests.rpc_helpers import wait_until

try:
    from playwright.async_api import Browser, BrowserContext, Page, async_playwright
except ImportError as exc:  # an error at collection: the tests fail, they are not skipped
    raise ImportError(
        "the browser tests need Playwright for Python: `.venv/bin/pip install playwright` "
        "(and never `playwright install`: they run Debian's chromium)"
    ) from exc
try:
    from PIL import Image
except ImportError as exc:
    raise ImportError("the browser tests need Pillow: `.venv/bin/pip install pillow`") from exc

CHROMIUM = Path(os.environ.get("PEERWIRE_CHROMIUM", "/usr/bin/chromium"))
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@contextlib.asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    """One headless Chromium for the duration of the block."""
    if not (CHROMIUM.is_file() and os.access(CHROMIUM, os.X_OK)):
        pytest.fail(
            f"no Chromium at {CHROMIUM}: install Debian's package (`apt-get install chromium`) "
            "or point PEERWIRE_CHROMIUM at a chromium binary",
            pytrace=False,
        )
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            yield browser
        finally:
            await browser.close()


@pytest_asyncio.fixture(name="browser", scope="module", loop_scope="module")
async def browser_fixture() -> AsyncIterator[Browser]:
    """One Chromium for a test module (import it there: ``from tests.browser import
    browser_fixture``)."""
    async with chromium() as browser:
        yield browser


@contextlib.asynccontextmanager
async def browser_context(browser: Browser, timeout_ms: float) -> AsyncIterator[BrowserContext]:
    """A fresh browser context (cookies, storage) whose waits default to ``timeout_ms``."""
    context = await browser.new_context()
    context.set_default_timeout(timeout_ms)
    try:
        yield context
    finally:
        await context.close()


def page_errors(page: Page) -> list[str]:
    """A list that collects the page's uncaught exceptions (a test asserts it stays empty)."""
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    return errors


def assert_not_blank(png: bytes) -> None:
    """A rendered page, not a blank one: many colours, and no colour covers nearly all."""
    image = Image.open(io.BytesIO(png)).convert("RGB")
    colours = image.getcolors(maxcolors=1 << 20) or []
    pixels = image.width * image.height
    most = max(count for count, _ in colours)
    assert len(colours) >= 16, f"screenshot has only {len(colours)} colours"
    assert most < 0.95 * pixels, f"one colour covers {most / pixels:.1%} of the screenshot"


async def eventually(check: Callable[[], object], what: str, timeout: float = 5.0) -> None:
    """Wait until ``check()`` is true (state that changes through the server's loop); an
    AssertionError naming ``what`` after ``timeout`` s (polled by the tests' one helper)."""
    try:
        await wait_until(check, timeout)
    except TimeoutError:
        raise AssertionError(f"not within {timeout} s: {what}") from None
