// Timeline: one canvas, one band per lane (trainer steps from the metrics, then each
// component's lanes: ranks, servers, sandboxes, browsers, ...); events of a lane that overlap in time
// (concurrent requests of a server) get a row each inside its band, and the events of one browser
// session (an episode) share one row, so that an episode's actions read in order along it (see
// api_timeline.py for why one lane of rows and not a lane per session); clicking one of them
// outlines the rest of its session. Wheel zooms around the pointer,
// drag pans, a click shows the event's fields. The server sends the window's events,
// fetched again after each zoom or pan; a window with too many sends its longest events
// and a density per lane and pixel-wide bucket (busy share as opacity, the colour of the
// bucket's longest event), drawn under them; a click on a bucket shows its longest event.
import { get, type Timeline, type TimelineEvent } from "../api";
import { clear, debounce, fmt, h } from "../dom";
import type { Ctx, Page } from "../context";
import { ERROR_COLOR, KindColors, assignGroupedRows, timeTicks } from "../timeline_layout";

const LANE_H = 22;
const LABEL_W = 170;
const AXIS_H = 24;
/** Height of one row of a lane whose events overlap (each overlapping event gets a row), and the most rows drawn. */
const ROW_H = 6;
const MAX_ROWS = 64;

interface Layout { top: number[]; height: number[]; rows: Map<number, number>; counts: number[]; total: number }

