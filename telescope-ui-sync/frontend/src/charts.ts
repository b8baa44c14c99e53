// Line charts on canvas (uPlot): several runs overlaid, EMA smoothing, IQR outlier filter,
// fixed Y range, a crosshair synced across every chart of a page, click to pick an x.
// Drag selects an x range to zoom into; the zoom is kept when new data arrives (every
// refresh) until a double click resets it; a drag or a double click is never taken for a click. Values
// in legends and on axes go through ``fmt`` (so 2e-4 is not "0"), and the Y axis is as
// wide as its longest label.
import uPlot from "uplot";
import "uplot/dist/uPlot.min.css";
import { fmt, h } from "./dom";
import type { Series } from "./api";

export interface RunStyle { id: string; label: string; color: string }
export interface ChartSettings {
  ema: number; // span; 0 or 1 = off
  outliers: boolean; // hide points outside 1.5 IQR
  yMin: number | null;
  yMax: number | null;
  xLabel: string;
}

export function ema(values: (number | null)[], span: number): (number | null)[] {
  if (span <= 1) return values;
  const alpha = 2 / (span + 1);
  let state: number | null = null;
  return values.map((v) => {
    if (v === null || v === undefined) return null;
    state = state === null ? v : alpha * v + (1 - alpha) * state;
    return state;
  });
}

export function dropOutliers(values: (number | null)[]): (number | null)[] {
  const finite = values.filter((v): v is number => v !== null && Number.isFinite(v)).sort((a, b) => a - b);
  if (finite.length < 8) return values;
  const q = (p: number) => finite[Math.min(finite.length - 1, Math.floor(p * (finite.length - 1)))];
  const q1 = q(0.25), q3 = q(0.75), iqr = q3 - q1;
  const lo = q1 - 1.5 * iqr, hi = q3 + 1.5 * iqr;
  return values.map((v) => (v === null || v < lo || v > hi ? null : v));
}

/** How long a click waits to be a double click before it picks. */
const DOUBLE_CLICK_MS = 300;
const AXIS_FONT = "12px system-ui, -apple-system, sans-serif";
let measurer: CanvasRenderingContext2D | null = null;

/** The width in CSS pixels a Y axis needs for ``labels`` (ticks, gap and text), at least 40. */
export function axisSize(labels: string[] | null | undefined, font = AXIS_FONT): number {
  measurer ??= document.createElement("canvas").getContext("2d");
  if (!measurer || !labels?.length) return 40;
  measurer.font = font;
  const widest = Math.max(...labels.map((label) => measurer!.measureText(label).width));
  return Math.max(40, Math.ceil(widest) + 18);
}

export class LineChart {
  readonly el: HTMLElement;
  private plot: uPlot | null = null;
  /** The x range the user zoomed into (null: the whole data), kept across data updates. */
  private zoom: [number, number] | null = null;
  private readonly body: HTMLElement;
  private signature = "";
  private series: Series[] = [];
  private runs: RunStyle[] = [];

  constructor(
    readonly title: string,
    private settings: ChartSettings,
    private readonly syncKey: string,
    private readonly onPick?: (x: number) => void,
    readonly height = 160,
  ) {
    this.body = h("div", { class: "chart-body" });
    this.el = h("div", { class: "chart", "data-metric": title }, h("div", { class: "chart-title", title }, title), this.body);
  }

  update(settings: Partial<ChartSettings>): void {
    this.settings = { ...this.settings, ...settings };
    this.signature = "";
    this.render();
  }

  setData(series: Series[], runs: RunStyle[]): void {
    this.series = series;
    this.runs = runs;
    this.render();
  }

  pointCount(): number {
    return this.series.reduce((n, s) => n + s.x.length, 0);
  }

