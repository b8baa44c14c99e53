// The shell: sidebar (runs to compare, pages), hash routing, the live refresh loop, and
// the banners (a run whose directory was deleted, a block of a run that cannot be read, a
// server that stopped answering). A page of one run names it above the page. Run colours
// are palette slots kept per run id in localStorage (the least used slot when a run is
// first listed), so adding or removing runs never recolours the others. The run list is
// polled every second; the page is refreshed every second only while one of its runs is
// live: a finished or deleted run's page loads again only when the sync brings that run
// something new. The pure helpers are on ``window.telescopeUi`` too (the browser tests
// call them).
import "./style.css";
import { get, remove, type Run } from "./api";
import { PALETTE, clear, fmt, h, hashColor, save, store } from "./dom";
import type { Ctx, Page, PageFactory } from "./context";
import { overviewPage } from "./pages/overview";
import { metricsPage } from "./pages/metrics";
import { rolloutsPage } from "./pages/rollouts";
import { timelinePage } from "./pages/timeline";
import { infraPage } from "./pages/infra";
import { evalsPage } from "./pages/evals";
import { sandboxesPage } from "./pages/sandboxes";
import { logsPage } from "./pages/logs";
import { axisSize } from "./charts";
import { protectMath, renderText } from "./render";
import { KindColors, assignGroupedRows, assignRows, kindColor, offsetLabel, timeTicks } from "./timeline_layout";

Object.assign(window, { telescopeUi: { fmt, axisSize, protectMath, renderText, assignRows, assignGroupedRows, timeTicks, offsetLabel, kindColor, KindColors } });

const PAGES: [string, string, PageFactory][] = [
  ["overview", "Overview", overviewPage],
  ["metrics", "Metrics", metricsPage],
  ["rollouts", "Rollouts", (ctx) => rolloutsPage(ctx, false)],
  ["discarded", "Discarded", (ctx) => rolloutsPage(ctx, true)],
  ["timeline", "Timeline", timelinePage],
  ["infra", "Infra", infraPage],
  ["evals", "Evals", evalsPage],
  ["sandboxes", "Sandboxes", sandboxesPage],
  ["logs", "Logs", logsPage],
];
const COMPARING_PAGES = new Set(["metrics"]); // the others show one run: the first picked
const FINAL = new Set(["completed", "failed", "interrupted"]);
const MAX_SELECTED = 20;
const REFRESH_MS = 1000;

let runs: Run[] = [];
// The runs the user picked (kept in localStorage). Written only when the user picks: the
// default shown when none of them is there (the newest run) is never saved, so it cannot
// overwrite a choice stored meanwhile, by another tab or before the run list arrived.
let chosen: string[] = store<string[]>("selected", []);
let page: Page | null = null;
let pageKey = "";
let refreshing = false;
let refreshedKey = ""; // dataKey() when the page last refreshed without error
let serverDown = false;
let slots: Record<string, number> = store<Record<string, number>>("colors", {});

const runList = h("div", { class: "run-list" });
const runFilter = h("input", { class: "run-filter", placeholder: "Search runs…", type: "search" });
const nav = h("nav", { class: "nav" });
const banners = h("div", { class: "banners" });
const content = h("main", { class: "content" });