export function timelinePage(ctx: Ctx): Page {
  const runId = ctx.primary!;
  const canvas = h("canvas", { class: "timeline-canvas", "data-testid": "timeline-canvas" });
  const detail = h("div", { class: "card event-detail" }, h("p", { class: "muted" }, "Click an event for its details. Wheel: zoom, drag: pan."));
  const info = h("span", { class: "muted" });
  const legend = h("div", { class: "legend" });
  let data: Timeline | null = null;
  let view: { start: number; end: number } | null = null; // visible window (UNIX seconds)
  let fullRange: { start: number; end: number } | null = null;
  let userMoved = false;
  let drag: { x: number; start: number; end: number; moved: boolean } | null = null;
  let selected: number | null = null;
  let selectedGroup: string | null = null; // the session of the selected event, whose other events are outlined
  let layout: Layout = { top: [], height: [], rows: new Map(), counts: [], total: 0 };
  const colors = new KindColors();
  const el = h("div", { class: "page timeline" },
    h("div", { class: "toolbar" }, h("h1", null, "Timeline"),
      h("button", { onclick: () => { userMoved = false; view = fullRange; void load(); } }, "Reset zoom"), info),
    legend, h("div", { class: "timeline-box" }, canvas), detail);

  function laneIndex(): Map<string, number> {
    return new Map((data?.lanes ?? []).map((lane, i) => [lane.id, i]));
  }

  /** Each lane's band (top and height) and each drawn event's row in it (by seq). */
  function computeLayout(): Layout {
    const lanes = data?.lanes ?? [];
    const index = laneIndex();
    const byLane = new Map<number, TimelineEvent[]>();
    for (const ev of data?.events ?? []) {
      const row = index.get(ev.lane);
      if (row === undefined) continue;
      const list = byLane.get(row) ?? [];
      list.push(ev);
      byLane.set(row, list);
    }
    const rows = new Map<number, number>();
    const top: number[] = [], height: number[] = [], counts: number[] = [];
    let y = AXIS_H;
    lanes.forEach((_, i) => {
      const events = byLane.get(i) ?? [];
      const assigned = assignGroupedRows(events.map((ev) => ({ start: ev.start, end: ev.start + ev.duration, group: ev.group })));
      events.forEach((ev, k) => rows.set(ev.seq, Math.min(assigned[k], MAX_ROWS - 1)));
      const count = Math.min(MAX_ROWS, assigned.length ? Math.max(...assigned) + 1 : 1);
      counts.push(count);
      top.push(y);
      height.push(count > 1 ? Math.max(LANE_H, count * ROW_H + 4) : LANE_H);
      y += height[i];
    });
    return { top, height, rows, counts, total: y - AXIS_H };
  }

  function draw(): void {
    const ratio = window.devicePixelRatio || 1;
    const width = canvas.parentElement?.clientWidth || 900;
    const lanes = data?.lanes ?? [];
    layout = computeLayout();
    // the lanes as drawn (what the browser tests read)
    canvas.dataset.lanes = JSON.stringify(lanes.map((lane, i) => ({ id: lane.id, rows: layout.counts[i], top: layout.top[i], height: layout.height[i] })));
    const height = AXIS_H + Math.max(LANE_H, layout.total) + 4;
    canvas.width = width * ratio;
    canvas.height = height * ratio;
    canvas.style.width = `${width}px`;
    canvas.style.height = `${height}px`;
    const g = canvas.getContext("2d")!;
    g.scale(ratio, ratio);
    g.fillStyle = "#fff";
    g.fillRect(0, 0, width, height);
    if (!data || !view || !lanes.length) {
      g.fillStyle = "#6b7280";
      g.fillText("No timeline data yet.", 12, 20);
      return;
    }
    const span = Math.max(1e-6, view.end - view.start);
    const plotW = width - LABEL_W;
    const xOf = (t: number) => LABEL_W + ((t - view!.start) / span) * plotW;
    // axis: ticks at round offsets from the run's start, as precise as the zoom needs
    g.fillStyle = "#374151";
    g.font = "11px system-ui, sans-serif";
    const origin = fullRange?.start ?? view.start;
    const ticks = timeTicks(view.start, view.end, origin, Math.max(2, Math.floor(plotW / 110)));
    canvas.dataset.ticks = JSON.stringify(ticks.map((tick) => tick.label));
    for (const tick of ticks) {
      const x = xOf(tick.t);
      g.fillRect(x, AXIS_H - 6, 1, 6);
      g.fillText(tick.label, Math.min(x + 2, width - 60), 12);
    }
    // lanes
    lanes.forEach((lane, i) => {
      const y = layout.top[i];
      g.fillStyle = i % 2 ? "#f9fafb" : "#f3f4f6";
      g.fillRect(0, y, width, layout.height[i]);
      g.fillStyle = "#111827";
      g.fillText(`${lane.component} · ${lane.lane}`.slice(0, 28), 6, y + 15);
    });
    g.save();
    g.beginPath();
    g.rect(LABEL_W, AXIS_H, plotW, height - AXIS_H);
    g.clip();
    const steps = data.lanes.findIndex((lane) => lane.id === "trainer|steps");
    for (const s of data.steps) {
      const x0 = xOf(s.start), x1 = xOf(s.end);
      g.fillStyle = s.step % 2 ? "#60a5fa" : "#3b82f6";
      g.fillRect(x0, layout.top[steps] + 3, Math.max(1, x1 - x0), LANE_H - 6);
      if (x1 - x0 > 30) { g.fillStyle = "#fff"; g.fillText(`step ${s.step}`, x0 + 3, layout.top[steps] + 15); }
    }
    const index = laneIndex();
    const bins = data.bins;
    if (bins) {
      for (let i = 0; i < bins.lane.length; i++) {
        const row = index.get(lanes[bins.lane[i]]?.id ?? "");
        if (row === undefined) continue;
        const t0 = bins.origin + bins.bucket[i] * bins.width;
        const x0 = xOf(t0), x1 = xOf(t0 + bins.width);
        g.globalAlpha = Math.min(1, Math.max(0.2, bins.busy[i] / bins.width));
        g.fillStyle = bins.errors[i] ? ERROR_COLOR : colors.get(bins.kinds[bins.kind[i]] ?? "other");
        g.fillRect(x0, layout.top[row] + 6, Math.max(1, x1 - x0), layout.height[row] - 12);
      }
      g.globalAlpha = 1;
    }
    for (const ev of data.events) {
      const row = index.get(ev.lane);
      if (row === undefined) continue;
      const x0 = xOf(ev.start), x1 = xOf(ev.start + ev.duration);
      const [top, barH] = eventBox(row, ev.seq);
      g.fillStyle = ev.error ? ERROR_COLOR : colors.get(ev.kind);
      g.fillRect(x0, top, Math.max(2, x1 - x0), barH);
      if (ev.seq === selected) { g.strokeStyle = "#111"; g.lineWidth = 2; g.strokeRect(x0, top - 1, Math.max(2, x1 - x0), barH + 2); }
      else if (selectedGroup && ev.group === selectedGroup) { g.strokeStyle = "#111"; g.lineWidth = 1; g.strokeRect(x0, top - 0.5, Math.max(2, x1 - x0), barH + 1); }
    }
    g.restore();
  }

  /** The top and height of an event's bar: the whole band (less a margin) or its row in it. */
  function eventBox(lane: number, seq: number): [number, number] {
    if (layout.counts[lane] <= 1) return [layout.top[lane] + 4, LANE_H - 8];
    return [layout.top[lane] + 2 + (layout.rows.get(seq) ?? 0) * ROW_H, ROW_H - 1];
  }

  function eventAt(px: number, py: number): TimelineEvent | { step: number; start: number; end: number } | null {
    if (!data || !view || px < LABEL_W) return null;
    const width = canvas.clientWidth;
    const t = view.start + ((px - LABEL_W) / (width - LABEL_W)) * (view.end - view.start);
    const slack = (4 / (width - LABEL_W)) * (view.end - view.start);
    const row = layout.top.findIndex((top, i) => top <= py && py < top + layout.height[i]);
    const lane = data.lanes[row];
    if (!lane) return null;
    if (lane.id === "trainer|steps") return data.steps.find((s) => s.start - slack <= t && t <= s.end + slack) ?? null;
    const inRow = (ev: TimelineEvent) => { const [top, barH] = eventBox(row, ev.seq); return top - 1 <= py && py <= top + barH + 1; };
    const hit = data.events.find((ev) => ev.lane === lane.id && inRow(ev) && ev.start - slack <= t && t <= ev.start + ev.duration + slack);
    if (hit || !data.bins) return hit ?? null;
    const bins = data.bins; // else the bucket under the pointer: its longest event
    const laneAt = data.lanes.indexOf(lane);
    for (let i = 0; i < bins.lane.length; i++) {
      const t0 = bins.origin + bins.bucket[i] * bins.width;
      if (bins.lane[i] === laneAt && t0 - slack <= t && t <= t0 + bins.width + slack) {
        return { seq: bins.seq[i], kind: bins.kinds[bins.kind[i]] ?? "other", lane: lane.id, start: t0, duration: 0, step: null, error: bins.errors[i] > 0 };
      }
    }
    return null;
  }

  async function showDetail(hit: TimelineEvent | { step: number; start: number; end: number }): Promise<void> {
    clear(detail);
    if ("seq" in hit) {
      selected = hit.seq;
      const group = "group" in hit ? hit.group ?? null : null;
      selectedGroup = group;
      draw();
      const siblings = group ? (data?.events ?? []).filter((e) => e.group === group).sort((a, b) => a.start - b.start) : [];
      const ev = await get<Record<string, unknown>>(`/api/events/${encodeURIComponent(runId)}/${hit.seq}`);
      detail.append(h("h3", null, String(ev.kind)), h("div", { class: "kv" },
        h("span", null, "component / lane"), h("span", null, `${ev.component} · ${ev.lane}`),
        h("span", null, "start"), h("span", null, new Date(Number(ev.start) * 1000).toISOString()),
        h("span", null, "duration"), h("span", null, `${fmt(Number(ev.duration))} s`),
        h("span", null, "step"), h("span", null, String(ev.step ?? "–")),
        group ? h("span", null, "session") : null,
        group ? h("span", { class: "event-session" }, `${group}: ${siblings.length} events in view (${siblings.map((e) => e.kind.replace(/^browser\./, "")).join(" → ")})`.slice(0, 400)) : null,
        ev.error ? h("span", { class: "warn" }, "error") : null, ev.error ? h("span", { class: "warn" }, String(ev.error)) : null),
        h("pre", { class: "raw" }, JSON.stringify(ev.fields, null, 2)));
    } else {
      detail.append(h("h3", null, `trainer step ${hit.step}`), h("p", null, `${fmt(hit.end - hit.start)} s, ended ${new Date(hit.end * 1000).toISOString()}`),
        h("button", { onclick: () => ctx.navigate("rollouts", { step: hit.step }) }, "Its rollouts"));
    }
  }

  const reload = debounce(() => void load(), 150);

  canvas.addEventListener("wheel", (event) => {
    if (!view) return;
    event.preventDefault();
    const rect = canvas.getBoundingClientRect();
    const frac = Math.min(1, Math.max(0, (event.clientX - rect.left - LABEL_W) / (rect.width - LABEL_W)));
    const pivot = view.start + frac * (view.end - view.start);
    const factor = Math.exp(event.deltaY * 0.002);
    const span = Math.max(1e-3, (view.end - view.start) * factor);
    view = { start: pivot - frac * span, end: pivot + (1 - frac) * span };
    userMoved = true;
    draw();
    reload();
  }, { passive: false });
  canvas.addEventListener("mousedown", (event) => {
    if (view) drag = { x: event.clientX, start: view.start, end: view.end, moved: false };
  });
  window.addEventListener("mousemove", onMove);
  window.addEventListener("mouseup", onUp);
  function onMove(event: MouseEvent): void {
    if (!drag || !view) return;
    const dx = event.clientX - drag.x;
    if (Math.abs(dx) > 3) drag.moved = true;
    const perPx = (drag.end - drag.start) / (canvas.clientWidth - LABEL_W);
    view = { start: drag.start - dx * perPx, end: drag.end - dx * perPx };
    if (drag.moved) { userMoved = true; draw(); }
  }
  function onUp(event: MouseEvent): void {
    if (!drag) return;
    const wasDrag = drag.moved;
    drag = null;
    if (wasDrag) { reload(); return; }
    const rect = canvas.getBoundingClientRect();
    if (event.target !== canvas) return;
    const hit = eventAt(event.clientX - rect.left, event.clientY - rect.top);
    if (hit) void showDetail(hit);
  }

  function renderLegend(): void {
    const kinds = [...new Set([...(data?.events ?? []).map((e) => e.kind), ...(data?.bins?.kinds ?? [])].filter((k): k is string => Boolean(k)))].sort();
    colors.add(kinds);
    clear(legend);
    for (const kind of kinds) legend.append(h("span", { class: "legend-item", "data-kind": kind }, h("span", { class: "swatch", style: `background:${colors.get(kind)}` }), kind));
  }

  async function load(): Promise<void> {
    const buckets = Math.max(50, Math.round(((canvas.parentElement?.clientWidth || 900) - LABEL_W) / 4)); // 4 px each
    data = await get<Timeline>("/api/timeline", { run: runId, start: userMoved ? view?.start : null, end: userMoved ? view?.end : null, buckets });
    fullRange = data.range;
    if (!userMoved) view = data.window;
    info.textContent = data.range
      ? `${data.lanes.length} lanes, ${data.total} events in view${data.truncated ? ` (the longest ${data.events.length} drawn over their density: zoom in for the rest)` : ""}, ${data.steps.length} steps`
      : "";
    renderLegend();
    draw();
  }

  const onResize = () => draw();
  window.addEventListener("resize", onResize);
  return {
    el,
    async refresh() {
      if (drag) return;
      await load();
    },
    destroy() {
      window.removeEventListener("mousemove", onMove);
      window.removeEventListener("mouseup", onUp);
      window.removeEventListener("resize", onResize);
    },
  };
}
