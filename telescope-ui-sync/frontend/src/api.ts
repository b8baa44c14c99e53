// Typed calls to the JSON API (same origin).

export interface Progress { step: number | null; total: number | null; fraction: number | null; runtime_s: number | null; eta_s: number | null }
export interface Run {
  run_id: string; name: string; path: string; status: string | null; step: number | null;
  number_of_steps: number | null; start_time: number | null; end_time: number | null; missing: boolean;
  skipped_lines: number; progress: Progress; updated_time: number | null; data_time: number | null;
  /** Sealed blocks the syncer could not read and skipped (absent in a run summary). */
  bad_blocks?: BadBlock[];
}
export interface BadBlock { stream: string; file: string; error: string }
export interface Ranges { reward: Record<string, [number | null, number | null]>; metrics: Record<string, [number | null, number | null]> }
export interface RunSummary {
  run: Run; config: Record<string, unknown> | null; config_yaml: string | null; status: Record<string, unknown> | null;
  ranges: Ranges; counts: Record<string, number>; log_files: string[];
}
export interface CatalogMetric { name: string; label: string }
export interface Section { name: string; groups: { name: string; metrics: CatalogMetric[] }[] }
export interface Series { run_id: string; name: string; x: number[]; y: (number | null)[]; filtered?: boolean }
export interface MetricFilters { environments: string[]; tags: string[] }
export interface CodeFiles { files: string[]; summary: Record<string, unknown> | null; git: Record<string, unknown> | null }
export interface CodeDiff { changed: { path: string; status: "added" | "removed" | "modified" }[]; same: number }
export interface Sample {
  seq: number; step: number; group_index: number; rollout_index: number; sample_id: string; environment: string;
  reward: number | null; advantage: number | null; stop_reason: string | null; num_turns: number | null;
  prompt_tokens: number | null; completion_tokens: number | null; total_tokens: number | null;
  policy_version: number | null; error: string | null; discard_reason: string | null; sample_metrics: Record<string, number>;
}
export interface SearchResult { seq: number; step: number; group_index: number; rollout_index: number; reward: number | null; field: string; snippet: string; discard_reason: string | null }
export interface Lane { id: string; component: string; lane: string }
// group: the episode whose events share one row of their lane (a browser event's session), else null.
export interface TimelineEvent { seq: number; kind: string; lane: string; start: number; duration: number; step: number | null; error: boolean; group?: string | null }
// A fuller window's density, per lane and bucket (columns of equal length): lane indexes
// Timeline.lanes, bucket counts `width` seconds from `origin`, kind indexes `kinds`.
export interface TimelineBins {
  origin: number; width: number; kinds: (string | null)[];
  lane: number[]; bucket: number[]; count: number[]; busy: number[]; errors: number[]; seq: number[]; kind: number[];
}
export interface Timeline {
  range: { start: number; end: number } | null; window: { start: number; end: number } | null; lanes: Lane[];
  events: TimelineEvent[]; bins: TimelineBins | null; steps: { step: number; start: number; end: number }[];
  truncated: boolean; total: number;
}

export class ApiError extends Error {
  constructor(public status: number, message: string) { super(message); }
}

type Param = string | number | boolean | null | undefined;

export async function get<T>(path: string, params: Record<string, Param | Param[]> = {}): Promise<T> {
  const query = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    for (const item of Array.isArray(value) ? value : [value]) if (item !== null && item !== undefined && item !== "") query.append(key, String(item));
  }
  const url = query.toString() ? `${path}?${query}` : path;
  const response = await fetch(url, { headers: { Accept: "application/json" } });
  if (!response.ok) {
    let detail = response.statusText;
    try { detail = (await response.json()).detail ?? detail; } catch { /* not JSON */ }
    throw new ApiError(response.status, String(detail));
  }
  return (await response.json()) as T;
}

export async function getText(path: string, params: Record<string, string>): Promise<string> {
  const response = await fetch(`${path}?${new URLSearchParams(params)}`);
  if (!response.ok) throw new ApiError(response.status, await response.text());
  return response.text();
}

export async function remove(path: string): Promise<void> {
  const response = await fetch(path, { method: "DELETE", headers: { Accept: "application/json" } });
  if (!response.ok) {
    let detail = response.statusText;
    try { detail = (await response.json()).detail ?? detail; } catch { /* not JSON */ }
    throw new ApiError(response.status, String(detail));
  }
}
