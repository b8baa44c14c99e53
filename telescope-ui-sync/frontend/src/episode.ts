// A tool-calling episode (a browser task, say) as its steps, in order: what the model saw, what
// it answered and did, what it saw then, ... with the page's screenshots where the rollout kept
// some (its record's `attachments`, files under the run's media/ folder, served by
// /api/rollouts/media and loaded lazily: an episode may keep dozens).
//
// Turn k is what the model saw before its reply k + 1: turn 0 the prompt's last user message (the
// task and the page), turn k > 0 the messages that answer reply k (a tool result per action: the
// page's new snapshot, an error, or "The task is over."). An attachment's `turn` counts the
// replies before it (0: the page with the prompt; k: after reply k's actions; several share a
// turn, one per action, in order), so the screenshots of turn k are shown with its observation.
// Tool calls are read from `tool_calls` (OpenAI's shape) and from `<tool_call>{json}</tool_call>`
// blocks of the reply's text (the format of telescope's tool environments); the rest of the reply
// is rendered as text. Limits: a tool result is not matched to the screenshot of its action (an
// action that failed before acting keeps none, so their counts differ); a screenshot whose turn is
// past the last one is shown with the last.
import { clipped } from "./clip";
import { h } from "./dom";
import { renderText, type RenderMode } from "./render";

type Message = Record<string, unknown>;
export interface Attachment { name?: string; media_type?: string; turn?: number; path?: string; bytes?: number }
export interface Action { name: string; args: string; malformed: boolean }
export interface Turn { index: number; reply: Message | null; actions: Action[]; seen: Message[]; shots: Attachment[] }

const TOOL_CALL = /<tool_call>\s*([\s\S]*?)\s*<\/tool_call>/g;

/** ``name(k=v, ...)`` of a call's arguments (an object, or its JSON as a string). */
function describe(name: unknown, args: unknown): Action {
  let value = args;
  if (typeof value === "string") {
    try { value = JSON.parse(value); } catch { return { name: String(name ?? "?"), args: value as string, malformed: true }; }
  }
  const shown = value && typeof value === "object" && !Array.isArray(value)
    ? Object.entries(value as Record<string, unknown>).map(([k, v]) => `${k}=${JSON.stringify(v)}`).join(", ")
    : JSON.stringify(value ?? null);
  return { name: String(name ?? "?"), args: shown, malformed: false };
}

/** The actions of a reply: its structured ``tool_calls``, then the ``<tool_call>`` blocks of its text. */
export function replyActions(message: Message): Action[] {
  const actions: Action[] = [];
  for (const call of Array.isArray(message.tool_calls) ? (message.tool_calls as Message[]) : []) {
    const fn = (call.function ?? call) as Message;
    actions.push(describe(fn.name, fn.arguments));
  }
  const text = typeof message.content === "string" ? message.content : "";
  for (const match of text.matchAll(TOOL_CALL)) {
    try {
      const call = JSON.parse(match[1]) as Message;
      actions.push(describe(call.name, call.arguments ?? {}));
    } catch {
      actions.push({ name: "malformed call", args: match[1], malformed: true });
    }
  }
  return actions;
}

/** Whether a record is an episode of tool calls (or kept screenshots): what gets the steps view. */
export function isToolEpisode(record: Record<string, unknown>): boolean {
  const messages = Array.isArray(record.messages) ? (record.messages as Message[]) : [];
  const attachments = Array.isArray(record.attachments) ? record.attachments : [];
  return attachments.length > 0 || messages.some((m) => m.role === "assistant" && replyActions(m).length > 0);
}

/** The episode's turns (see the module comment). */
export function episodeTurns(record: Record<string, unknown>): Turn[] {
  const messages = Array.isArray(record.messages) ? (record.messages as Message[]) : [];
  const first = messages.findIndex((m) => m.role === "assistant");
  const opening = first < 0 ? messages : messages.slice(0, first);
  const prompt = Array.isArray(record.prompt) ? (record.prompt as Message[]) : [{ role: "user", content: record.prompt ?? "" }];
  const said = opening.filter((m) => m.role !== "system");
  const seen = (said.length ? said : prompt.filter((m) => m.role !== "system")).slice(-1);
  const turns: Turn[] = [{ index: 0, reply: null, actions: [], seen, shots: [] }];
  for (const message of first < 0 ? [] : messages.slice(first)) {
    if (message.role === "assistant") {
      turns.push({ index: turns.length, reply: message, actions: replyActions(message), seen: [], shots: [] });
    } else {
      turns[turns.length - 1].seen.push(message);
    }
  }
  const attachments = Array.isArray(record.attachments) ? (record.attachments as Attachment[]) : [];
  for (const shot of attachments) {
    const turn = Number.isInteger(shot.turn) ? Math.max(0, shot.turn as number) : 0;
    turns[Math.min(turn, turns.length - 1)].shots.push(shot);
  }
  return turns;
}

