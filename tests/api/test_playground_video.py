"""The playground's video panel in real headless Chromium against `omni-run` serving a tiny Wan2.2 folder.

The page creates a job, then waits on the server for each next progress value
(`progress_past`, no timer), and plays the finished MP4. A key that stops working mid-job (changed,
revoked) is asked for again, and the page then follows the same job on to its video: the job ran on
on the server, and the page had not forgotten it, not even across a reload (the tab's session storage).
A reload before the create's answer came finds the job it made; a key refused on another panel, then entered
again, leaves the job followed (it was deleted).
"""

from __future__ import annotations

import asyncio
from urllib.parse import parse_qs, urlparse

import openai
import pytest

from omni_actors.models.tiny import make_tiny
from tests.api.conftest import API_KEY
from tests.api.test_videos_probe3 import DeployRun
from tests.browser_support import browser_page

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
JOB_TIMEOUT_MS = 180_000
LONG_STEPS = 600
"""Denoising steps of the job whose key is revoked twice mid-way, a reload between (seconds at 32x32 on two cores)."""
STORED_JOB = "sessionStorage.getItem('omni-actors.video-job')"
FAST_STEPS = 4
CREATE_TIMEOUT_S = 30
"""Longest a create (or a job's start, the engine free) may take to be answered."""
FOLLOW_TIMEOUT_MS = 30_000
"""Longest the page may take to find a job and follow it to its video (a few steps at 32x32)."""


@pytest.fixture(scope="module")
def wan(tmp_path_factory):
    """`omni-run --model` on a tiny Wan2.2 folder, with an API key (a deploy file's `server.api_keys`)."""
    tmp = tmp_path_factory.mktemp("wan")
    run = DeployRun(tmp, make_tiny("wan2_2", tmp / "tiny-wan", seed=0), tmp / "data", {"api_keys": [API_KEY]})
    try:
        run.wait_ready()
        yield run
    finally:
        run.stop()


def _is_create(response) -> bool:
    return response.request.method == "POST" and response.url.endswith("/v1/videos")


async def _fill(page, steps: int) -> None:
    await page.get_by_test_id("video-prompt").fill("a boat at sea")
    await page.get_by_test_id("video-size").fill("32x32")
    await page.get_by_test_id("video-seconds").fill("0.25")
    await page.get_by_test_id("video-steps").fill(str(steps))


async def test_a_video_job_shows_its_progress_step_by_step_then_plays(wan, tmp_path) -> None:
    waits: list[int] = []
    client = openai.OpenAI(base_url=f"{wan.url}/v1", api_key=API_KEY, max_retries=0)
    async with browser_page(wan.url + "/", api_key=API_KEY) as bp:
        page = bp.page

        def seen(request) -> None:
            query = parse_qs(urlparse(request.url).query)
            if request.method == "GET" and "progress_past" in query:
                waits.append(int(query["progress_past"][0]))

        page.on("request", seen)
        await page.locator("body[data-ready=true]").wait_for()
        assert "Videos" in await page.locator("#tabs button").all_inner_texts()
        await page.get_by_test_id("tab-videos").click()
        await _fill(page, 12)
        await page.get_by_test_id("video-button").click()
        await page.wait_for_function("!document.getElementById('video-result').hidden", timeout=JOB_TIMEOUT_MS)
        assert await page.get_by_test_id("video-status").inner_text() == "completed"
        assert await page.evaluate("document.getElementById('video-progress').value") == 100
        assert (await page.get_by_test_id("video-result").get_attribute("src") or "").startswith("blob:")
        await page.screenshot(path=str(tmp_path / "video-done.png"))
        assert bp.errors == [] and bp.refused == [], (bp.errors, bp.refused)
        assert waits == sorted(waits), waits  # each wait was for the job's next value
        assert any(0 < w < 100 for w in waits), waits  # the bar moved while the job ran
        assert [v.status for v in client.videos.list().data] == ["completed"]
        assert await page.evaluate(STORED_JOB) is None  # (done: nothing for a reload to follow)

        # The key stops working mid-job: its next progress read is refused (401) and the key asked for.
        # The page is reloaded then: it finds the job (its id and model kept in the tab) and follows it on.
        # The key stops working again: once it is entered, the page follows the same job (no new one) on to
        # its video.
        await _fill(page, LONG_STEPS)
        async with page.expect_response(_is_create) as created:
            await page.get_by_test_id("video-button").click()
        job = await (await created.value).json()
        await page.wait_for_function("document.getElementById('video-progress').value > 0", timeout=JOB_TIMEOUT_MS)
        await page.evaluate("window.__playground.key = 'revoked'")
        await page.get_by_test_id("key-form").wait_for()
        assert job["id"] in await page.get_by_test_id("video-status").inner_text()  # said to run on, by its id
        stored = await page.evaluate(f"[JSON.parse({STORED_JOB}), window.__playground.model.id]")
        assert stored[0] == {"id": job["id"], "model": stored[1]}, stored  # (what a reload follows)
        await page.reload()  # (the key in the tab's storage works: browser_page put it there)
        await page.locator("body[data-ready=true]").wait_for()
        await page.wait_for_function("document.getElementById('video-status').textContent === 'in_progress'"
                                     " && document.getElementById('video-progress').value > 0",
                                     timeout=JOB_TIMEOUT_MS)
        assert await page.get_by_test_id("video-stop").is_visible()  # followed, so it can be stopped
        await page.evaluate("window.__playground.key = 'revoked'")
        await page.get_by_test_id("key-form").wait_for()
        assert job["id"] in await page.get_by_test_id("video-status").inner_text()
        assert "not accepted" in await page.get_by_test_id("error").inner_text()
        await page.keyboard.type(API_KEY)
        await page.keyboard.press("Enter")
        await page.wait_for_function("!document.getElementById('video-result').hidden", timeout=JOB_TIMEOUT_MS)
        assert await page.get_by_test_id("video-status").inner_text() == "completed"
        assert await page.get_by_test_id("error").is_hidden()
        assert bp.refused == [(401, f"/v1/videos/{job['id']}")] * 2, bp.refused
        assert [e for e in bp.errors if "status of 401" not in e] == [], bp.errors
        assert await page.evaluate(STORED_JOB) is None
    statuses = {v.id: v.status for v in client.videos.list().data}
    assert statuses[job["id"]] == "completed" and list(statuses.values()) == ["completed"] * 2, statuses


