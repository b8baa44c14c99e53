// Model text rendered as DOM: Markdown (markdown-it's token stream turned into elements
// one by one, never innerHTML; raw HTML in the text stays text), LaTeX through KaTeX
// (which builds DOM nodes, with trust off), code blocks, and <think> sections folded.
import MarkdownIt from "markdown-it";
import type Token from "markdown-it/lib/token.mjs";
import katex from "katex";
import "katex/dist/katex.min.css";
import { h } from "./dom";

const md = new MarkdownIt({ html: false, linkify: false, typographer: false });
const SAFE_TAGS = new Set([
  "p", "h1", "h2", "h3", "h4", "h5", "h6", "ul", "ol", "li", "blockquote", "em", "strong", "s", "table", "thead",
  "tbody", "tr", "th", "td", "code", "pre", "hr", "br", "a", "del",
]);
const MATH = /(\$\$[\s\S]+?\$\$|\\\[[\s\S]+?\\\]|\\\([\s\S]+?\\\)|\$[^$\n]+?\$)/g;

export type RenderMode = "markdown" | "raw";

function mathOrText(text: string, parent: Node): void {
  let last = 0;
  for (const match of text.matchAll(MATH)) {
    const at = match.index ?? 0;
    if (at > last) parent.appendChild(document.createTextNode(text.slice(last, at)));
    const raw = match[0];
    const display = raw.startsWith("$$") || raw.startsWith("\\[");
    const tex = raw.startsWith("$$") ? raw.slice(2, -2) : raw.startsWith("$") ? raw.slice(1, -1) : raw.slice(2, -2);
    const span = h("span", { class: display ? "math display" : "math" });
    try {
      katex.render(tex, span, { throwOnError: false, displayMode: display, trust: false, output: "htmlAndMathml" });
    } catch {
      span.textContent = raw;
    }
    parent.appendChild(span);
    last = at + raw.length;
  }
  if (last < text.length) parent.appendChild(document.createTextNode(text.slice(last)));
}

function renderTokens(tokens: Token[], root: HTMLElement): void {
  const stack: HTMLElement[] = [root];
  const top = () => stack[stack.length - 1];
  for (const token of tokens) {
    if (token.type === "inline") {
      renderTokens(token.children ?? [], top());
      continue;
    }
    if (token.nesting === 1) {
      const tag = SAFE_TAGS.has(token.tag) ? token.tag : "span";
      const el = document.createElement(tag);
      if (tag === "a") {
        const href = token.attrGet("href") ?? "";
        if (/^https?:\/\//i.test(href)) {
          el.setAttribute("href", href);
          el.setAttribute("rel", "noopener noreferrer nofollow");
          el.setAttribute("target", "_blank");
        }
      }
      top().appendChild(el);
      stack.push(el);
    } else if (token.nesting === -1) {
      if (stack.length > 1) stack.pop();
    } else if (token.type === "text") {
      mathOrText(token.content, top());
    } else if (token.type === "code_inline") {
      top().appendChild(h("code", null, token.content));
    } else if (token.type === "fence" || token.type === "code_block") {
      const lang = token.info.trim().split(/\s+/)[0];
      top().appendChild(h("pre", { class: "code" }, h("code", { "data-lang": lang || null }, token.content)));
    } else if (token.type === "softbreak") {
      top().appendChild(document.createTextNode("\n"));
    } else if (token.type === "hardbreak") {
      top().appendChild(document.createElement("br"));
    } else if (token.type === "hr") {
      top().appendChild(document.createElement("hr"));
    } else if (token.type === "image") {
      top().appendChild(h("span", { class: "image-alt" }, `[image: ${token.content}]`));
    } else {
      top().appendChild(document.createTextNode(token.content));
    }
  }
}

function renderSegment(text: string, mode: RenderMode): HTMLElement {
  if (mode === "raw") return h("pre", { class: "raw" }, text);
  const box = h("div", { class: "markdown" });
  renderTokens(md.parse(text, {}), box);
  return box;
}

/** Text with its <think> … </think> sections in folded boxes, the rest rendered by ``mode``. */
export function renderText(text: string | null | undefined, mode: RenderMode): HTMLElement {
  const box = h("div", { class: "rendered" });
  const value = text ?? "";
  const parts = value.split(/(<think>[\s\S]*?(?:<\/think>|$))/g);
  for (const part of parts) {
    if (!part) continue;
    if (part.startsWith("<think>")) {
      const inner = part.replace(/^<think>/, "").replace(/<\/think>$/, "");
      box.appendChild(h("details", { class: "think" }, h("summary", null, "think"), renderSegment(inner, mode)));
    } else {
      box.appendChild(renderSegment(part, mode));
    }
  }
  return box;
}
