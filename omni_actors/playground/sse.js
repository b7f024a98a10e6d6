// Reading a streamed answer's body: its parts as they come, server-sent events, a lost connection said in words;
// showing it as it grows.

const FOLLOW_SLACK_PX = 24;  // an answer whose end is within this of the window's bottom is "in view"

// `update()` grows a streamed answer's box: while its end is in view the page scrolls with it, so the newest
// words stay in view; a reader who scrolled up to read stays where they are.
export function following(box, update) {
  const inView = box.getBoundingClientRect().bottom <= window.innerHeight + FOLLOW_SLACK_PX;
  update();
  const below = box.getBoundingClientRect().bottom - window.innerHeight;
  if (inView && below > 0) window.scrollBy(0, Math.ceil(below));  // (whole pixels: a fraction would stop short)
}

// A body's next part; a connection lost on the way says so (the browser's own words are "network error").
export async function nextPart(reader) {
  try {
    return await reader.read();
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new Error(`the connection to the server was lost before the end (${err.message})`);
  }
}

// Reads an SSE body, calling onEvent(parsed JSON) for each `data:` line; true once [DONE] came, false when
// the body ended without it. An error the server sends in-band (its headers were out) throws its message.
export async function readSse(resp, onEvent) {
  const reader = resp.body.getReader();
  const text = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await nextPart(reader);
    if (done) return false;
    buf += text.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const block = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      for (const line of block.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return true;
        const event = JSON.parse(data);
        if (event.error) throw new Error(event.error.message || "the server failed this request");
        onEvent(event);
      }
    }
  }
}
