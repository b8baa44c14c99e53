// DOM helpers. Text always goes in through textContent (never innerHTML), so model output,
// logs and config values are shown as text and can never become markup or script.

export type Child = Node | string | number | null | undefined | false;
export type Attrs = Record<string, string | number | boolean | null | undefined | EventListener>;

export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Attrs | null = null,
  ...children: (Child | Child[])[]
): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  if (attrs) {
    for (const [key, value] of Object.entries(attrs)) {
      if (value === null || value === undefined || value === false) continue;
      if (key.startsWith("on") && typeof value === "function") {
        el.addEventListener(key.slice(2), value as EventListener);
      } else if (key === "class") {
        el.className = String(value);
      } else if (key === "style") {
        el.setAttribute("style", String(value));
      } else if (key === "value" && "value" in el) {
        (el as HTMLInputElement).value = String(value);
      } else if (key === "checked" && "checked" in el) {
        (el as HTMLInputElement).checked = Boolean(value);
      } else {
        el.setAttribute(key, value === true ? "" : String(value));
      }
    }
  }
  append(el, children);
  return el;
}

export function append(el: Element, children: (Child | Child[])[]): void {
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

export function clear(el: Element): void {
  el.replaceChildren();
}

export function fmt(value: number | null | undefined, digits = 4): string {
  if (value === null || value === undefined || Number.isNaN(value)) return "–";
  if (value !== 0 && (Math.abs(value) >= 1e5 || Math.abs(value) < 1e-3)) return value.toExponential(2);
  return Number(value.toFixed(digits)).toString();
}

export function duration(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return "–";
  const s = Math.max(0, Math.round(seconds));
  const hours = Math.floor(s / 3600);
  const minutes = Math.floor((s % 3600) / 60);
  const secs = s % 60;
  return hours ? `${hours}h${String(minutes).padStart(2, "0")}m` : minutes ? `${minutes}m${String(secs).padStart(2, "0")}s` : `${secs}s`;
}

export function clock(seconds: number | null | undefined): string {
  if (!seconds) return "–";
  return new Date(seconds * 1000).toLocaleString();
}

export const PALETTE = [
  "#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#db2777", "#65a30d",
  "#4f46e5", "#b45309", "#0d9488", "#be123c", "#7c3aed", "#15803d", "#c2410c", "#0369a1",
  "#a21caf", "#4d7c0f", "#1d4ed8", "#b91c1c",
];

export function hashColor(text: string): string {
  let hash = 0;
  for (let i = 0; i < text.length; i++) hash = (hash * 31 + text.charCodeAt(i)) | 0;
  return PALETTE[Math.abs(hash) % PALETTE.length];
}

/** A red -> amber -> green colour for a value in [lo, hi] (grey when unknown). */
export function scaleColor(value: number | null | undefined, lo: number, hi: number, invert = false): string {
  if (value === null || value === undefined || !Number.isFinite(value) || hi <= lo) return "#9ca3af";
  let t = Math.min(1, Math.max(0, (value - lo) / (hi - lo)));
  if (invert) t = 1 - t;
  const hue = Math.round(t * 120);
  return `hsl(${hue} 70% 45%)`;
}

export function debounce<T extends unknown[]>(fn: (...args: T) => void, ms: number): (...args: T) => void {
  let timer: number | undefined;
  return (...args: T) => {
    window.clearTimeout(timer);
    timer = window.setTimeout(() => fn(...args), ms);
  };
}

export function store<T>(key: string, fallback: T): T {
  try {
    const raw = localStorage.getItem(`telescope-ui:${key}`);
    return raw === null ? fallback : (JSON.parse(raw) as T);
  } catch {
    return fallback;
  }
}

export function save(key: string, value: unknown): void {
  try {
    localStorage.setItem(`telescope-ui:${key}`, JSON.stringify(value));
  } catch {
    /* storage full or disabled: settings are not kept */
  }
}