  private render(): void {
    const shown = this.runs.filter((run) => this.series.some((s) => s.run_id === run.id && s.x.length));
    if (!shown.length) {
      this.destroy();
      this.body.replaceChildren(h("div", { class: "chart-empty" }, "no data"));
      return;
    }
    const tables: uPlot.AlignedData[] = shown.map((run) => {
      const s = this.series.find((x) => x.run_id === run.id)!;
      let ys = s.y;
      if (this.settings.outliers) ys = dropOutliers(ys);
      ys = ema(ys, this.settings.ema);
      return [s.x, ys] as uPlot.AlignedData;
    });
    const data = tables.length === 1 ? tables[0] : uPlot.join(tables);
    const signature = JSON.stringify([shown.map((r) => r.id + r.color), this.settings]);
    const width = Math.max(200, this.body.clientWidth || 360);
    if (this.plot && signature === this.signature) {
      this.plot.setData(data);
      if (this.zoom) this.plot.setScale("x", { min: this.zoom[0], max: this.zoom[1] });
      this.showRange();
      return;
    }
    this.destroy();
    this.signature = signature;
    const { yMin, yMax } = this.settings;
    const opts: uPlot.Options = {
      width,
      height: this.height,
      legend: { show: true, live: true },
      cursor: { sync: { key: this.syncKey, setSeries: false }, drag: { x: true, y: false } },
      scales: {
        x: { time: false },
        y: yMin !== null || yMax !== null
          ? { range: (_u, lo, hi) => [yMin ?? lo, yMax ?? hi] }
          : {},
      },
      axes: [
        { label: this.settings.xLabel, size: 36, labelSize: 14, font: AXIS_FONT, values: (_u, splits) => splits.map((v) => fmt(v, 4)) },
        { font: AXIS_FONT, size: (_u, values) => axisSize(values), values: (_u, splits) => splits.map((v) => fmt(v, 4)) },
      ],
      series: [{ label: this.settings.xLabel, value: (_u, v) => fmt(v, 4) }, ...shown.map((run) => ({
        label: run.label, stroke: run.color, width: 1.5, spanGaps: true, points: { show: false },
        value: (_u: uPlot, v: number | null) => fmt(v, 4),
      }))],
      hooks: {
        ready: [(u: uPlot) => this.listen(u)],
        setScale: [(_u: uPlot, key: string) => { if (key === "x") this.showRange(); }],
      },
    };
    this.body.replaceChildren();
    this.plot = new uPlot(opts, data, this.body);
    if (this.zoom) this.plot.setScale("x", { min: this.zoom[0], max: this.zoom[1] });
    this.showRange();
  }

  /** Drag to zoom (kept), double click to reset, click (not a drag) to pick an x. */
  private listen(u: uPlot): void {
    let dragged = false;
    u.over.addEventListener("mousedown", (down) => {
      dragged = false;
      window.addEventListener("mouseup", (up) => {
        dragged = Math.abs(up.clientX - down.clientX) > 4;
        if (!dragged) return;
        window.setTimeout(() => { // after uPlot applied the selection to the scale (in a microtask)
          const { min, max } = u.scales.x;
          if (min !== undefined && max !== undefined && min !== null && max !== null) this.zoom = [min, max];
          this.showRange();
        });
      }, { once: true });
    });
    let pick: number | undefined; // a click's pick waits for a second click (a double click resets instead)
    u.over.addEventListener("dblclick", () => { window.clearTimeout(pick); this.zoom = null; this.showRange(); });
    u.over.addEventListener("click", (event) => {
      window.clearTimeout(pick);
      const idx = u.cursor.idx;
      if (!this.onPick || dragged || event.detail > 1 || idx === null || idx === undefined) return;
      const x = u.data[0][idx];
      pick = window.setTimeout(() => this.onPick!(x), DOUBLE_CLICK_MS);
    });
  }

  /** The shown x range on the element (``data-x-range``; ``data-zoomed`` when the user zoomed). */
  private showRange(): void {
    const x = this.plot?.scales.x;
    if (x && x.min !== undefined && x.max !== undefined) this.el.dataset.xRange = `${x.min},${x.max}`;
    this.el.dataset.zoomed = this.zoom ? "yes" : "";
  }

  resize(): void {
    if (this.plot) this.plot.setSize({ width: Math.max(200, this.body.clientWidth), height: this.height });
  }

  destroy(): void {
    this.plot?.destroy();
    this.plot = null;
  }
}
