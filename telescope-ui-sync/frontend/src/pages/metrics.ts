// Metrics: every metric of the compared runs in its section and group (see catalog.py),
// one canvas chart each with all compared runs overlaid. Controls: x by step or time,
// EMA, IQR outlier filter, declared ranges (environments' reward_min/max and
// metrics_ranges) as the Y range, a name filter, environment and sample-tag filters
// (the server computes the metrics the rollouts can give again from the rollouts that
// pass; a chart it cannot filter says "all rollouts"); per chart: outliers and Y min/max.
// Charts are built and fetched only for sections on screen; clicking a point opens that
// step's rollouts.
import { get, type MetricFilters, type RunSummary, type Section, type Series } from "../api";
import { clear, h, save, store } from "../dom";
import type { Ctx, Page } from "../context";
import { LineChart, type ChartSettings } from "../charts";

interface Settings { x: "step" | "time"; ema: number; outliers: boolean; declared: boolean; filter: string; envs: string[]; tags: string[] }

function declaredRange(name: string, summary: RunSummary | null): [number | null, number | null] {
  if (!summary) return [null, null];
  const { reward, metrics } = summary.ranges;
  if (/^reward\/(mean|min|max)$/.test(name)) {
    const bounds = Object.values(reward);
    const lows = bounds.map((b) => b[0]).filter((v): v is number => v !== null);
    const highs = bounds.map((b) => b[1]).filter((v): v is number => v !== null);
    return [lows.length ? Math.min(...lows) : null, highs.length ? Math.max(...highs) : null];
  }
  const match = /^sample_metrics\/(.+)\/(mean|min|max)$/.exec(name);
  if (match && metrics[match[1]]) return metrics[match[1]];
  return [null, null];
}

