// The videos panel: a /v1/videos job made, followed a progress value at a time (the server answers when the
// job moves on), then its MP4 in a player; a Stop or a model switch deletes the job on the server, and a key
// refused mid-job (401) has it followed again once a key works. The job followed is kept in the tab's session
// storage from the moment its create is sent, so a reload follows it on (a job left waiting on a key, or one
// whose create had not been answered yet, included). A key entered again (after a 401 on any panel) reloads
// the page's models but is no model switch: the job is followed on, never deleted.
import { Work, ask } from "./work.js";

const $ = (id) => document.getElementById(id);
const VIDEO_WAIT_S = 30; // each status read waits on the server for the job's next progress (no timer)
// { id, model } of the job followed, until it ends or is deleted; { model, prompt, at } (no id yet) while its
// create is on its way: a reload then finds the job in GET /v1/videos (its model and prompt, made since `at`).
const JOB_STORE = "omni-actors.video-job";
const FIND_LIMIT = 20;  // the newest jobs a reload looks through for the one its unanswered create made
const CLOCK_SLACK_S = 300;  // how far the server's clock may be behind the page's when a job's time is compared
const UNFINISHED = new Set(["queued", "in_progress"]);

function storedJob() {
  try { return JSON.parse(sessionStorage.getItem(JOB_STORE)) || null; } catch { return null; }
}
const keepJob = (id, model) => sessionStorage.setItem(JOB_STORE, JSON.stringify({ id, model }));
const keepCreate = (model, prompt) => sessionStorage.setItem(JOB_STORE, JSON.stringify(
  { model, prompt, at: Math.floor(Date.now() / 1000) }));
// (a job's id forgets it; null forgets a create not answered yet)
const forgetJob = (id) => { if ((storedJob()?.id ?? null) === id) sessionStorage.removeItem(JOB_STORE); };

