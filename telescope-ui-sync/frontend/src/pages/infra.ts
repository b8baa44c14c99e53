// Infra: every numeric field of the run's infra.* events (system CPU/memory/disk/network,
// GPUs, torch memory per rank, inference-server gauges and rates), one chart per metric
// with one line per source (node, rank, server), x = seconds since the run's first sample.
import { get } from "../api";
import { clear, h, hashColor } from "../dom";
import type { Ctx, Page } from "../context";
import { LineChart } from "../charts";

interface InfraSeries { kind: string; source: string; name: string; t: number[]; v: number[] }
const SECTION_TITLES: Record<string, string> = { "infra.system": "System (CPU, memory, disk, network, GPU)", "infra.torch_memory": "Torch memory (trainer ranks)", "infra.inference": "Inference servers" };

export function infraPage(ctx: Ctx): Page {
  const runId = ctx.primary!;
  const box = h("div", { class: "sections" });
  const el = h("div", { class: "page infra" }, h("h1", null, "Infra"), box);
  const charts = new Map<string, LineChart>();
  let key = "";
  return {
    el,
    async refresh() {
      const data = await get<{ series: InfraSeries[] }>("/api/infra", { run: runId });
      const layout = JSON.stringify(data.series.map((s) => [s.kind, s.name, s.source]));
      if (layout !== key) {
        key = layout;
        for (const chart of charts.values()) chart.destroy();
        charts.clear();
        clear(box);
        if (!data.series.length) box.append(h("p", { class: "muted empty" }, "This run recorded no infra samples (infra.* events) yet."));
        const kinds = [...new Set(data.series.map((s) => s.kind))];
        for (const kind of kinds) {
          const grid = h("div", { class: "chart-grid" });
          box.append(h("details", { class: "section", open: true }, h("summary", null, SECTION_TITLES[kind] ?? kind), grid));
          for (const name of [...new Set(data.series.filter((s) => s.kind === kind).map((s) => s.name))]) {
            const chart = new LineChart(name, { ema: 0, outliers: false, yMin: null, yMax: null, xLabel: "seconds" }, "infra");
            charts.set(`${kind}|${name}`, chart);
            grid.append(chart.el);
          }
        }
      }
      const origin = Math.min(...data.series.map((s) => s.t[0] ?? Infinity));
      for (const [chartKey, chart] of charts) {
        const [kind, name] = chartKey.split("|");
        const parts = data.series.filter((s) => s.kind === kind && s.name === name);
        chart.setData(parts.map((s) => ({ run_id: s.source, name, x: s.t.map((t) => t - origin), y: s.v })),
          parts.map((s) => ({ id: s.source, label: s.source, color: hashColor(s.source) })));
      }
    },
    destroy() { for (const chart of charts.values()) chart.destroy(); },
  };
}
