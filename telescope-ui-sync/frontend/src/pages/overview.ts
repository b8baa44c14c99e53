// Overview: progress with runtime and ETA, a grid of plots (editable, kept in the browser),
// the config (summary, full YAML, diff against another compared run), the code snapshot
// (a file tree and viewer, and the files that differ from another compared run's with
// their unified diff), and the log files.
import { get, getText, type CodeDiff, type CodeFiles, type RunSummary, type Series } from "../api";
import { clear, duration, fmt, h, save, store } from "../dom";
import type { Ctx, Page } from "../context";
import { LineChart } from "../charts";

const DEFAULT_PLOTS = ["reward/mean", "timing_step_total", "grad_norm"];

export function overviewPage(ctx: Ctx): Page {
  const runId = ctx.primary!;
  let plots = store<string[]>("overview-plots", DEFAULT_PLOTS);
  let emaSpan = store<number>("overview-ema", 0);
  const charts = new Map<string, LineChart>();
  const progress = h("section", { class: "card progress-card" });
  const grid = h("div", { class: "chart-grid" });
  const addSelect = h("select", { class: "add-plot" });
  const emaInput = h("input", { type: "number", min: 0, max: 100, value: emaSpan, class: "ema", title: "EMA span (0: off)" });
  const config = h("section", { class: "card config-card" });
  const diff = h("section", { class: "card diff-card" });
  const logs = h("section", { class: "card" });
  const code = h("section", { class: "card code-card" });
  const el = h("div", { class: "page overview" },
    h("h1", null, "Overview"), progress,
    h("section", { class: "card" },
      h("div", { class: "toolbar" }, h("strong", null, "Plots"), addSelect, h("label", null, "EMA ", emaInput)),
      grid),
    config, diff, code, logs);
  let summary: RunSummary | null = null;
  let catalogLoaded = false;

  emaInput.addEventListener("change", () => {
    emaSpan = Math.max(0, Number(emaInput.value) || 0);
    save("overview-ema", emaSpan);
    for (const chart of charts.values()) chart.update({ ema: emaSpan });
  });
  addSelect.addEventListener("change", () => {
    if (addSelect.value) {
      plots = [...plots, addSelect.value];
      save("overview-plots", plots);
      addSelect.value = "";
      buildGrid();
      void loadSeries();
    }
  });

  function buildGrid(): void {
    for (const chart of charts.values()) chart.destroy();
    charts.clear();
    clear(grid);
    plots.forEach((name, index) => {
      const chart = new LineChart(name, { ema: emaSpan, outliers: false, yMin: null, yMax: null, xLabel: "step" }, "overview");
      const remove = h("button", { class: "icon", title: "Remove this plot", onclick: () => {
        plots = plots.filter((_, i) => i !== index);
        save("overview-plots", plots);
        buildGrid();
        void loadSeries();
      } }, "×");
      chart.el.querySelector(".chart-title")!.append(remove);
      charts.set(`${index}:${name}`, chart);
      grid.append(chart.el);
    });
  }

  async function loadSeries(): Promise<void> {
    const names = [...new Set(plots)];
    if (!names.length) return;
    const data = await get<{ series: Series[] }>("/api/metrics/series", { runs: ctx.selected.join(","), names: names.join(",") });
    const styles = ctx.selected.map((id) => ({ id, label: ctx.runName(id), color: ctx.color(id) }));
    for (const [key, chart] of charts) {
      const name = key.slice(key.indexOf(":") + 1);
      chart.setData(data.series.filter((s) => s.name === name), styles);
    }
  }

  function renderProgress(s: RunSummary): void {
    const p = s.run.progress;
    const segments = h("div", { class: "segments" });
    const done = Math.round((p.fraction ?? 0) * 100);
    for (let i = 0; i < 100; i++) segments.append(h("span", { class: i < done ? "on" : "" }));
    clear(progress);
    progress.append(
      h("div", { class: "progress-head" },
        h("strong", null, s.run.name), h("span", { class: `status status-${s.run.missing ? "deleted" : s.run.status}` }, s.run.missing ? "deleted" : s.run.status ?? "new"),
        h("span", { class: "step-count", "data-testid": "step-count" }, `step ${p.step ?? 0} / ${p.total ?? "?"}`),
        h("span", null, `runtime ${duration(p.runtime_s)}`),
        h("span", null, p.eta_s !== null ? `ETA ${duration(p.eta_s)}` : ""),
      ),
      segments,
      h("div", { class: "counts" }, ...Object.entries(s.counts).map(([k, v]) => h("span", null, `${k}: ${v}`)),
        s.run.skipped_lines ? h("span", { class: "warn" }, `skipped lines: ${s.run.skipped_lines}`) : null),
    );
  }

  function renderConfig(s: RunSummary): void {
    const cfg = (s.config ?? {}) as Record<string, unknown>;
    const envs = Array.isArray(cfg.environments) ? (cfg.environments as Record<string, unknown>[]) : [];
    clear(config);
    config.append(
      h("h2", null, "Config"),
      h("div", { class: "kv" },
        h("span", null, "model"), h("code", null, String(cfg.model ?? "–")),
        h("span", null, "algorithm"), h("code", null, String(cfg.algorithm ?? "–")),
        h("span", null, "trainer / inference"), h("code", null, `${cfg.train_backend ?? "–"} / ${cfg.inference_backend ?? "–"}`),
        h("span", null, "environments"), h("code", null, envs.map((e) => `${e.name} (reward ${e.reward_min ?? "?"}..${e.reward_max ?? "?"})`).join(", ") || "–"),
      ),
      h("details", null, h("summary", null, "Full config (config.yaml)"), h("pre", { class: "raw config-yaml" }, s.config_yaml ?? "(not written yet)")),
    );
  }

  async function renderDiff(): Promise<void> {
    const others = ctx.selected.filter((id) => id !== runId);
    clear(diff);
    diff.append(h("h2", null, "Config diff"));
    if (!others.length) {
      diff.append(h("p", { class: "muted" }, "Tick a second run in the sidebar to compare configs."));
      return;
    }
    const data = await get<{ differences: { key: string; a: unknown; b: unknown }[]; same: number }>("/api/config-diff", { a: runId, b: others[0] });
    diff.append(
      h("p", { class: "muted" }, `${ctx.runName(runId)} vs ${ctx.runName(others[0])}: ${data.differences.length} different, ${data.same} same`),
      h("table", { class: "table diff-table" },
        h("thead", null, h("tr", null, h("th", null, "key"), h("th", null, ctx.runName(runId)), h("th", null, ctx.runName(others[0])))),
        h("tbody", null, ...data.differences.map((d) => h("tr", null, h("td", null, d.key), h("td", null, JSON.stringify(d.a)), h("td", null, JSON.stringify(d.b)))))),
    );
  }

  function renderLogs(s: RunSummary): void {
    clear(logs);
    logs.append(h("h2", null, "Logs"), s.log_files.length
      ? h("ul", null, ...s.log_files.map((file) => h("li", null, h("a", { href: `#/logs?component=${encodeURIComponent(file.replace(/\.[^.]+$/, ""))}` }, file))))
      : h("p", { class: "muted" }, "No logs yet."));
  }

  // ----------------------------------------------------------------- code
  const codeTree = h("div", { class: "code-tree" });
  const codeView = h("pre", { class: "code-view", "data-testid": "code-view" }, "Pick a file.");
  let codeFiles: CodeFiles | null = null;
  let codeDiff: CodeDiff | null = null;
  let diffMode = false;

  /** Paths as nested folders: a folder's entries, then its files. */
  function tree(paths: string[], statuses: Map<string, string> | null): HTMLElement {
    const root = h("div", null);
    const folders = new Map<string, HTMLElement>([["", root]]);
    const folder = (path: string): HTMLElement => {
      const found = folders.get(path);
      if (found) return found;
      const cut = path.lastIndexOf("/");
      const parent = folder(cut < 0 ? "" : path.slice(0, cut));
      const box = h("details", { open: statuses !== null }, h("summary", null, path.slice(cut + 1) + "/"));
      parent.append(box);
      folders.set(path, box);
      return box;
    };
    for (const path of paths) {
      const cut = path.lastIndexOf("/");
      const status = statuses?.get(path) ?? "";
      folder(cut < 0 ? "" : path.slice(0, cut)).append(
        h("button", { class: `code-file ${status}`, "data-path": path, title: status || path, onclick: () => void openFile(path) },
          path.slice(cut + 1) + (status ? ` (${status})` : "")));
    }
    return root;
  }

  function showLines(text: string, diffView: boolean): void {
    clear(codeView);
    codeView.classList.toggle("diff", diffView);
    for (const line of text.replace(/\n$/, "").split("\n")) {
      const cls = !diffView ? "" : line.startsWith("@@") ? " hunk" : line.startsWith("+") ? " add" : line.startsWith("-") ? " del" : "";
      codeView.append(h("span", { class: `line${cls}` }, line));
    }
  }

  async function openFile(path: string): Promise<void> {
    for (const button of codeTree.querySelectorAll<HTMLElement>(".code-file")) button.classList.toggle("active", button.dataset.path === path);
    const other = ctx.selected.find((id) => id !== runId);
    if (diffMode && other) {
      const data = await get<{ diff: string }>("/api/code-diff", { a: runId, b: other, path });
      showLines(data.diff || "(no difference)", true);
    } else {
      showLines(await getText(`/api/code/${encodeURIComponent(runId)}/file`, { path }), false);
    }
  }

  async function renderCode(): Promise<void> {
    clear(code);
    code.append(h("h2", null, "Code"));
    try {
      codeFiles = await get<CodeFiles>(`/api/code/${encodeURIComponent(runId)}`);
    } catch {
      code.append(h("p", { class: "muted" }, "The code snapshot cannot be read (the run directory is gone)."));
      return;
    }
    if (!codeFiles.files.length) {
      code.append(h("p", { class: "muted" }, "This run has no code snapshot."));
      return;
    }
    const git = codeFiles.git ?? {};
    const other = ctx.selected.find((id) => id !== runId);
    const toggle = other
      ? h("label", null, h("input", { type: "checkbox", class: "code-diff-toggle", checked: diffMode, onchange: (event: Event) => {
          diffMode = (event.target as HTMLInputElement).checked;
          void renderCode();
        } }), ` diff against ${ctx.runName(other)}`)
      : null;
    let paths = codeFiles.files;
    let statuses: Map<string, string> | null = null;
    if (diffMode && other) {
      codeDiff = await get<CodeDiff>("/api/code-diff", { a: runId, b: other });
      paths = codeDiff.changed.map((c) => c.path);
      statuses = new Map(codeDiff.changed.map((c) => [c.path, c.status]));
    }
    code.append(
      h("div", { class: "toolbar" },
        h("span", { class: "muted" }, `${codeFiles.files.length} files` + (git.commit ? ` · git ${String(git.commit).slice(0, 10)}${git.branch ? ` (${git.branch})` : ""}${git.dirty ? ", with uncommitted changes" : ""}` : "")),
        toggle,
        diffMode && codeDiff ? h("span", { class: "muted code-diff-summary" }, `${codeDiff.changed.length} files differ, ${codeDiff.same} same`) : null),
      h("div", { class: "code-layout" }, codeTree, codeView));
    clear(codeTree);
    codeTree.append(tree(paths, statuses));
    showLines(diffMode ? "Pick a changed file for its diff." : "Pick a file.", false);
  }

  buildGrid();
  let diffShown = false;
  let codeShown = false;
  return {
    el,
    async refresh() {
      summary = await get<RunSummary>(`/api/runs/${encodeURIComponent(runId)}`);
      renderProgress(summary);
      if (!catalogLoaded) {
        renderConfig(summary);
        renderLogs(summary);
        const catalog = await get<{ sections: { name: string; groups: { metrics: { name: string }[] }[] }[] }>("/api/metrics/catalog", { runs: runId });
        clear(addSelect);
        addSelect.append(h("option", { value: "" }, "+ add a plot…"));
        for (const section of catalog.sections) {
          const group = h("optgroup", { label: section.name });
          for (const g of section.groups) for (const m of g.metrics) group.append(h("option", { value: m.name }, m.name));
          addSelect.append(group);
        }
        catalogLoaded = catalog.sections.length > 0;
      }
      if (!diffShown) {
        await renderDiff();
        diffShown = true;
      }
      if (!codeShown) {
        codeShown = true;
        await renderCode();
      }
      await loadSeries();
    },
    destroy() {
      for (const chart of charts.values()) chart.destroy();
    },
  };
}

export { fmt };