export function bindVideos({ api, state, showError }) {
  // A stopped job is deleted on the server (DELETE aborts it between denoising steps, and answers once it
  // has ended); a Stop says so when it has. A model switch deletes it too: the page can no longer show it.
  async function cancelJob(created, work) {
    const say = (text) => { if (work.stopped && work.latest) $("video-status").textContent = text; };
    say("stopping…");
    let job;
    try {
      job = await created;
    } catch {
      return say("stopped");  // no job was made
    }
    try {
      await api(`/v1/videos/${job.id}`, { method: "DELETE", signal: null });
      say("stopped");
    } catch (err) {
      say(`stopped here; the server did not confirm it ended job ${job.id}: ${err.message}`);
    }
  }

  // The page's model ends a job's following without the user's Stop: a model switch, a key entered again (the
  // page's models read afresh, the same one shown again: app.js), or a progress read refused (401: the key
  // changed or was revoked mid-job; the job runs on on the server and the page comes back to its model once a
  // key works). The job is carried to the next model-changed: followed on if that shows its model, deleted
  // if another. A reload finds the job in session storage: shown on its model, it is read afresh (or, its
  // create unanswered, found in the list) and followed on; the page loaded on another model leaves it there
  // until a switch to its model (or away from it) says what to do with it.
  let carried = null;  // { created: the promise of the job, model }
  let shownModel = null;  // the model shown before this switch (null: the page has just loaded)
  document.addEventListener("model-changed", () => {  // the last model's video is not this one's
    $("video-status").textContent = "";
    $("video-progress").value = 0;
    $("video-result").hidden = true;
    $("video-result").removeAttribute("src");
    const was = shownModel;
    shownModel = state.model.id;
    const lost = carried;
    carried = null;
    const kept = lost ? null : storedJob();
    if (lost?.model === state.model.id) follow(lost.created);
    else if (lost) dropJob(lost);
    else if (kept?.model === state.model.id) follow(kept.id ? readJob(kept.id) : findJob(kept));
    else if (kept && was === kept.model) dropJob({ created: Promise.resolve(kept), model: kept.model });
  });
  // A job no longer followed (a switch to another model): forgotten at once, deleted once its id is known.
  function dropJob({ created, model }) {
    if (storedJob()?.model === model) sessionStorage.removeItem(JOB_STORE);
    Promise.resolve(created).then((job) => job?.id && api(`/v1/videos/${encodeURIComponent(job.id)}`,
                                                          { method: "DELETE", signal: null })).catch(() => {});
  }
  function readJob(id) {
    return api(`/v1/videos/${encodeURIComponent(id)}`, { signal: null }).then((resp) => resp.json(), (err) => {
      if (err.status === 404) forgetJob(id);  // gone meanwhile (deleted, or expired)
      throw err;
    });
  }
  // The job a create made whose answer the page never had (reloaded while it was on its way): the newest of
  // the model's jobs with its prompt made since it was sent, an unfinished one first; null if none (the
  // create never reached the server).
  async function findJob(sent) {
    const { data } = await (await api(`/v1/videos?limit=${FIND_LIMIT}`, { signal: null })).json();
    const mine = data.filter((j) => j.model === sent.model && j.prompt === sent.prompt &&
                                    j.created_at >= sent.at - CLOCK_SLACK_S);
    const job = mine.find((j) => UNFINISHED.has(j.status)) || mine[0] || null;
    if (job) keepJob(job.id, sent.model);
    else forgetJob(null);
    return job;
  }
  $("video-button").onclick = () => {
    const prompt = $("video-prompt").value.trim();
    const stepsText = $("video-steps").value.trim();  // (empty: the model's default; else as typed, 0 too)
    if (!prompt) return ask("video-prompt", "video-status", "describe the video first");
    $("video-progress").value = 0;
    keepCreate(state.model.id, prompt);  // (a reload before its answer finds the job it made)
    // The create is not aborted by a Stop (a job it made would run on, unknown to the page): a Stop
    // waits for its answer, then deletes the job.
    return follow(api("/v1/videos", {
      method: "POST", headers: { "content-type": "application/json" }, signal: null,
      body: JSON.stringify({ model: state.model.id, prompt, size: $("video-size").value.trim(),
                             seconds: $("video-seconds").value.trim(),
                             num_inference_steps: stepsText === "" ? undefined : Number(stepsText) }),
    }).then((resp) => resp.json(), (err) => {
      if (err.status) forgetJob(null);  // refused: no job was made (unanswered, it may have been: kept)
      throw err;
    }));
  };

  // A job (the promise of one: its create's answer; null: none to follow) followed to its MP4, shown in the player.
  async function follow(created) {
    const modelSignal = state.abort.signal;
    const work = new Work("videos", modelSignal);
    const model = state.model.id;
    showError("");
    const status = $("video-status");
    const bar = $("video-progress");
    const player = $("video-result");
    player.hidden = true;
    status.textContent = "creating…";
    work.onAbort(() => {  // (at once: the model-changed that may follow must know what became of the job)
      if (!work.stopped && modelSignal.aborted) {  // the page's model ended it, not the user: carried on
        carried = { created, model };
        return;
      }
      sessionStorage.removeItem(JOB_STORE);
      cancelJob(created, work);
    });
    let job = null;
    try {
      job = await work.until(created);
      if (!job) {  // (a reload found no job its create made)
        status.textContent = "";
        return;
      }
      keepJob(job.id, model);  // (a reload follows it on)
      while (job.status === "queued" || job.status === "in_progress") {
        status.textContent = job.status;
        bar.value = job.progress || 0;
        const next = new URLSearchParams({ wait_s: VIDEO_WAIT_S, past: job.status,
                                           progress_past: Math.min(job.progress || 0, 99) });
        job = await (await api(`/v1/videos/${job.id}?${next}`, { signal: work.signal })).json();
      }
      status.textContent = job.status;
      forgetJob(job.id);  // ended: failed or completed, nothing more to follow
      if (job.status !== "completed") throw new Error(job.error?.message || `video ${job.status}`);
      bar.value = 100;
      const blob = await (await api(`/v1/videos/${job.id}/content`, { signal: work.signal })).blob();
      if (player.src.startsWith("blob:")) URL.revokeObjectURL(player.src);
      player.src = URL.createObjectURL(blob);
      player.hidden = false;
    } catch (err) {
      if (err.status === 401 && job?.id && work.latest) {  // (the key form is up: app.js)
        carried = { created: Promise.resolve(job), model: state.model.id };
        status.textContent = `job ${job.id} goes on on the server: it is followed again once the API key works`;
      } else if (err.status === 404 && job?.id) forgetJob(job.id);  // deleted elsewhere meanwhile
      if (!work.signal.aborted && status.textContent === "creating…") status.textContent = "";
      showError(err);
    } finally {
      work.done();
    }
  }
}
