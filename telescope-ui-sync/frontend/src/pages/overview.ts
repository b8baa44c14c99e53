// Overview: progress with runtime and ETA, a grid of plots (editable, kept in the browser),
// the config (summary, full YAML, diff against another compared run), and the log files.
import { get, type RunSummary, type Series } from "../api";
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
  const el = h("div", { class: "page overview" },
    h("h1", null, "Overview"), progress,
    h("section", { class: "card" },
      h("div", { class: "toolbar" }, h("strong", null, "Plots"), addSelect, h("label", null, "EMA ", emaInput)),
      grid),
    config, diff, logs);
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

  buildGrid();
  let diffShown = false;
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
      await loadSeries();
    },
    destroy() {
      for (const chart of charts.values()) chart.destroy();
    },
  };
}

export { fmt };
