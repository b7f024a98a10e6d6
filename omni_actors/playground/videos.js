// The videos panel: a /v1/videos job made, followed a progress value at a time (the server answers when the
// job moves on), then its MP4 in a player; a Stop or a model switch deletes the job on the server, and a key
// refused mid-job (401) has it followed again once a key works. The job followed is kept in the tab's session
// storage, so a reload follows it on (a job left waiting on a key included).
import { Work, ask } from "./work.js";

const $ = (id) => document.getElementById(id);
const VIDEO_WAIT_S = 30; // each status read waits on the server for the job's next progress (no timer)
const JOB_STORE = "omni-actors.video-job";  // { id, model } of the job followed, until it ends or is deleted

function storedJob() {
  try { return JSON.parse(sessionStorage.getItem(JOB_STORE)) || null; } catch { return null; }
}
const keepJob = (id, model) => sessionStorage.setItem(JOB_STORE, JSON.stringify({ id, model }));
const forgetJob = (id) => { if (storedJob()?.id === id) sessionStorage.removeItem(JOB_STORE); };

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

  // A job whose progress read was refused (401: the key changed or was revoked mid-job) runs on on the
  // server: the page keeps its id and follows it again once a key works (the page comes back to its model
  // then); a switch to another model deletes it, as it would a job still followed. A reload finds the job
  // in session storage: shown on its model, it is read afresh and followed on; the page loaded on another
  // model leaves it there until a switch to its model (or away from it) says what to do with it.
  let keyLost = null;  // { job, model }
  let shownModel = null;  // the model shown before this switch (null: the page has just loaded)
  document.addEventListener("model-changed", () => {  // the last model's video is not this one's
    $("video-status").textContent = "";
    $("video-progress").value = 0;
    $("video-result").hidden = true;
    $("video-result").removeAttribute("src");
    const was = shownModel;
    shownModel = state.model.id;
    const lost = keyLost;
    keyLost = null;
    const kept = lost ? null : storedJob();
    if (lost?.model === state.model.id) follow(Promise.resolve(lost.job));
    else if (lost) deleteJob(lost.job.id);
    else if (kept?.model === state.model.id) {
      follow(api(`/v1/videos/${encodeURIComponent(kept.id)}`, { signal: null }).then((resp) => resp.json(), (err) => {
        if (err.status === 404) forgetJob(kept.id);  // gone meanwhile (deleted, or expired)
        throw err;
      }));
    } else if (kept && was === kept.model) deleteJob(kept.id);  // (a job the page followed, left behind)
  });
  function deleteJob(id) {
    forgetJob(id);
    api(`/v1/videos/${encodeURIComponent(id)}`, { method: "DELETE", signal: null }).catch(() => {});
  }
  $("video-button").onclick = () => {
    const prompt = $("video-prompt").value.trim();
    if (!prompt) return ask("video-prompt", "video-status", "describe the video first");
    $("video-progress").value = 0;
    // The create is not aborted by a Stop (a job it made would run on, unknown to the page): a Stop
    // waits for its answer, then deletes the job.
    return follow(api("/v1/videos", {
      method: "POST", headers: { "content-type": "application/json" }, signal: null,
      body: JSON.stringify({ model: state.model.id, prompt, size: $("video-size").value.trim(),
                             seconds: $("video-seconds").value.trim(),
                             num_inference_steps: Number($("video-steps").value) || undefined }),
    }).then((resp) => resp.json()));
  };

  // A job (the promise of one: its create's answer) followed to its MP4, shown in the player.
  async function follow(created) {
    const work = new Work("videos", state.abort.signal);
    const model = state.model.id;
    showError("");
    const status = $("video-status");
    const bar = $("video-progress");
    const player = $("video-result");
    player.hidden = true;
    status.textContent = "creating…";
    work.onAbort(() => {  // (at once: a model-changed after this abort must not follow the job being deleted)
      sessionStorage.removeItem(JOB_STORE);
      cancelJob(created, work);
    });
    let job = null;
    try {
      job = await work.until(created);
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
        keyLost = { job, model: state.model.id };
        status.textContent = `job ${job.id} goes on on the server: it is followed again once the API key works`;
      } else if (err.status === 404 && job?.id) forgetJob(job.id);  // deleted elsewhere meanwhile
      else if (!work.signal.aborted && status.textContent === "creating…") status.textContent = "";
      showError(err);
    } finally {
      work.done();
    }
  }
}
