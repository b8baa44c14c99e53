// Rollouts (and Discarded): step navigation, groups and samples coloured by reward (the
// environment's declared range), advantage (±sqrt(G-1)) or length (max_tokens), full-text
// search over prompts, completions and tool output, one sample in full (Markdown/LaTeX/
// code/think rendering or raw text, turns and tool calls; an episode of tool calls as its steps,
// with the page's screenshots when it kept some: see ../episode.ts), and two samples side by side.
import { get, type RunSummary, type Sample, type SearchResult, type Series } from "../api";
import { clear, debounce, fmt, h, save, scaleColor, store } from "../dom";
import type { Ctx, Page } from "../context";
import { renderText, type RenderMode } from "../render";
import { clipped } from "../clip";
import { isToolEpisode, renderEpisode } from "../episode";
import { LineChart } from "../charts";

type ColorBy = "reward" | "advantage" | "length";
const DISCARDED_CHARTS = ["discarded/count", "discarded/pct", "discarded/zero_advantage/count", "discarded/max_async/count", "discarded/canceled/count", "discarded/tokens/completion/mean"];

export function rolloutsPage(ctx: Ctx, discarded: boolean): Page {
  const runId = ctx.primary!;
  let steps: { step: number; count: number; reward_mean: number | null }[] = [];
  let step: number | null = ctx.params.has("step") ? Number(ctx.params.get("step")) : null;
  let samples: Sample[] = [];
  let summary: RunSummary | null = null;
  let colorBy: ColorBy = store<ColorBy>("rollouts-color", "reward");
  let mode: RenderMode = store<RenderMode>("rollouts-render", "markdown");
  let sideBySide = false;
  let active = 0; // which pane a click fills
  const panes: (number | null)[] = [ctx.params.has("seq") ? Number(ctx.params.get("seq")) : null, null];
  let follow = step === null; // stay on the newest step while the run writes

  const stepInput = h("input", { type: "number", class: "step-input", "aria-label": "Go to step" });
  const stepInfo = h("span", { class: "muted step-info" });
  const list = h("div", { class: "sample-list" });
  const paneBox = h("div", { class: "panes" });
  const searchInput = h("input", { type: "search", placeholder: "Search prompts, completions, tool output…", class: "search-input" });
  const searchResults = h("div", { class: "search-results" });
  const colorSelect = h("select", { onchange: () => { colorBy = colorSelect.value as ColorBy; save("rollouts-color", colorBy); renderList(); } },
    h("option", { value: "reward" }, "reward"), h("option", { value: "advantage" }, "advantage"), h("option", { value: "length" }, "length"));
  colorSelect.value = colorBy;
  const modeSelect = h("select", { onchange: () => { mode = modeSelect.value as RenderMode; save("rollouts-render", mode); void renderPanes(); } },
    h("option", { value: "markdown" }, "Markdown + LaTeX"), h("option", { value: "raw" }, "Raw text"));
  modeSelect.value = mode;
  const sideButton = h("button", { class: "toggle", onclick: () => {
    sideBySide = !sideBySide; sideButton.classList.toggle("on", sideBySide); active = sideBySide ? 1 : 0; void renderPanes();
  } }, "Side by side");
  const chartsBox = h("div", { class: "chart-grid" });
  const el = h("div", { class: `page rollouts${discarded ? " discarded" : ""}` },
    h("div", { class: "toolbar" }, h("h1", null, discarded ? "Discarded rollouts" : "Rollouts"), searchInput, h("label", null, "colour ", colorSelect),
      h("label", null, "render ", modeSelect), sideButton),
    searchResults,
    h("div", { class: "rollouts-layout" },
      h("div", { class: "picker" },
        h("div", { class: "pager" },
          h("button", { onclick: () => go(steps[0]?.step), title: "First step" }, "«"),
          h("button", { onclick: () => go(neighbour(-1)), title: "Previous step" }, "◀"),
          stepInput,
          h("button", { onclick: () => go(neighbour(1)), title: "Next step" }, "▶"),
          h("button", { onclick: () => { follow = true; go(steps[steps.length - 1]?.step); }, title: "Last step" }, "»")),
        stepInfo, list),
      paneBox),
    discarded ? h("section", { class: "card" }, h("h2", null, "Discarded rollouts over steps"), chartsBox) : null);
  stepInput.addEventListener("change", () => go(Number(stepInput.value)));

  function neighbour(delta: number): number | undefined {
    const index = steps.findIndex((s) => s.step === step);
    return steps[Math.min(steps.length - 1, Math.max(0, (index < 0 ? steps.length : index) + delta))]?.step;
  }

  function go(next: number | undefined): void {
    if (next === undefined || Number.isNaN(next)) return;
    follow = next === steps[steps.length - 1]?.step;
    step = next;
    ctx.setParams({ step: next });
    void loadStep();
  }

  function rewardRange(sample: Sample): [number, number] {
    const declared = summary?.ranges.reward[sample.environment];
    const rewards = samples.map((s) => s.reward).filter((r): r is number => r !== null);
    const lo = declared?.[0] ?? Math.min(...rewards, 0);
    const hi = declared?.[1] ?? Math.max(...rewards, 1);
    return [lo, hi];
  }

  function sampleColor(sample: Sample, groupSize: number): string {
    if (colorBy === "advantage") {
      const bound = Math.sqrt(Math.max(1, groupSize - 1));
      return scaleColor(sample.advantage, -bound, bound);
    }
    if (colorBy === "length") {
      const max = Number((summary?.config as Record<string, unknown> | null)?.max_tokens ?? 0) || Math.max(...samples.map((s) => s.completion_tokens ?? 0), 1);
      return scaleColor(sample.completion_tokens, 0, max, true);
    }
    const [lo, hi] = rewardRange(sample);
    return scaleColor(sample.reward, lo, hi);
  }

  function renderList(): void {
    clear(list);
    const groups = new Map<number, Sample[]>();
    for (const sample of samples) groups.set(sample.group_index, [...(groups.get(sample.group_index) ?? []), sample]);
    if (!samples.length) {
      list.append(h("p", { class: "muted" }, discarded
        ? "No discarded rollouts are recorded in this run store (their counts are in the charts below)."
        : "No rollouts at this step yet."));
    }
    for (const [group, members] of groups) {
      const rewards = members.map((m) => m.reward ?? 0);
      const reason = members.find((m) => m.discard_reason)?.discard_reason;
      list.append(h("div", { class: "group" },
        h("div", { class: "group-head" }, `group ${group}`, h("span", { class: "muted" }, ` mean ${fmt(rewards.reduce((a, b) => a + b, 0) / rewards.length, 3)}`),
          reason ? h("span", { class: "badge" }, reason.replace(/_/g, " ")) : null),
        h("div", { class: "dots" }, ...members.map((sample) => h("button", {
          class: `sample-dot${panes.includes(sample.seq) ? " current" : ""}`,
          style: `background:${sampleColor(sample, members.length)}`,
          title: `sample ${sample.rollout_index}: reward ${fmt(sample.reward)}, advantage ${fmt(sample.advantage)}, ${sample.completion_tokens ?? "?"} tokens`,
          "data-seq": sample.seq,
          onclick: () => open(sample.seq),
        }, String(sample.rollout_index))))));
    }
  }

  function open(seq: number): void {
    panes[sideBySide ? active : 0] = seq;
    if (sideBySide) active = active === 0 ? 1 : 0;
    if (!sideBySide) ctx.setParams({ seq });
    renderList();
    void renderPanes();
  }

  async function renderPane(seq: number | null, index: number): Promise<HTMLElement> {
    const pane = h("div", { class: `pane${sideBySide && active === index ? " active" : ""}`, "data-pane": index, onclick: () => { if (sideBySide) { active = index; void renderPanes(); } } });
    if (seq === null) {
      pane.append(h("p", { class: "muted" }, sideBySide ? "Click a sample to show it here." : "Pick a sample on the left."));
      return pane;
    }
    const data = await get<{ summary: Sample; record: Record<string, unknown> }>("/api/rollouts/sample", { run: runId, seq });
    const s = data.summary;
    const record = data.record;
    const messages = Array.isArray(record.messages) ? (record.messages as Record<string, unknown>[]) : [];
    pane.append(
      h("div", { class: "sample-head" }, `Step ${s.step} · Group ${s.group_index} · Sample ${s.rollout_index}`, s.discard_reason ? h("span", { class: "badge" }, s.discard_reason) : null),
      h("div", { class: "kv sample-kv" },
        h("span", null, "reward"), h("b", { style: `color:${scaleColor(s.reward, ...rewardRange(s))}` }, fmt(s.reward)),
        h("span", null, "advantage"), h("b", null, fmt(s.advantage)),
        h("span", null, "tokens"), h("span", null, `prompt ${s.prompt_tokens ?? "?"} · completion ${s.completion_tokens ?? "?"} · total ${s.total_tokens ?? "?"}`),
        h("span", null, "stop reason"), h("span", null, s.stop_reason ?? "–"),
        h("span", null, "policy version"), h("span", null, String(s.policy_version ?? "–")),
        h("span", null, "environment"), h("span", null, `${s.environment} · ${s.sample_id}`),
        s.error ? h("span", { class: "warn" }, "error") : null, s.error ? h("span", { class: "warn" }, s.error) : null,
        ...Object.entries(s.sample_metrics).flatMap(([k, v]) => {
          const range = summary?.ranges.metrics[k];
          return [h("span", { class: "muted" }, k), h("span", { style: range ? `color:${scaleColor(v, range[0] ?? 0, range[1] ?? 1)}` : null }, fmt(v))];
        })),
      h("h4", null, "Prompt"), renderPrompt(record.prompt),
    );
    pane.append(h("h4", null, "Completion"), h("div", { class: "completion" }, clipped(String(record.completion ?? ""), (text) => renderText(text, mode))));
    const turns = messages.filter((m) => m.role !== "user" && m.role !== "system");
    if (isToolEpisode(record)) {
      pane.append(renderEpisode(runId, record, mode));
    } else if (turns.length > 1 || turns.some((m) => m.tool_calls || m.role === "tool")) {
      pane.append(h("h4", null, `Turns and tool calls (${turns.length})`));
      for (const message of turns) pane.append(renderMessage(message));
    }
    const segments = Array.isArray(record.segment_turns) ? (record.segment_turns as Record<string, unknown>[][]) : [];
    const lastTurns = Array.isArray(record.turns) ? (record.turns as Record<string, unknown>[]) : [];
    const spans = (t: Record<string, unknown>) => (Array.isArray(t.versions) ? t.versions.length : 0);
    if (segments.length || lastTurns.length > 1 || lastTurns.some((t) => spans(t) > 1)) {
      pane.append(h("h4", null, segments.length
        ? `Context segments (${segments.length + 1}), compacted ${String(record.compactions ?? segments.length)} times`
        : "Turns and policy versions"));
      [...segments, lastTurns].forEach((turns, i) => pane.append(renderSegment(turns, i, segments.length)));
    }
    const calls = Array.isArray(record.agent_calls) ? (record.agent_calls as Record<string, unknown>[]) : [];
    if (calls.length) {
      const sequences = new Set(calls.map((c) => c.sequence)).size;
      pane.append(h("h4", null, `Agent calls (${calls.length}), trained as ${sequences} sample${sequences === 1 ? "" : "s"}`));
      for (const call of calls) pane.append(renderAgentCall(call, calls));
    }
    pane.append(h("details", { class: "raw-record" }, h("summary", null, "Raw record"), h("pre", { class: "raw" }, JSON.stringify(record, null, 2))));
    return pane;
  }

  function renderPrompt(prompt: unknown): HTMLElement {
    if (Array.isArray(prompt)) return h("div", null, ...prompt.map((m) => renderMessage(m as Record<string, unknown>)));
    return h("div", { class: "prompt" }, clipped(String(prompt ?? ""), (text) => renderText(text, mode)));
  }

  function renderMessage(message: Record<string, unknown>): HTMLElement {
    const role = String(message.role ?? "?");
    const content = typeof message.content === "string" ? message.content : JSON.stringify(message.content ?? "");
    const box = h("div", { class: `message role-${role.replace(/[^a-z]/g, "")}` }, h("div", { class: "role" }, role), clipped(content, (text) => renderText(text, role === "tool" ? "raw" : mode)));
    const calls = Array.isArray(message.tool_calls) ? (message.tool_calls as Record<string, unknown>[]) : [];
    for (const call of calls) {
      const fn = (call.function ?? call) as Record<string, unknown>;
      box.append(h("details", { class: "tool-call" }, h("summary", null, `tool call: ${String(fn.name ?? "?")}`),
        h("pre", { class: "raw" }, typeof fn.arguments === "string" ? fn.arguments : JSON.stringify(fn.arguments ?? call, null, 2))));
    }
    return box;
  }

  /** One context segment of an episode (the last one is its main sequence): per turn, the tokens
   * added and generated, and the policy version of the generated tokens as runs ("v3×12 v4×5"). */
  function renderSegment(turns: Record<string, unknown>[], index: number, closed: number): HTMLElement {
    const link = index < closed ? ` → compacted into segment ${index + 1}` : closed ? " (the last context: the episode's end)" : "";
    return h("div", { class: "segment", "data-segment": String(index) },
      h("div", { class: "muted" }, closed ? `segment ${index}${link}` : ""),
      ...turns.map((t, j) => {
        const runs = Array.isArray(t.versions) ? (t.versions as [number, number][]) : [];
        return h("div", { class: "segment-turn" },
          `turn ${j}: +${String(t.input_tokens)} tokens in, ${String(t.output_tokens)} generated (${String(t.finish_reason)}) · `,
          ...runs.map(([version, count]) => h("span", { class: "version-run", title: `${count} tokens by the weights of version ${version}` }, `v${version}×${count}`)));
      }));
  }

  /** One model call of an agent episode: which sample it trains in, what it was sent (what is new
   * since the call it continues) and what it answered, its tokens, log-probabilities and latency. */
  function renderAgentCall(call: Record<string, unknown>, calls: Record<string, unknown>[]): HTMLElement {
    const continued = typeof call.continues === "number" ? calls.find((c) => c.index === call.continues) : undefined;
    const messages = Array.isArray(call.messages) ? (call.messages as Record<string, unknown>[]) : [];
    const known = Number(call.first_message ?? 0);  // the messages before it are the continued call's and its reply
    const logprobs = Array.isArray(call.logprobs) ? (call.logprobs as number[]) : [];
    const mean = logprobs.length ? logprobs.reduce((a, b) => a + b, 0) / logprobs.length : null;
    const head = [
      `call ${String(call.index)}`,
      `sample ${String(call.sequence)}`,
      continued ? `continues call ${String(call.continues)}` : "new sequence",
      `${String(call.prompt_tokens)} prompt + ${String(call.completion_tokens)} completion tokens`,
      `${fmt(Number(call.latency_s) * 1000, 0)} ms`,
    ].join(" · ");
    const reply = call.reply as Record<string, unknown> | null;
    return h("details", { class: "agent-call", "data-call": String(call.index) },
      h("summary", null, head, call.mismatch ? h("span", { class: "badge", title: "the chat template renders this conversation with other tokens than the recorded ones; the recorded ones were used" }, "re-tokenization differs") : null),
      h("div", { class: "muted" }, known ? `new messages since call ${String(call.continues)}:` : `${messages.length} messages sent:`),
      ...messages.map((m) => renderMessage(m)),
      reply ? renderMessage(reply) : h("p", { class: "muted" }, `${String(call.route)} call (no chat reply)`),
      h("div", { class: "muted" }, `log-probabilities: mean ${fmt(mean, 3)}, min ${fmt(logprobs.length ? Math.min(...logprobs) : null, 3)} over ${logprobs.length} tokens · finish ${String(call.finish_reason)}`));
  }

  async function renderPanes(): Promise<void> {
    const shown = sideBySide ? [0, 1] : [0];
    const built = await Promise.all(shown.map((i) => renderPane(panes[i], i)));
    paneBox.classList.toggle("two", sideBySide);
    paneBox.replaceChildren(...built);
  }

  async function loadStep(): Promise<void> {
    const data = await get<{ step: number | null; samples: Sample[] }>("/api/rollouts", { run: runId, step, discarded });
    const changed = JSON.stringify(data.samples.map((s) => s.seq)) !== JSON.stringify(samples.map((s) => s.seq));
    samples = data.samples;
    step = data.step;
    stepInput.value = step === null ? "" : String(step);
    const index = steps.findIndex((s) => s.step === step);
    stepInfo.textContent = step === null ? "no steps yet" : `step ${step} (${index + 1} of ${steps.length}), ${samples.length} samples`;
    if (changed) {
      if (!sideBySide && panes[0] === null && samples.length) panes[0] = samples[0].seq;
      renderList();
      await renderPanes();
    }
  }

  const search = debounce(async () => {
    const q = searchInput.value.trim();
    clear(searchResults);
    if (!q) return;
    const data = await get<{ total: number; results: SearchResult[] }>("/api/rollouts/search", { run: runId, q, discarded, limit: 50 });
    searchResults.append(h("div", { class: "muted" }, `${data.total} rollout(s) contain “${q}”${data.total > data.results.length ? ` (first ${data.results.length})` : ""}`),
      ...data.results.map((r) => h("button", { class: "search-hit", "data-seq": r.seq, onclick: () => { step = r.step; void loadStep().then(() => open(r.seq)); } },
        h("b", null, `step ${r.step} · group ${r.group_index} · sample ${r.rollout_index}`), h("span", { class: "muted" }, ` ${r.field}, reward ${fmt(r.reward)}: `), h("span", { class: "snippet" }, r.snippet))));
  }, 250);
  searchInput.addEventListener("input", search);

  const charts = discarded ? DISCARDED_CHARTS.map((name) => new LineChart(name, { ema: 0, outliers: false, yMin: null, yMax: null, xLabel: "step" }, "discarded")) : [];
  for (const chart of charts) chartsBox.append(chart.el);

  return {
    el,
    async refresh() {
      if (!summary) summary = await get<RunSummary>(`/api/runs/${encodeURIComponent(runId)}`);
      const data = await get<{ steps: typeof steps }>("/api/rollouts/steps", { run: runId, discarded });
      const newest = data.steps[data.steps.length - 1]?.step;
      const grew = JSON.stringify(data.steps) !== JSON.stringify(steps);
      steps = data.steps;
      if (follow && newest !== undefined && newest !== step) step = newest;
      if (grew || samples.length === 0) await loadStep();
      if (charts.length) {
        const series = await get<{ series: Series[] }>("/api/metrics/series", { runs: ctx.selected.join(","), names: DISCARDED_CHARTS.join(",") });
        const styles = ctx.selected.map((id) => ({ id, label: ctx.runName(id), color: ctx.color(id) }));
        charts.forEach((chart, i) => chart.setData(series.series.filter((s) => s.name === DISCARDED_CHARTS[i]), styles));
      }
    },
    destroy() { for (const chart of charts) chart.destroy(); },
  };
}
