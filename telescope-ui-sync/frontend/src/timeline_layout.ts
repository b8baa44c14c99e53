// The timeline's geometry, as pure functions: rows inside a lane for events that overlap
// (so that 64 concurrent requests of one server are 64 bars, not one; the events of one
// browser session on one row), ticks at round offsets with labels precise enough for the
// zoom (sub-second when zoomed in), and distinct colours for event kinds (the browser's
// kinds fixed ones).

export interface Interval { start: number; end: number }
export interface GroupedInterval extends Interval { group?: string | null }

/**
 * A row for each interval (in the input's order) such that intervals in one row do not
 * overlap: greedy by start time, each interval in the lowest row free at its start.
 * The number of rows is the most intervals open at one time (the fewest possible).
 */
export function assignRows(intervals: Interval[]): number[] {
  const order = intervals.map((_, i) => i).sort((a, b) => intervals[a].start - intervals[b].start || a - b);
  const rowEnds: number[] = []; // end time of the last interval placed in each row
  const rows = new Array<number>(intervals.length).fill(0);
  for (const i of order) {
    const { start, end } = intervals[i];
    let row = rowEnds.findIndex((last) => last <= start);
    if (row < 0) { row = rowEnds.length; rowEnds.push(end); } else rowEnds[row] = Math.max(end, start);
    rows[i] = row;
  }
  return rows;
}

/**
 * Rows as {@link assignRows} gives them, except that intervals of one ``group`` (the events
 * of one browser session) share one row: the group's span, from its first start to its last
 * end, takes a row as one interval does. So an episode's actions read in order along one row,
 * and the lane has as many rows as episodes run at one time (not as actions do: an episode's
 * actions never overlap, so they alone would pack into a row or two and mix the episodes).
 */
export function assignGroupedRows(intervals: GroupedInterval[]): number[] {
  const spans: Interval[] = [];
  const spanOf = new Map<string, number>();
  const owner = intervals.map(({ start, end, group }) => {
    const known = group ? spanOf.get(group) : undefined;
    if (known === undefined) {
      spans.push({ start, end });
      if (group) spanOf.set(group, spans.length - 1);
      return spans.length - 1;
    }
    spans[known] = { start: Math.min(spans[known].start, start), end: Math.max(spans[known].end, end) };
    return known;
  });
  const rows = assignRows(spans);
  return owner.map((span) => rows[span]);
}

/** A round step (1, 2 or 5 times a power of ten seconds, or a round minute/hour) near ``span / count``. */
export function tickStep(span: number, count: number): number {
  const raw = Math.max(span, 1e-9) / Math.max(1, count);
  const nice = [60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400];
  if (raw >= 60) return nice.find((step) => step >= raw) ?? Math.ceil(raw / 86400) * 86400;
  const power = 10 ** Math.floor(Math.log10(raw));
  for (const mult of [1, 2, 5, 10]) if (mult * power >= raw) return mult * power;
  return 10 * power;
}

/** ``+h:mm:ss`` style offset, with as many decimals of a second as ``step`` needs. */
export function offsetLabel(offset: number, step: number): string {
  const decimals = step >= 1 ? 0 : Math.min(6, Math.ceil(-Math.log10(step) - 1e-9));
  const sign = offset < 0 ? "-" : "+";
  let rest = Math.abs(offset);
  const scale = 10 ** decimals;
  rest = Math.round(rest * scale) / scale;
  const hours = Math.floor(rest / 3600);
  const minutes = Math.floor((rest % 3600) / 60);
  const seconds = rest - hours * 3600 - minutes * 60;
  const secs = seconds.toFixed(decimals).padStart(decimals ? decimals + 3 : 2, "0");
  if (hours) return `${sign}${hours}h${String(minutes).padStart(2, "0")}m${secs}s`;
  if (minutes) return `${sign}${minutes}m${secs}s`;
  return `${sign}${seconds.toFixed(decimals)}s`;
}

/** Ticks of the window ``[start, end]`` at round offsets from ``origin``: (time, label), about ``count`` of them. */
export function timeTicks(start: number, end: number, origin: number, count = 8): { t: number; label: string }[] {
  const step = tickStep(end - start, count);
  const first = Math.ceil((start - origin) / step - 1e-9);
  const ticks: { t: number; label: string }[] = [];
  for (let k = first; origin + k * step <= end + 1e-9 && ticks.length < 4 * count; k++) {
    ticks.push({ t: origin + k * step, label: offsetLabel(k * step, step) });
  }
  return ticks;
}

// Colours kinds take first (no red: red marks errors), then hues spread by the golden angle.
const KIND_PALETTE = [
  "#2563eb", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#db2777", "#65a30d", "#4f46e5",
  "#b45309", "#0d9488", "#7c3aed", "#15803d", "#0369a1", "#a21caf", "#4d7c0f", "#1d4ed8",
  "#ca8a04", "#0e7490", "#6d28d9", "#57534e",
];
export const ERROR_COLOR = "#dc2626";
/**
 * The browser's kinds, fixed so that an episode's row reads the same in every run: its actions
 * (click, type, press, scroll) in strong distinct colours, what it observes (snapshot,
 * screenshot) and its plumbing (goto, evaluate, close) in greys and dark blue, a blocked
 * request in yellow. None is in the palette or red.
 */
export const FIXED_KIND_COLORS: ReadonlyMap<string, string> = new Map([
  ["browser.goto", "#1e3a8a"],
  ["browser.snapshot", "#94a3b8"],
  ["browser.screenshot", "#64748b"],
  ["browser.click", "#059669"],
  ["browser.type", "#c026d3"],
  ["browser.press", "#d97706"],
  ["browser.scroll", "#0284c7"],
  ["browser.evaluate", "#a8a29e"],
  ["browser.close", "#334155"],
  ["browser.blocked", "#facc15"],
]);

/** The ``index``-th colour of the kinds' sequence: the palette, then distinct hues (away from red). */
export function kindColor(index: number): string {
  if (index < KIND_PALETTE.length) return KIND_PALETTE[index];
  const hue = 30 + ((index - KIND_PALETTE.length) * 137.508) % 300; // 30..330: never the errors' red
  const light = 35 + ((index - KIND_PALETTE.length) % 3) * 10;
  return `hsl(${hue.toFixed(1)} 65% ${light}%)`;
}

/** Colours of event kinds: each kind its own, kept for the page's life (a new kind takes the next
 * free one; a kind of {@link FIXED_KIND_COLORS} always its fixed one). */
export class KindColors {
  private readonly known = new Map<string, string>();
  private next = 0; // the index of the next colour of the sequence

  /** Give colours to ``kinds`` not seen yet, in sorted order (so a page's first view is stable). */
  add(kinds: Iterable<string>): void {
    for (const kind of [...new Set(kinds)].sort()) {
      if (this.known.has(kind)) continue;
      this.known.set(kind, FIXED_KIND_COLORS.get(kind) ?? kindColor(this.next++));
    }
  }

  get(kind: string): string {
    if (!this.known.has(kind)) this.add([kind]);
    return this.known.get(kind)!;
  }
}
