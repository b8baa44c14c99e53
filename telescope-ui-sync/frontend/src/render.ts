// Model text rendered as DOM: Markdown (markdown-it's token stream turned into elements
// one by one, never innerHTML; raw HTML in the text stays text), LaTeX through KaTeX
// (which builds DOM nodes, with trust off; math is taken out before Markdown runs and put
// back after, see protectMath), code blocks, and <think> sections folded.
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
// Code (fenced blocks, indented blocks are left alone too: rare in model output) and math,
// in one pass: code is kept as it is, so that a `$` in code stays code.
const CODE_OR_MATH = new RegExp(String.raw`(^\s*\`\`\`[\s\S]*?(?:^\s*\`\`\`|(?![\s\S]))|\`[^\`\n]*\`)|` + MATH.source, "gm");
// A math segment's stand-in while Markdown runs: private-use characters Markdown leaves alone.
const HOLE = /\uE000(\d+)\uE001/g;

export type RenderMode = "markdown" | "raw";

/**
 * ``text`` with every math segment (``$...$``, ``$$...$$``, ``\(...\)``, ``\[...\]``
 * outside code) replaced by a stand-in, and the segments, so that Markdown cannot read
 * TeX as Markdown (``\,`` and ``\{`` as escapes, ``*`` and ``_`` as emphasis, ``\\`` of
 * matrices as a backslash). The stand-ins are put back as math when the text is drawn.
 */
export function protectMath(text: string): { text: string; math: string[] } {
  const math: string[] = [];
  const out = text.replace(CODE_OR_MATH, (whole: string, code: string | undefined) => {
    if (code !== undefined) return whole;
    math.push(whole);
    return `\uE000${math.length - 1}\uE001`;
  });
  return { text: out, math };
}

function renderMath(raw: string, parent: Node): void {
  const display = raw.startsWith("$$") || raw.startsWith("\\[");
  const tex = raw.startsWith("$$") ? raw.slice(2, -2) : raw.startsWith("$") ? raw.slice(1, -1) : raw.slice(2, -2);
  const span = h("span", { class: display ? "math display" : "math" });
  try {
    katex.render(tex, span, { throwOnError: false, displayMode: display, trust: false, output: "htmlAndMathml" });
  } catch {
    span.textContent = raw;
  }
  parent.appendChild(span);
}

/** Text with its math stand-ins drawn as math (``math`` holds the segments). */
function mathOrText(text: string, parent: Node, math: string[]): void {
  let last = 0;
  for (const match of text.matchAll(HOLE)) {
    const at = match.index ?? 0;
    if (at > last) parent.appendChild(document.createTextNode(text.slice(last, at)));
    const raw = math[Number(match[1])];
    if (raw === undefined) parent.appendChild(document.createTextNode(match[0]));
    else renderMath(raw, parent);
    last = at + match[0].length;
  }
  if (last < text.length) parent.appendChild(document.createTextNode(text.slice(last)));
}

/** Stand-ins back to their source text (where text is shown as it is: code, alt text). */
function restore(text: string, math: string[]): string {
  return text.replace(HOLE, (whole, index: string) => math[Number(index)] ?? whole);
}

function renderTokens(tokens: Token[], root: HTMLElement, math: string[]): void {
  const stack: HTMLElement[] = [root];
  const top = () => stack[stack.length - 1];
  for (const token of tokens) {
    if (token.type === "inline") {
      renderTokens(token.children ?? [], top(), math);
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
      mathOrText(token.content, top(), math);
    } else if (token.type === "code_inline") {
      top().appendChild(h("code", null, restore(token.content, math)));
    } else if (token.type === "fence" || token.type === "code_block") {
      const lang = token.info.trim().split(/\s+/)[0];
      top().appendChild(h("pre", { class: "code" }, h("code", { "data-lang": lang || null }, restore(token.content, math))));
    } else if (token.type === "softbreak") {
      top().appendChild(document.createTextNode("\n"));
    } else if (token.type === "hardbreak") {
      top().appendChild(document.createElement("br"));
    } else if (token.type === "hr") {
      top().appendChild(document.createElement("hr"));
    } else if (token.type === "image") {
      top().appendChild(h("span", { class: "image-alt" }, `[image: ${restore(token.content, math)}]`));
    } else {
      mathOrText(token.content, top(), math);
    }
  }
}

function renderSegment(text: string, mode: RenderMode): HTMLElement {
  if (mode === "raw") return h("pre", { class: "raw" }, text);
  const box = h("div", { class: "markdown" });
  const { text: safe, math } = protectMath(text);
  renderTokens(md.parse(safe, {}), box, math);
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
