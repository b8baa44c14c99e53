// What every page gets: the runs, the selection (runs compared on every chart), colours,
// the route's parameters and navigation.
import type { Run } from "./api";

export interface Ctx {
  runs: Run[];
  selected: string[]; // compared runs, in the order picked (at most 20)
  primary: string | null; // the run a single-run page shows: the first selected
  color(runId: string): string;
  runName(runId: string): string;
  params: URLSearchParams;
  navigate(page: string, params?: Record<string, string | number>): void;
  setParams(params: Record<string, string | number | null>): void;
}

export interface Page {
  el: HTMLElement;
  refresh(): Promise<void>; // called about every second while the page is shown (live)
  destroy?(): void;
}

export type PageFactory = (ctx: Ctx) => Page;
