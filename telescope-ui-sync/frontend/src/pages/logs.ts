// Logs: the run's log files (one component each), with level toggles and text search;
// follows new lines while the run writes (the newest lines are shown: 500, and 500 more
// with each "earlier lines" click, fetched in requests of at most MAX_REQUEST lines).
import { get } from "../api";
import { clear, clock, debounce, h } from "../dom";
import type { Ctx, Page } from "../context";

interface LogLine { component: string; line_no: number; time: number | null; level: string | null; logger: string | null; message: string }
const LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL", "NONE"];
const PAGE = 500;
const MAX_REQUEST = 5000; // the API's largest limit

export function logsPage(ctx: Ctx): Page {
  const runId = ctx.primary!;
  let component = ctx.params.get("component") ?? "";
  const levels = new Set(LEVELS);
  const componentSelect = h("select", { onchange: () => { component = componentSelect.value; ctx.setParams({ component: component || null }); void load(); } });
  const search = h("input", { type: "search", placeholder: "Search log lines…", class: "log-search" });
  const count = h("span", { class: "muted" });
  const table = h("div", { class: "log-lines" });
  let shown = PAGE; // how many of the newest matching lines are shown
  const earlier = h("button", { class: "log-earlier", onclick: () => { shown += PAGE; void load(); } });
  const toggles = LEVELS.map((level) => h("label", { class: `level-toggle level-${level}` },
    h("input", { type: "checkbox", checked: true, "data-level": level, onchange: (e: Event) => {
      if ((e.target as HTMLInputElement).checked) levels.add(level); else levels.delete(level);
      void load();
    } }), level === "NONE" ? "other" : level));
  const el = h("div", { class: "page logs" }, h("div", { class: "toolbar" }, h("h1", null, "Logs"), componentSelect, ...toggles, search, count), table);
  search.addEventListener("input", debounce(() => { shown = PAGE; void load(); }, 250));
  let componentsKey = "";

  async function load(): Promise<void> {
    const params = { run: runId, component: component || null, levels: [...levels].join(",") || "NOTHING", q: search.value.trim() || null };
    type Answer = { total: number; lines: LogLine[]; components: { name: string; lines: number; errors: number; warnings: number }[] };
    const first = await get<Answer>("/api/logs", { ...params, limit: Math.min(shown, MAX_REQUEST) });
    let lines = first.lines;
    if (first.total > lines.length) { // more lines match than the first answer holds: fetch the newest `shown`
      lines = [];
      for (let offset = Math.max(0, first.total - shown); offset < first.total;) {
        const part = await get<Answer>("/api/logs", { ...params, offset, limit: Math.min(MAX_REQUEST, first.total - offset) });
        if (!part.lines.length) break;
        lines.push(...part.lines);
        offset += part.lines.length;
      }
    }
    const data = { ...first, lines };
    const key = JSON.stringify(data.components.map((c) => c.name));
    if (key !== componentsKey) {
      componentsKey = key;
      clear(componentSelect);
      componentSelect.append(h("option", { value: "" }, "all components"), ...data.components.map((c) =>
        h("option", { value: c.name }, `${c.name} (${c.lines}${c.errors ? `, ${c.errors} errors` : ""})`)));
      componentSelect.value = component;
    }
    count.textContent = `${data.total} line(s)${data.total > data.lines.length ? `, last ${data.lines.length} shown` : ""}`;
    clear(table);
    const hidden = data.total - data.lines.length;
    if (hidden > 0) {
      earlier.textContent = `Show ${Math.min(PAGE, hidden)} earlier line(s) (${hidden} not shown)`;
      table.append(earlier);
    }
    if (!data.lines.length) table.append(h("p", { class: "muted" }, "No log lines match."));
    for (const line of data.lines) {
      table.append(h("div", { class: `log-line level-${line.level ?? "NONE"}` },
        h("span", { class: "log-component" }, line.component), h("span", { class: "log-time" }, line.time ? clock(line.time) : ""),
        h("span", { class: "log-level" }, line.level ?? ""), h("span", { class: "log-message" }, line.message)));
    }
  }

  return { el, refresh: load };
}