async def test_a_reload_while_the_create_is_on_its_way_follows_the_job_it_made(wan, tmp_path) -> None:
    """The job was made on the server, but the page, reloaded before the create's answer came, had no id to
    follow: it showed nothing and the job ran on unseen. The page keeps the create it sent (its model and
    prompt) from the moment it sends it, and a reload finds the job in GET /v1/videos."""
    client = openai.OpenAI(base_url=f"{wan.url}/v1", api_key=API_KEY, max_retries=0)
    before = {v.id for v in client.videos.list().data}
    async with browser_page(wan.url + "/", api_key=API_KEY) as bp:
        page = bp.page
        await page.locator("body[data-ready=true]").wait_for()
        await page.get_by_test_id("tab-videos").click()
        await _fill(page, FAST_STEPS)
        answers: asyncio.Queue = asyncio.Queue()

        async def hold(route) -> None:  # the create reaches the server; its answer never reaches the page
            if route.request.method != "POST":
                await route.continue_()
                return
            answers.put_nowait(await route.fetch())

        await page.route("**/v1/videos", hold)
        await page.get_by_test_id("video-button").click()
        async with asyncio.timeout(CREATE_TIMEOUT_S):
            job = await (await answers.get()).json()
        assert job["id"] not in before
        # (the route stays: a handler removed while its route is held sends the request again, a second job)
        await page.reload()
        await page.locator("body[data-ready=true]").wait_for()
        await page.wait_for_function("document.getElementById('video-status').textContent === 'completed'",
                                     timeout=FOLLOW_TIMEOUT_MS)  # (it was left "")
        await page.wait_for_function("!document.getElementById('video-result').hidden", timeout=FOLLOW_TIMEOUT_MS)
        assert await page.evaluate(STORED_JOB) is None  # (done: nothing for the next reload to follow)
        assert bp.errors == [] and bp.refused == [], (bp.errors, bp.refused)
    made = [v for v in client.videos.list().data if v.id not in before]
    assert [(v.id, v.status) for v in made] == [(job["id"], "completed")]  # the one it sent: none made again
    assert client.videos.delete(job["id"]).deleted


async def test_a_key_refused_on_another_panel_leaves_the_video_job_followed(wan, tmp_path) -> None:
    """A 401 on the Pipeline tab asked for the key; once it was entered, the page read its models again as if
    switched to another one, and the Videos panel deleted the job it followed (the user's job, running fine).
    The job is followed on instead. It waits behind another job (the engine busy with it) so that no progress
    read of its own meets the refused key first."""
    client = openai.OpenAI(base_url=f"{wan.url}/v1", api_key=API_KEY, max_retries=0)
    blocker = client.videos.create(model=wan.model, prompt="the engine kept busy", size="16x16", seconds="0.25",
                                   extra_body={"num_frames": 1, "num_inference_steps": 1000})
    client.videos.retrieve(blocker.id, extra_query={"wait_s": CREATE_TIMEOUT_S, "past": "queued"})
    deletes: list[str] = []
    async with browser_page(wan.url + "/", api_key=API_KEY) as bp:
        page = bp.page
        page.on("request", lambda r: deletes.append(r.url) if r.method == "DELETE" else None)
        await page.locator("body[data-ready=true]").wait_for()
        await page.evaluate("document.addEventListener('model-changed', () => { window.__switches += 1; });"
                            "window.__switches = 0")
        await page.get_by_test_id("tab-videos").click()
        await _fill(page, FAST_STEPS)
        async with page.expect_response(_is_create) as created:
            await page.get_by_test_id("video-button").click()
        job = await (await created.value).json()
        await page.wait_for_function("document.getElementById('video-status').textContent === 'queued'")
        await page.evaluate("window.__playground.key = 'revoked'")
        await page.get_by_test_id("tab-pipeline").click()  # its status read is refused: the key is asked for
        await page.get_by_test_id("key-form").wait_for()
        await page.keyboard.type(API_KEY)
        await page.keyboard.press("Enter")
        await page.wait_for_function("window.__switches === 1"
                                     " && document.getElementById('video-status').textContent === 'queued'"
                                     " && !document.getElementById('video-stop').hidden",
                                     timeout=FOLLOW_TIMEOUT_MS)  # (it was deleted: "", no Stop)
        assert deletes == []
        assert client.videos.retrieve(job["id"]).status == "queued"
        assert await page.evaluate(f"JSON.parse({STORED_JOB}).id") == job["id"]
        assert client.videos.delete(blocker.id).deleted  # the engine takes the page's job now
        await page.get_by_test_id("tab-videos").click()
        await page.wait_for_function("!document.getElementById('video-result').hidden", timeout=FOLLOW_TIMEOUT_MS)
        assert await page.get_by_test_id("video-status").inner_text() == "completed"
        assert bp.refused == [(401, "/v1/status")], bp.refused
        assert [e for e in bp.errors if "status of 401" not in e] == [], bp.errors
        await page.screenshot(path=str(tmp_path / "video-after-key.png"))
    assert client.videos.delete(job["id"]).deleted
