// Sandboxes: each sandbox's lifecycle (first and last event, destroyed or not), the
// commands it ran, their time and failures; a click lists its events with their fields
// (command, exit code, output, error).
import { get } from "../api";
import { clear, clock, fmt, h } from "../dom";
import type { Ctx, Page } from "../context";

interface SandboxRow { sandbox_id: string; first: number; last: number; commands: number; failures: number; execute_s: number; destroyed: boolean; kinds: string }
interface SandboxEvent { seq: number; kind: string; start: number; duration: number; error: string | null; fields: Record<string, unknown>; failed: boolean }

export function sandboxesPage(ctx: Ctx): Page {
  const runId = ctx.primary!;
  const table = h("div", null);
  const detail = h("div", { class: "card" }, h("p", { class: "muted" }, "Click a sandbox for its commands."));
  const el = h("div", { class: "page sandboxes" }, h("h1", null, "Sandboxes"), table, detail);
  let open: string | null = null;
  let key = "";

  async function show(id: string): Promise<void> {
    open = id;
    const data = await get<{ events: SandboxEvent[] }>(`/api/sandboxes/${encodeURIComponent(runId)}/${encodeURIComponent(id)}`);
    clear(detail);
    detail.append(h("h2", null, `Sandbox ${id}`), h("table", { class: "table" },
      h("thead", null, h("tr", null, h("th", null, "event"), h("th", null, "start"), h("th", null, "duration (s)"), h("th", null, "command / detail"), h("th", null, "exit"), h("th", null, "error"))),
      h("tbody", null, ...data.events.map((ev) => h("tr", { class: ev.failed ? "failed" : "" },
        h("td", null, ev.kind), h("td", null, clock(ev.start)), h("td", null, fmt(ev.duration, 3)),
        h("td", null, h("code", null, String(ev.fields.command ?? ev.fields.path ?? "")),
          ev.fields.stdout || ev.fields.stderr ? h("details", null, h("summary", null, "output"), h("pre", { class: "raw" }, `${ev.fields.stdout ?? ""}${ev.fields.stderr ? "\n[stderr]\n" + ev.fields.stderr : ""}`)) : null),
        h("td", null, ev.fields.exit_code === undefined ? "" : String(ev.fields.exit_code)),
        h("td", { class: "warn" }, ev.error ?? ""))))));
  }

  return {
    el,
    async refresh() {
      const data = await get<{ sandboxes: SandboxRow[] }>("/api/sandboxes", { run: runId });
      const layout = JSON.stringify(data.sandboxes);
      if (layout === key) return;
      key = layout;
      clear(table);
      if (!data.sandboxes.length) {
        table.append(h("p", { class: "muted empty" }, "This run used no sandboxes (no sandbox.* events)."));
        return;
      }
      table.append(h("table", { class: "table sandbox-table" },
        h("thead", null, h("tr", null, ...["sandbox", "created", "lifetime (s)", "commands", "failures", "executing (s)", "destroyed"].map((c) => h("th", null, c)))),
        h("tbody", null, ...data.sandboxes.map((s) => h("tr", { class: `clickable${s.failures ? " failed" : ""}`, onclick: () => void show(s.sandbox_id) },
          h("td", null, s.sandbox_id), h("td", null, clock(s.first)), h("td", null, fmt(s.last - s.first, 2)), h("td", null, String(s.commands)),
          h("td", null, String(s.failures)), h("td", null, fmt(s.execute_s, 2)), h("td", null, s.destroyed ? "yes" : "no"))))));
      if (open) await show(open);
    },
  };
}
