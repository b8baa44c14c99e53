// Evals: each eval's results (before, periodic, after training) as a table, and each eval
// metric over steps as a chart with every compared run overlaid.
import { get, type Series } from "../api";
import { clear, clock, fmt, h } from "../dom";
import type { Ctx, Page } from "../context";
import { LineChart } from "../charts";

interface EvalResult { seq: number; name: string; step: number; time: number; phase: string | null; metrics: Record<string, number> }

export function evalsPage(ctx: Ctx): Page {
  const runId = ctx.primary!;
  const tables = h("div", null);
  const grid = h("div", { class: "chart-grid" });
  const el = h("div", { class: "page evals" }, h("h1", null, "Evals"), tables, h("h2", null, "Over steps"), grid);
  const charts = new Map<string, LineChart>();
  let key = "";
  return {
    el,
    async refresh() {
      const data = await get<{ evals: EvalResult[]; names: string[] }>("/api/evals", { run: runId });
      const metrics = [...new Set(data.evals.flatMap((e) => Object.keys(e.metrics)))].sort();
      const layout = JSON.stringify([data.evals.length, metrics]);
      if (layout !== key) {
        key = layout;
        clear(tables);
        if (!data.evals.length) tables.append(h("p", { class: "muted" }, "No eval results yet."));
        for (const name of data.names) {
          const rows = data.evals.filter((e) => e.name === name);
          const cols = [...new Set(rows.flatMap((r) => Object.keys(r.metrics)))].sort();
          tables.append(h("section", { class: "card" }, h("h2", null, name),
            h("table", { class: "table eval-table" },
              h("thead", null, h("tr", null, h("th", null, "phase"), h("th", null, "step"), h("th", null, "time"), ...cols.map((c) => h("th", null, c.replace(`eval/${name}/`, ""))))),
              h("tbody", null, ...rows.map((r) => h("tr", null, h("td", null, r.phase ?? ""), h("td", null, String(r.step)), h("td", null, clock(r.time)),
                ...cols.map((c) => h("td", null, fmt(r.metrics[c])))))))));
        }
        for (const chart of charts.values()) chart.destroy();
        charts.clear();
        clear(grid);
        for (const metric of metrics) {
          const chart = new LineChart(metric, { ema: 0, outliers: false, yMin: null, yMax: null, xLabel: "step" }, "evals");
          charts.set(metric, chart);
          grid.append(chart.el);
        }
      }
      if (metrics.length) {
        const series = await get<{ series: Series[] }>("/api/metrics/series", { runs: ctx.selected.join(","), names: metrics.join(",") });
        const styles = ctx.selected.map((id) => ({ id, label: ctx.runName(id), color: ctx.color(id) }));
        for (const [metric, chart] of charts) chart.setData(series.series.filter((s) => s.name === metric), styles);
      }
    },
    destroy() { for (const chart of charts.values()) chart.destroy(); },
  };
}
