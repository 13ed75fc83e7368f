// agentrl: thumbs up/down on every message of the chat. A thumb is sent as
// agent.rl.feedback.v1 for the trajectory of the monologue that wrote the message
// (POST /plugins/agentrl/feedback; spooled by the plugin while NATS is away).
// A thumbs-down first offers a one-line "what should it have done?" box: Enter sends the
// thumb with that text as its `correction`, Escape (or an empty box) sends the thumb alone.
// Uses the unified handler output: context.results[] = { args: { no, id, type, ... }, result: { element } }

import { createActionButton } from "/components/messages/action-buttons/simple-action-buttons.js";
import { callJsonApi } from "/js/api.js";

const KINDS = [
  ["thumb_up", "thumbs_up", "Good answer (agentrl feedback)"],
  ["thumb_down", "thumbs_down", "Bad answer (agentrl feedback)"],
];
const CORRECTION_PROMPT = "what should it have done?";

export function feedbackPayload(ctxid, logNo, kind, correction) {
  const payload = { context: ctxid, log_no: logNo, kind };
  const text = (correction || "").trim();
  if (kind === "thumbs_down" && text) payload.correction = text;
  return payload;
}

async function send(logNo, kind, button, correction) {
  const ctxid = globalThis.getContext?.();
  if (!ctxid) throw new Error("No active chat");
  const res = await callJsonApi(
    "/plugins/agentrl/feedback",
    feedbackPayload(ctxid, logNo, kind, correction),
  );
  if (!res?.ok) throw new Error(res?.message || "Feedback failed");
  button?.classList?.add("agentrl-sent");
  return res;
}

// the one-line box under the message's buttons; resolves with its text ("" when skipped)
function askCorrection(bar) {
  return new Promise((resolve) => {
    bar.querySelector(".agentrl-correction")?.remove();
    const input = document.createElement("input");
    input.type = "text";
    input.className = "agentrl-correction";
    input.placeholder = CORRECTION_PROMPT + " (Enter sends, Esc skips)";
    input.maxLength = 4000;
    input.style.cssText = "width: 100%; margin-top: 4px;";
    let done = false;
    const finish = (text) => {
      if (done) return;
      done = true;
      input.remove();
      resolve(text);
    };
    input.addEventListener("keydown", (e) => {
      if (e.key === "Enter") finish(input.value);
      else if (e.key === "Escape") finish("");
    });
    input.addEventListener("blur", () => finish(input.value));
    bar.after(input);
    input.focus();
  });
}

export default async function injectAgentrlThumbs(context) {
  if (!context?.results?.length) return;
  for (const { args, result } of context.results) {
    if (!result?.element || args.no == null) continue;
    if (args.type && !["response", "agent"].includes(args.type)) continue; // answers only
    const logNo = args.no;
    for (const bar of result.element.querySelectorAll(".step-action-buttons")) {
      if (bar.querySelector(".action-thumb_up")) continue;
      for (const [icon, kind, title] of KINDS) {
        const button = createActionButton(icon, title, async () => {
          const correction = kind === "thumbs_down" ? await askCorrection(bar) : "";
          return send(logNo, kind, button, correction);
        });
        bar.appendChild(button);
      }
    }
  }
}