function route(): { name: string; params: URLSearchParams } {
  const hash = location.hash.replace(/^#\/?/, "");
  const [name, query] = hash.split("?");
  return { name: PAGES.some(([key]) => key === name) ? name : "overview", params: new URLSearchParams(query ?? "") };
}

function color(runId: string): string {
  const slot = slots[runId];
  return slot === undefined ? hashColor(runId) : PALETTE[slot % PALETTE.length];
}

/** Gives each listed run without a colour the palette slot least used by the listed runs. */
function assignColors(): void {
  slots = store<Record<string, number>>("colors", {}); // another tab may have assigned some
  const fresh = runs.filter((run) => slots[run.run_id] === undefined);
  if (!fresh.length) return;
  const uses = PALETTE.map(() => 0);
  for (const run of runs) if (slots[run.run_id] !== undefined) uses[slots[run.run_id] % PALETTE.length]++;
  for (const run of fresh) {
    const slot = uses.indexOf(Math.min(...uses));
    slots[run.run_id] = slot;
    uses[slot]++;
  }
  save("colors", slots);
}

/** What changes when a shown run gets new data (status, step, synced rows, its directory going). */
function dataKey(): string {
  return JSON.stringify(shownRuns().map((id) => {
    const run = runs.find((r) => r.run_id === id);
    return run ? [id, run.status, run.step, run.updated_time, run.data_time, run.missing] : [id];
  }));
}

/** Whether a shown run may still change by itself: it is not finished and its directory is there. */
function live(): boolean {
  return shownRuns().some((id) => {
    const run = runs.find((r) => r.run_id === id);
    return run !== undefined && !run.missing && !FINAL.has(run.status ?? "");
  });
}

/** The runs shown: those picked that exist, else the newest run. */
function shownRuns(): string[] {
  const present = chosen.filter((id) => runs.some((run) => run.run_id === id));
  return present.length ? present : runs.length ? [runs[runs.length - 1].run_id] : [];
}

function context(params: URLSearchParams): Ctx {
  const present = shownRuns();
  return {
    runs,
    selected: present,
    primary: present[0] ?? null,
    color,
    runName: (id) => runs.find((run) => run.run_id === id)?.name ?? id,
    params,
    navigate: (name, next = {}) => {
      const query = new URLSearchParams(Object.entries(next).map(([k, v]) => [k, String(v)]));
      location.hash = `#/${name}${query.toString() ? "?" + query : ""}`;
    },
    setParams: (next) => {
      const { name, params: current } = route();
      for (const [key, value] of Object.entries(next)) {
        if (value === null) current.delete(key);
        else current.set(key, String(value));
      }
      history.replaceState(null, "", `#/${name}${current.toString() ? "?" + current : ""}`);
    },
  };
}

function mountPage(force = false): void {
  const { name, params } = route();
  const key = `${name}|${shownRuns().join(",")}`;
  for (const link of nav.querySelectorAll("a")) link.classList.toggle("active", link.dataset.page === name);
  if (!force && key === pageKey && page) return;
  page?.destroy?.();
  pageKey = key;
  const factory = PAGES.find(([k]) => k === name)![2];
  const ctx = context(params);
  clear(content);
  if (!ctx.primary) {
    page = null;
    content.append(h("div", { class: "empty-page" }, runs.length ? "Pick a run in the sidebar." : "No runs yet: waiting for run directories to appear…"));
    return;
  }
  if (!COMPARING_PAGES.has(name)) {
    const others = ctx.selected.length - 1;
    content.append(h("div", { class: "page-run", "data-run": ctx.primary },
      h("span", { class: "dot", style: `background:${color(ctx.primary)}` }), " Run ", h("strong", null, ctx.runName(ctx.primary)),
      others > 0 ? h("span", { class: "muted" }, ` (the first of ${others + 1} compared; click a run's name in the sidebar to show it here)`) : null));
  }
  page = factory(ctx);
  content.append(page.el);
  refreshedKey = "";
  void refreshPage();
}

async function refreshPage(): Promise<void> {
  if (!page || refreshing) return;
  refreshing = true;
  const key = dataKey();
  const target = page; // a page mounted meanwhile has not been refreshed: its key stays ""
  try {
    await target.refresh();
    if (page === target) refreshedKey = key;
  } catch (error) {
    if (page === target) refreshedKey = "";
    console.warn("refresh failed", error);
  } finally {
    refreshing = false;
  }
}

async function removeRun(run: Run): Promise<void> {
  if (!window.confirm(`Remove run ${run.name} from the dashboard? Its directory is gone; what was synced of it is deleted too.`)) return;
  try {
    await remove(`/api/runs/${encodeURIComponent(run.run_id)}`);
  } catch (error) {
    window.alert(`Could not remove run ${run.name}: ${error instanceof Error ? error.message : String(error)}`);
    return;
  }
  if (chosen.includes(run.run_id)) {
    chosen = chosen.filter((id) => id !== run.run_id);
    save("selected", chosen);
  }
  await pollRuns();
}

function toggleRun(runId: string, only: boolean): void {
  const shown = shownRuns();
  if (only) chosen = [runId, ...shown.filter((id) => id !== runId)];
  else if (shown.includes(runId)) chosen = shown.filter((id) => id !== runId);
  else chosen = [...shown, runId].slice(0, MAX_SELECTED);
  save("selected", chosen);
  renderRuns();
  mountPage();
}

function renderRuns(): void {
  const filter = runFilter.value.trim().toLowerCase();
  clear(runList);
  const shown = shownRuns();
  for (const run of runs) {
    if (filter && !run.name.toLowerCase().includes(filter) && !run.run_id.toLowerCase().includes(filter)) continue;
    const isSelected = shown.includes(run.run_id);
    const fraction = run.progress.fraction ?? 0;
    const status = run.missing ? "deleted" : run.status ?? "new";
    runList.append(
      h("div", { class: `run-item${isSelected ? " selected" : ""}${shown[0] === run.run_id ? " primary" : ""}`, "data-run": run.run_id },
        h("input", { type: "checkbox", checked: isSelected, title: "Compare this run", onchange: () => toggleRun(run.run_id, false) }),
        h("span", { class: "dot", style: `background:${color(run.run_id)}` }),
        h("button", { class: "run-name", title: run.path, onclick: () => toggleRun(run.run_id, true) }, run.name),
        h("span", { class: `status status-${status}` }, status,
          run.missing ? h("button", { class: "icon run-remove", title: "Remove this deleted run from the dashboard", onclick: () => void removeRun(run) }, "×") : null),
        h("div", { class: "mini-progress" }, h("div", { style: `width:${Math.round(fraction * 100)}%` })),
      ),
    );
  }
}

function renderBanners(): void {
  clear(banners);
  if (serverDown) banners.append(h("div", { class: "banner error" }, "The telescope ui server does not answer; retrying…"));
  for (const id of shownRuns()) {
    const run = runs.find((r) => r.run_id === id);
    if (run?.missing) {
      banners.append(h("div", { class: "banner warning", "data-missing": run.run_id },
        `The directory of run ${run.name} (${run.path}) was deleted. What was synced before is still shown.`));
    }
    const bad = run?.bad_blocks ?? [];
    if (run && bad.length) {
      banners.append(h("div", { class: "banner warning", "data-bad-blocks": run.run_id },
        `${bad.length} block${bad.length > 1 ? "s" : ""} of run ${run.name} cannot be read and ${bad.length > 1 ? "are" : "is"} skipped (the rest of the run is shown; a block is read again when its file changes): `,
        ...bad.slice(0, 5).map((block, i) => h("span", { title: block.error }, `${i ? ", " : ""}${block.file} (${block.error.slice(0, 120)})`)),
        bad.length > 5 ? ` and ${bad.length - 5} more` : ""));
    }
  }
}

async function pollRuns(): Promise<void> {
  try {
    const data = await get<{ runs: Run[] }>("/api/runs");
    serverDown = false;
    const before = JSON.stringify(runs);
    runs = data.runs;
    assignColors();
    if (JSON.stringify(runs) !== before) {
      renderRuns();
      mountPage(); // a picked run that appears (or goes) changes what is shown
    }
    if (!page) mountPage(true);
  } catch {
    serverDown = true;
  }
  renderBanners();
}

async function tick(): Promise<void> {
  await pollRuns();
  if (live() || dataKey() !== refreshedKey) await refreshPage();
  window.setTimeout(tick, REFRESH_MS);
}

function start(): void {
  for (const [key, label] of PAGES) nav.append(h("a", { href: `#/${key}`, "data-page": key }, label));
  runFilter.addEventListener("input", renderRuns);
  const app = document.getElementById("app")!;
  clear(app);
  app.append(
    h("aside", { class: "sidebar" }, h("div", { class: "brand" }, "telescope ui"), nav, h("div", { class: "runs-title" }, "Runs"), runFilter, runList),
    h("div", { class: "main" }, banners, content),
  );
  window.addEventListener("hashchange", () => mountPage());
  void tick();
}

start();
