"""The playground's video panel in real headless Chromium against `omni-run` serving a tiny Wan2.2 folder.

The page creates a job, then waits on the server for each next progress value
(`progress_past`, no timer), and plays the finished MP4.
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlparse

import pytest

from tests.api.model_server import serve_tiny
from tests.browser_support import browser_page

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
JOB_TIMEOUT_MS = 180_000


@pytest.fixture(scope="module")
def wan(tmp_path_factory):
    yield from serve_tiny(tmp_path_factory.mktemp("wan"), "wan2_2")


async def test_a_video_job_shows_its_progress_step_by_step_then_plays(wan, tmp_path) -> None:
    waits: list[int] = []
    async with browser_page(wan.url + "/") as bp:
        page = bp.page

        def seen(request) -> None:
            query = parse_qs(urlparse(request.url).query)
            if request.method == "GET" and "progress_past" in query:
                waits.append(int(query["progress_past"][0]))

        page.on("request", seen)
        await page.locator("body[data-ready=true]").wait_for()
        assert "Videos" in await page.locator("#tabs button").all_inner_texts()
        await page.get_by_test_id("tab-videos").click()
        await page.get_by_test_id("video-prompt").fill("a boat at sea")
        await page.get_by_test_id("video-size").fill("32x32")
        await page.get_by_test_id("video-seconds").fill("0.25")
        await page.get_by_test_id("video-steps").fill("12")
        await page.get_by_test_id("video-button").click()
        await page.wait_for_function("!document.getElementById('video-result').hidden", timeout=JOB_TIMEOUT_MS)
        assert await page.get_by_test_id("video-status").inner_text() == "completed"
        assert await page.evaluate("document.getElementById('video-progress').value") == 100
        assert (await page.get_by_test_id("video-result").get_attribute("src") or "").startswith("blob:")
        await page.screenshot(path=str(tmp_path / "video-done.png"))
        assert bp.errors == [] and bp.refused == [], (bp.errors, bp.refused)
    assert waits == sorted(waits), waits  # each wait was for the job's next value
    assert any(0 < w < 100 for w in waits), waits  # the bar moved while the job ran
    done = wan.client().videos.list().data
    assert [v.status for v in done] == ["completed"]
