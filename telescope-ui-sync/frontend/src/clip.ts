// Long model text is cut before it is rendered: Markdown and KaTeX over megabytes of output
// freeze the tab. The first CLIP_CHARS characters are rendered with a note of how much is left
// and a button that renders the whole text in its place (the text is already loaded: nothing
// is fetched again).
import { h } from "./dom";

export const CLIP_CHARS = 20_000;

export function clipped(text: string, render: (text: string) => HTMLElement, limit = CLIP_CHARS): HTMLElement {
  if (text.length <= limit) return render(text);
  const box = h("div", { class: "clipped" });
  const showAll = h("button", { class: "show-all", onclick: () => box.replaceChildren(render(text)) },
    `Show all ${text.length.toLocaleString()} characters`);
  box.append(render(text.slice(0, limit)),
    h("div", { class: "clipped-note" }, `… ${(text.length - limit).toLocaleString()} more characters not shown. `, showAll));
  return box;
}
