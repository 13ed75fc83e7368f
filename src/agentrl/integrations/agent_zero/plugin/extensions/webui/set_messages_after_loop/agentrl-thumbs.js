// agentrl: thumbs up/down on every message of the chat. A thumb is sent as
// agent.rl.feedback.v1 for the trajectory of the monologue that wrote the message
// (POST /plugins/agentrl/feedback; spooled by the plugin while NATS is away).
// Uses the unified handler output: context.results[] = { args: { no, id, type, ... }, result: { element } }

import { createActionButton } from "/components/messages/action-buttons/simple-action-buttons.js";
import { callJsonApi } from "/js/api.js";

const KINDS = [
  ["thumb_up", "thumbs_up", "Good answer (agentrl feedback)"],
  ["thumb_down", "thumbs_down", "Bad answer (agentrl feedback)"],
];

async function send(logNo, kind, button) {
  const ctxid = globalThis.getContext?.();
  if (!ctxid) throw new Error("No active chat");
  const res = await callJsonApi("/plugins/agentrl/feedback", {
    context: ctxid,
    log_no: logNo,
    kind,
  });
  if (!res?.ok) throw new Error(res?.message || "Feedback failed");
  button?.classList?.add("agentrl-sent");
  return res;
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
        const button = createActionButton(icon, title, async () => send(logNo, kind, button));
        bar.appendChild(button);
      }
    }
  }
}