export function metricsPage(ctx: Ctx): Page {
  const settings: Settings = { ...{ x: "step", ema: 0, outliers: false, declared: true, filter: "", envs: [], tags: [] }, ...store<Partial<Settings>>("metrics-settings", {}) };
  const collapsed = new Set(store<string[]>("metrics-collapsed", []));
  const sectionsBox = h("div", { class: "sections" });
  const charts = new Map<string, LineChart>(); // metric name -> chart
  const sectionCharts = new Map<string, string[]>();
  const visible = new Set<string>();
  let sections: Section[] = [];
  let summary: RunSummary | null = null;
  const observer = new IntersectionObserver((entries) => {
    for (const entry of entries) {
      const name = (entry.target as HTMLElement).dataset.section!;
      if (entry.isIntersecting) { visible.add(name); void loadSection(name); } else visible.delete(name);
    }
  }, { rootMargin: "200px" });

  const persist = () => save("metrics-settings", settings);
  const xSelect = h("select", { onchange: () => { settings.x = xSelect.value as Settings["x"]; persist(); rebuild(); } },
    h("option", { value: "step" }, "Step"), h("option", { value: "time" }, "Time (s)"));
  xSelect.value = settings.x;
  const emaInput = h("input", { type: "number", min: 0, max: 100, value: settings.ema, class: "ema", onchange: () => {
    settings.ema = Math.max(0, Number(emaInput.value) || 0); persist();
    for (const chart of charts.values()) chart.update({ ema: settings.ema });
  } });
  const outliers = h("input", { type: "checkbox", checked: settings.outliers, onchange: () => {
    settings.outliers = outliers.checked; persist();
    for (const chart of charts.values()) chart.update({ outliers: settings.outliers });
  } });
  const declared = h("input", { type: "checkbox", checked: settings.declared, onchange: () => { settings.declared = declared.checked; persist(); rebuild(); } });
  const filter = h("input", { type: "search", placeholder: "Filter metrics…", value: settings.filter, class: "metric-filter", oninput: () => {
    settings.filter = filter.value; persist(); rebuild();
  } });
  const envMenu = h("details", { class: "filter-menu", "data-filter": "env" }, h("summary", null, "Environments"));
  const tagMenu = h("details", { class: "filter-menu", "data-filter": "tag" }, h("summary", null, "Tags"));
  const badges = h("span", { class: "filter-badges" });
  let options: MetricFilters = { environments: [], tags: [] };
  const el = h("div", { class: "page metrics" },
    h("div", { class: "toolbar sticky" }, h("h1", null, "Metrics"),
      h("label", null, "X ", xSelect), h("label", null, "EMA ", emaInput),
      h("label", null, outliers, " ignore outliers"), h("label", null, declared, " declared ranges"), filter,
      envMenu, tagMenu, badges,
      h("span", { class: "muted" }, `${ctx.selected.length} run(s): hover syncs all charts, click a point for its rollouts`)),
    sectionsBox);

  function filtering(): boolean {
    return settings.envs.length > 0 || settings.tags.length > 0;
  }

  function setFilter(kind: "envs" | "tags", value: string, on: boolean): void {
    const values = settings[kind].filter((v) => v !== value);
    settings[kind] = on ? [...values, value] : values;
    persist();
    renderFilters();
    void Promise.all([...visible].map((name) => loadSection(name)));
  }

  function renderMenu(menu: HTMLDetailsElement, kind: "envs" | "tags", values: string[], label: string): void {
    const summary = menu.querySelector("summary")!;
    summary.textContent = settings[kind].length ? `${label} (${settings[kind].length})` : label;
    for (const item of [...menu.children]) if (item !== summary) item.remove();
    menu.hidden = values.length === 0 && settings[kind].length === 0;
    for (const value of values) {
      menu.append(h("label", { class: "filter-option" },
        h("input", { type: "checkbox", checked: settings[kind].includes(value), "data-value": value,
          onchange: (event: Event) => setFilter(kind, value, (event.target as HTMLInputElement).checked) }), ` ${value}`));
    }
  }

  function renderFilters(): void {
    renderMenu(envMenu, "envs", options.environments, "Environments");
    renderMenu(tagMenu, "tags", options.tags, "Tags");
    clear(badges);
    for (const [kind, prefix] of [["envs", "env"], ["tags", "tag"]] as const) {
      for (const value of settings[kind]) {
        badges.append(h("span", { class: "badge filter-badge" }, `${prefix}: ${value} `,
          h("button", { class: "icon", title: "Remove this filter", onclick: () => setFilter(kind, value, false) }, "×")));
      }
    }
  }

  function chartSettings(name: string): ChartSettings {
    const [yMin, yMax] = settings.declared ? declaredRange(name, summary) : [null, null];
    return { ema: settings.ema, outliers: settings.outliers, yMin, yMax, xLabel: settings.x === "step" ? "step" : "seconds" };
  }

  function chartFor(name: string, label: string): LineChart {
    const chart = new LineChart(name, chartSettings(name), "metrics",
      settings.x === "step" ? (x) => ctx.navigate("rollouts", { step: Math.round(x) }) : undefined);
    const title = chart.el.querySelector(".chart-title")!;
    title.textContent = label === name ? name : `${label}`;
    title.setAttribute("title", name);
    const minInput = h("input", { type: "number", step: "any", placeholder: "min", class: "y-input" });
    const maxInput = h("input", { type: "number", step: "any", placeholder: "max", class: "y-input" });
    const own = h("input", { type: "checkbox", checked: settings.outliers });
    const apply = () => chart.update({
      outliers: own.checked,
      yMin: minInput.value === "" ? chartSettings(name).yMin : Number(minInput.value),
      yMax: maxInput.value === "" ? chartSettings(name).yMax : Number(maxInput.value),
    });
    for (const input of [minInput, maxInput, own]) input.addEventListener("change", apply);
    const panel = h("div", { class: "chart-settings", hidden: true }, h("label", null, own, " outliers"), " Y ", minInput, maxInput);
    title.append(h("button", { class: "icon", title: "Chart settings", onclick: () => { panel.hidden = !panel.hidden; } }, "⚙"));
    chart.el.insertBefore(panel, chart.el.children[1]);
    return chart;
  }

  function rebuild(): void {
    for (const chart of charts.values()) chart.destroy();
    charts.clear();
    sectionCharts.clear();
    observer.disconnect();
    clear(sectionsBox);
    const needle = settings.filter.trim().toLowerCase();
    for (const section of sections) {
      const box = h("div", { class: "chart-grid" });
      const names: string[] = [];
      for (const group of section.groups) {
        const metrics = group.metrics.filter((m) => !needle || m.name.toLowerCase().includes(needle));
        if (!metrics.length) continue;
        if (group.name) box.append(h("h3", { class: "group-title" }, group.name));
        for (const metric of metrics) {
          const chart = chartFor(metric.name, metric.label);
          charts.set(metric.name, chart);
          names.push(metric.name);
          box.append(chart.el);
        }
      }
      if (!names.length) continue;
      sectionCharts.set(section.name, names);
      const details = h("details", { class: "section", "data-section": section.name, open: !collapsed.has(section.name) },
        h("summary", null, `${section.name} (${names.length})`), box);
      details.addEventListener("toggle", () => {
        if (details.open) { collapsed.delete(section.name); void loadSection(section.name); } else collapsed.add(section.name);
        save("metrics-collapsed", [...collapsed]);
      });
      sectionsBox.append(details);
      observer.observe(details);
    }
  }

  async function loadSection(name: string): Promise<void> {
    const names = sectionCharts.get(name);
    const details = sectionsBox.querySelector<HTMLDetailsElement>(`details[data-section="${CSS.escape(name)}"]`);
    if (!names || !details?.open) return;
    const data = await get<{ series: Series[] }>("/api/metrics/series", {
      runs: ctx.selected.join(","), names: names.join(","), x: settings.x, env: settings.envs, tag: settings.tags,
    });
    const styles = ctx.selected.map((id) => ({ id, label: ctx.runName(id), color: ctx.color(id) }));
    for (const metric of names) {
      const chart = charts.get(metric);
      if (!chart) continue;
      const series = data.series.filter((s) => s.name === metric);
      chart.setData(series, styles);
      const unfiltered = filtering() && series.some((s) => s.filtered === false);
      chart.el.dataset.filtered = filtering() ? (unfiltered ? "no" : "yes") : "";
      chart.el.querySelector(".chart-title")!.classList.toggle("unfiltered", unfiltered);
    }
  }

  let catalogKey = "";
  return {
    el,
    async refresh() {
      if (!summary) summary = await get<RunSummary>(`/api/runs/${encodeURIComponent(ctx.primary!)}`);
      const catalog = await get<{ sections: Section[] }>("/api/metrics/catalog", { runs: ctx.selected.join(",") });
      const key = JSON.stringify(catalog.sections);
      if (key !== catalogKey) {
        catalogKey = key; // new metrics, perhaps new rollouts: the filters' choices too
        options = await get<MetricFilters>("/api/metrics/filters", { runs: ctx.selected.join(",") });
        renderFilters();
        sections = catalog.sections;
        rebuild();
        return; // the observer loads what is on screen
      }
      await Promise.all([...visible].map((name) => loadSection(name)));
    },
    destroy() {
      observer.disconnect();
      for (const chart of charts.values()) chart.destroy();
    },
  };
}