function text(message: Message): string {
  const content = message.content;
  return typeof content === "string" ? content : content === null || content === undefined ? "" : JSON.stringify(content);
}

function mediaUrl(runId: string, path: string): string {
  return `/api/rollouts/media?${new URLSearchParams({ run: runId, path })}`;
}

function renderShot(runId: string, shot: Attachment, turn: number, index: number, count: number): HTMLElement {
  const what = turn === 0 ? "the page with the prompt" : `the page after reply ${turn}${count > 1 ? `, action ${index + 1} of ${count}` : ""}`;
  if (!shot.path) return h("span", { class: "muted" }, `(${what}: no file)`);
  const url = mediaUrl(runId, shot.path);
  if (!String(shot.media_type ?? "image/").startsWith("image/")) {
    return h("a", { class: "attachment-link", href: url, target: "_blank", rel: "noopener" }, `${shot.name ?? "attachment"} (${shot.media_type})`);
  }
  return h("figure", { class: "shot" },
    h("a", { href: url, target: "_blank", rel: "noopener", title: "Open the full size" },
      h("img", { src: url, loading: "lazy", decoding: "async", alt: `${shot.name ?? "screenshot"}: ${what}`, "data-path": shot.path })),
    h("figcaption", { class: "muted" }, what));
}

/** One turn: the reply that led to it (text and actions), then what the model saw, beside its screenshots. */
function renderTurn(runId: string, turn: Turn, mode: RenderMode): HTMLElement {
  const box = h("section", { class: "episode-turn", "data-turn": turn.index });
  if (turn.reply) {
    const rest = text(turn.reply).replace(TOOL_CALL, "").trim();
    box.append(h("div", { class: "message role-assistant episode-reply" },
      h("div", { class: "role" }, `reply ${turn.index}`),
      rest ? clipped(rest, (t) => renderText(t, mode)) : null,
      turn.actions.length
        ? h("ol", { class: "actions" }, ...turn.actions.map((a) => h("li", { class: `action${a.malformed ? " warn" : ""}` }, h("b", null, a.name), `(${a.args})`)))
        : h("div", { class: "muted" }, "no action: the episode ends here")));
  }
  const seen = h("div", { class: "episode-seen" },
    h("div", { class: "role" }, turn.index === 0 ? "seen first: the prompt" : `seen after reply ${turn.index}`),
    ...turn.seen.map((m) => h("div", { class: `observation role-${String(m.role ?? "").replace(/[^a-z]/g, "")}` },
      clipped(text(m), (t) => h("pre", { class: "raw observation-text" }, t)))),
    turn.seen.length ? null : h("div", { class: "muted" }, turn.index === 0 ? "(no prompt recorded)" : "(nothing: the episode ended)"));
  const shots = turn.shots.length
    ? h("div", { class: "shots" }, ...turn.shots.map((shot, i) => renderShot(runId, shot, turn.index, i, turn.shots.length)))
    : null;
  box.append(h("div", { class: `episode-observation${shots ? " with-shots" : ""}` }, seen, shots));
  return box;
}

/** The steps of an episode of ``run``: a header, then each turn in order. */
export function renderEpisode(runId: string, record: Record<string, unknown>, mode: RenderMode): HTMLElement {
  const turns = episodeTurns(record);
  const actions = turns.reduce((n, t) => n + t.actions.length, 0);
  const shots = turns.reduce((n, t) => n + t.shots.length, 0);
  return h("div", { class: "episode", "data-testid": "episode-steps" },
    h("h4", null, `Steps: ${turns.length - 1} replies, ${actions} actions${shots ? `, ${shots} screenshots` : ""}`),
    ...turns.map((turn) => renderTurn(runId, turn, mode)));
}
