// The request panels (chat, speak, images, videos, transcribe), bound once: each owns its controls, its
// answers (cleared by a model switch) and its errors, shown with it. Each click is a Work (work.js).
import { bindChat } from "./chat.js";
import { bindImages } from "./images.js";
import { bindSpeak } from "./speak.js";
import { bindTranscribe } from "./transcribe.js";
import { bindVideos } from "./videos.js";

// ctx.showError(message, panel): each panel's errors are its own (shown with it).
export function bindPanels(ctx) {
  const of = (panel) => ({ ...ctx, showError: (message) => ctx.showError(message, panel) });
  bindChat(of("chat"));
  bindSpeak(of("speak"));
  bindImages(of("images"));
  bindVideos(of("videos"));
  bindTranscribe(of("transcribe"));
}
