// spectool's chat page: plain JavaScript, no framework, nothing fetched from another host.
// Model text is only ever put into the page as text (textContent), never as HTML.
"use strict";

const SOURCES = ["target", "lookup", "corpus", "draft", "mtp", "eagle3", "dflash", "hybrid", "grammar", "prediction"];
const STORE = "spectool.chats";
const SETTINGS = "spectool.settings";
const KEY = "spectool.key"; // sessionStorage: this tab only

const $ = (id) => document.getElementById(id);

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  Object.assign(node, props || {});
  for (const c of children) node.append(c);
  return node;
}

// ---- conversations, kept in localStorage -------------------------------------------------------

const state = { chats: [], current: null, busy: null, props: null };

function loadChats() {
  try { state.chats = JSON.parse(localStorage.getItem(STORE)) || []; } catch { state.chats = []; }
  if (!state.chats.length) newChat();
  state.current = state.chats[0].id;
}

function saveChats() {
  localStorage.setItem(STORE, JSON.stringify(state.chats));
}

function newChat() {
  const chat = { id: String(Date.now()) + Math.random().toString(16).slice(2, 6), title: "New chat", messages: [] };
  state.chats.unshift(chat);
  state.current = chat.id;
  saveChats();
  return chat;
}

function currentChat() {
  return state.chats.find((c) => c.id === state.current) || state.chats[0];
}

function renderChatList() {
  const list = $("chat-list");
  list.replaceChildren();
  for (const chat of state.chats) {
    const open = el("button", { type: "button", className: "open", textContent: chat.title, title: chat.title });
    open.onclick = () => { state.current = chat.id; renderAll(); };
    const rename = el("button", { type: "button", textContent: "✎", title: "Rename", className: "rename" });
    rename.onclick = () => {
      const title = window.prompt("Name this chat", chat.title);
      if (title && title.trim()) { chat.title = title.trim(); saveChats(); renderChatList(); }
    };
    const del = el("button", { type: "button", textContent: "✕", title: "Delete", className: "delete" });
    del.onclick = () => {
      state.chats = state.chats.filter((c) => c !== chat);
      if (!state.chats.length) newChat();
      if (state.current === chat.id) state.current = state.chats[0].id;
      saveChats(); renderAll();
    };
    list.append(el("li", { className: chat.id === state.current ? "current" : "" }, open, rename, del));
  }
}

function renderAll() {
  renderChatList();
  const box = $("messages");
  box.replaceChildren();
  for (const m of currentChat().messages) box.append(messageView(m).node);
  box.scrollTop = box.scrollHeight;
}

// ---- settings ----------------------------------------------------------------------------------

function loadSettings() {
  let s = {};
  try { s = JSON.parse(localStorage.getItem(SETTINGS)) || {}; } catch { s = {}; }
  if (s.system !== undefined) $("system").value = s.system;
  if (s.temperature !== undefined) $("temperature").value = s.temperature;
  if (s.maxTokens !== undefined) $("max-tokens").value = s.maxTokens;
  if (s.speculative !== undefined) $("speculative").checked = s.speculative;
  for (const id of ["system", "temperature", "max-tokens", "speculative"]) $(id).onchange = saveSettings;
}

function saveSettings() {
  localStorage.setItem(SETTINGS, JSON.stringify(settings()));
}

function settings() {
  return {
    system: $("system").value,
    temperature: Number($("temperature").value) || 0,
    maxTokens: Math.max(1, Math.floor(Number($("max-tokens").value) || 256)),
    speculative: $("speculative").checked,
  };
}

// ---- talking to the server ---------------------------------------------------------------------

function headers(json) {
  const h = json ? { "Content-Type": "application/json" } : {};
  const key = sessionStorage.getItem(KEY);
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

class KeyNeeded extends Error {}

async function call(path, body, signal) {
  let response;
  try {
    response = await fetch(path, {
      method: body ? "POST" : "GET", headers: headers(!!body), signal,
      body: body ? JSON.stringify(body) : undefined,
    });
  } catch (e) {
    if (e.name === "AbortError") throw e;
    throw new Error("the server is not answering (" + (e.message || e) + ")");
  }
  if (response.status === 401) { askKey(); throw new KeyNeeded("this server needs its API key"); }
  if (!response.ok) {
    let message = response.status + " " + response.statusText;
    try { message = (await response.json()).error.message || message; } catch { /* not JSON */ }
    throw new Error(message);
  }
  return response;
}

function showError(message) {
  const box = $("error");
  box.textContent = message || "";
  box.hidden = !message;
}

function askKey() {
  const dialog = $("key-dialog");
  if (!dialog.open) dialog.showModal();
  $("key-input").focus();
}

function setupKey() {
  $("key-form").onsubmit = (event) => {
    event.preventDefault();
    const key = $("key-input").value.trim();
    if (!key) return;
    sessionStorage.setItem(KEY, key);
    $("key-input").value = "";
    $("key-dialog").close();
    showError("");
    refreshServer();
  };
}

// Server-sent events: each `data:` line's JSON object, until [DONE].
async function* events(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        if (data === "[DONE]") return;
        yield JSON.parse(data);
      }
    }
  }
}

function requestBody(history, options) {
  const s = settings();
  const messages = s.system.trim() ? [{ role: "system", content: s.system }] : [];
  for (const m of history) messages.push({ role: m.role, content: m.content });
  const body = { messages, stream: true, temperature: s.temperature, max_tokens: s.maxTokens, draft_steps: true };
  const speculative = options && options.speculative !== undefined ? options.speculative : s.speculative;
  if (!speculative) body.speculative = false;
  return body;
}

// One streamed answer: `onChunk(text, step)` for each chunk; the usage of the last chunk returned.
async function stream(body, signal, onChunk) {
  const response = await call("/v1/chat/completions", body, signal);
  let usage = null;
  for await (const chunk of events(response)) {
    if (chunk.error) throw new Error(chunk.error.message);
    const choice = chunk.choices && chunk.choices[0];
    const text = choice && choice.delta && choice.delta.content;
    if (text || chunk.draft_step) onChunk(text || "", chunk.draft_step || null);
    if (chunk.usage) usage = chunk.usage;
  }
  return usage;
}

// ---- Markdown, rendered over the text's coloured runs --------------------------------------------
// Blocks and inline marks are found on the plain text; every piece of text is then filled in from
// the runs (each a stretch of characters from one step and one source) that cover it.

function runsOf(message) {
  const runs = [];
  let at = 0;
  message.steps.forEach((step, i) => {
    const draft = step.draft_chars || 0;
    if (draft > 0) runs.push({ start: at, end: at + draft, source: step.source, step: i });
    if (step.chars > draft) runs.push({ start: at + draft, end: at + step.chars, source: step.plain ? "plain" : "target", step: i });
    at += step.chars;
  });
  return runs;
}

function stepTitle(step, i) {
  if (step.plain) return "";
  const rejected = step.drafted - step.accepted;
  const drafted = step.drafted ? `${step.source} drafted ${step.drafted}, accepted ${step.accepted}, rejected ${rejected}` : "nothing drafted";
  const draft = step.draft ? `\naccepted draft: ${JSON.stringify(step.draft)}` : "";
  const refused = step.rejected ? `\nrejected draft: ${JSON.stringify(step.rejected)}` : "";
  return `step ${i + 1}: ${drafted}; ${step.tokens} token${step.tokens === 1 ? "" : "s"} made final${draft}${refused}`;
}

function filler(message, runs) {
  return (node, start, end) => {
    for (const run of runs) {
      const a = Math.max(start, run.start), b = Math.min(end, run.end);
      if (a >= b) continue;
      const span = el("span", { className: "src-" + run.source, textContent: message.content.slice(a, b) });
      span.dataset.step = run.step;
      const step = message.steps[run.step];
      span.title = stepTitle(step, run.step);
      span.dataset.drafted = step.drafted;
      span.dataset.accepted = step.accepted;
      node.append(span);
    }
  };
}

function inline(node, text, start, end, fill) {
  const marks = /(`[^`\n]+`)|(\*\*[^*\n]+\*\*)|(\*[^*\s][^*\n]*\*)/g;
  marks.lastIndex = 0;
  const part = text.slice(start, end);
  let at = 0, m;
  while ((m = marks.exec(part))) {
    fill(node, start + at, start + m.index);
    const a = start + m.index, b = a + m[0].length;
    const [tag, cut] = m[1] ? ["code", 1] : m[2] ? ["strong", 2] : ["em", 1];
    const child = el(tag);
    fill(child, a + cut, b - cut);
    node.append(child);
    at = m.index + m[0].length;
  }
  fill(node, start + at, end);
}

function lines(text) {
  const out = [];
  let start = 0;
  for (const line of text.split("\n")) {
    out.push({ start, end: start + line.length, text: line });
    start += line.length + 1;
  }
  return out;
}

function codeBlock(text, all, i, fill) {
  const lang = all[i].text.slice(3).trim();
  let j = i + 1;
  while (j < all.length && !all[j].text.startsWith("```")) j++;
  const start = i + 1 < all.length ? all[i + 1].start : all[i].end;
  const end = j > i + 1 ? all[j - 1].end : start;
  const code = el("code");
  fill(code, start, end);
  const copy = copyButton(() => text.slice(start, end));
  const block = el("div", { className: "codeblock" }, el("div", { className: "bar" }, el("span", { textContent: lang || "code" }), copy), el("pre", {}, code));
  return [block, j + 1];
}

const LIST = /^\s*([-*+]|\d+[.)])\s+/;

function listBlock(text, all, i, fill) {
  const ordered = /^\s*\d/.test(all[i].text);
  const list = el(ordered ? "ol" : "ul");
  while (i < all.length && LIST.test(all[i].text)) {
    const li = el("li");
    inline(li, text, all[i].start + all[i].text.match(LIST)[0].length, all[i].end, fill);
    list.append(li);
    i++;
  }
  return [list, i];
}

function markdown(text, fill) {
  const out = document.createDocumentFragment();
  const all = lines(text);
  let i = 0;
  while (i < all.length) {
    const line = all[i];
    let m;
    if (line.text.startsWith("```")) {
      const [block, next] = codeBlock(text, all, i, fill);
      out.append(block); i = next;
    } else if ((m = line.text.match(/^(#{1,6})\s+/))) {
      const h = el("h" + Math.min(6, m[1].length + 2));
      inline(h, text, line.start + m[0].length, line.end, fill);
      out.append(h); i++;
    } else if (LIST.test(line.text)) {
      const [list, next] = listBlock(text, all, i, fill);
      out.append(list); i = next;
    } else if (!line.text.trim()) {
      fill(out, line.start, line.end); i++;
    } else {
      let j = i;
      while (j + 1 < all.length && all[j + 1].text.trim() && !/^(```|#{1,6}\s)/.test(all[j + 1].text) && !LIST.test(all[j + 1].text)) j++;
      const p = el("p");
      inline(p, text, line.start, all[j].end, fill);
      out.append(p); i = j + 1;
    }
  }
  return out;
}

function copyButton(text) {
  const button = el("button", { type: "button", className: "copy", textContent: "Copy" });
  button.onclick = async () => {
    try { await navigator.clipboard.writeText(text()); button.textContent = "Copied"; } catch { button.textContent = "Copy failed"; }
    setTimeout(() => { button.textContent = "Copy"; }, 1200);
  };
  return button;
}

// ---- a message on the page ---------------------------------------------------------------------

function messageView(message) {
  const body = el("div", { className: "body" });
  const summary = el("div", { className: "summary" });
  const notice = el("div", { className: "notice" });
  const role = el("div", { className: "role" }, el("span", { textContent: message.role }), copyButton(() => message.content));
  const node = el("div", { className: "message " + message.role }, role, body, notice, summary);
  const view = {
    node,
    render() {
      if (message.role !== "assistant") { body.textContent = message.content; return; }
      const runs = runsOf(message);
      body.replaceChildren(markdown(message.content, filler(message, runs)));
      // steps whose text shows nowhere (held back, a newline between blocks, a fence): still on the page
      const shown = new Set([...body.querySelectorAll("span[data-step]")].map((span) => span.dataset.step));
      const empty = el("div", { className: "empty-steps" });
      message.steps.forEach((step, i) => {
        if (shown.has(String(i))) return;
        const span = el("span", { title: stepTitle(step, i) });
        Object.assign(span.dataset, { step: i, drafted: step.drafted, accepted: step.accepted });
        empty.append(span);
      });
      body.append(empty);
      summary.textContent = message.summary || "";
      notice.textContent = message.notice || "";
    },
  };
  body.onmouseover = (event) => highlight(body, event.target.dataset && event.target.dataset.step);
  body.onmouseout = () => highlight(body, undefined);
  view.render();
  return view;
}

function highlight(body, step) {
  for (const span of body.querySelectorAll("span[data-step]")) span.classList.toggle("hl", step !== undefined && span.dataset.step === step);
}

// ---- live figures ------------------------------------------------------------------------------

class Figures {
  constructor() { this.started = performance.now(); this.tokens = 0; this.steps = 0; this.drafted = 0; this.accepted = 0; this.positions = []; this.speeds = []; }

  add(step) {
    if (!this.steps) this.started = performance.now(); // speed from the first token, as the server counts it
    this.tokens += step.tokens; this.steps += 1;
    this.drafted += step.drafted; this.accepted += step.accepted;
    for (let i = 0; i < step.drafted; i++) {
      this.positions[i] = this.positions[i] || { drafted: 0, accepted: 0 };
      this.positions[i].drafted += 1;
      if (i < step.accepted) this.positions[i].accepted += 1;
    }
    const seconds = (performance.now() - this.started) / 1000;
    if (seconds > 0) this.speeds.push(this.tokens / seconds);
  }

  show() {
    const seconds = (performance.now() - this.started) / 1000;
    $("fig-speed").textContent = seconds > 0 ? (this.tokens / seconds).toFixed(1) : "–";
    $("fig-acceptance").textContent = this.drafted ? `${Math.round((100 * this.accepted) / this.drafted)}% (${this.accepted}/${this.drafted})` : "–";
    $("fig-per-step").textContent = this.steps ? (this.tokens / this.steps).toFixed(2) : "–";
    const bars = this.positions.map((p, i) => {
      const bar = el("div", { className: "bar", title: `position ${i + 1}: ${p.accepted} of ${p.drafted} accepted` });
      bar.style.height = Math.round((100 * p.accepted) / p.drafted) + "%";
      return bar;
    });
    $("positions").replaceChildren(...bars);
    $("chart").replaceChildren(chart(this.speeds));
  }
}

function chart(values) {
  const NS = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("viewBox", "0 0 100 40");
  svg.setAttribute("preserveAspectRatio", "none");
  if (values.length < 2) return svg;
  const top = Math.max(...values) || 1;
  const points = values.map((v, i) => `${((100 * i) / (values.length - 1)).toFixed(2)},${(40 - (38 * v) / top).toFixed(2)}`);
  const line = document.createElementNS(NS, "polyline");
  line.setAttribute("points", points.join(" "));
  svg.append(line);
  const label = document.createElementNS(NS, "title");
  label.textContent = `peak ${top.toFixed(1)} tok/s`;
  svg.append(label);
  return svg;
}

// spectool run's summary line, from the server's usage (its mode, or none for a request that drafted nothing)
function summaryLine(usage, body) {
  const s = usage && usage.speculative;
  if (!s) return "";
  const rate = s.drafted ? ` (${Math.round((100 * s.accepted) / s.drafted)}%)` : "";
  return `[${body.speculative === false ? "none" : s.mode}] ${usage.completion_tokens} tokens in ${s.decode_seconds.toFixed(2)}s = ${s.tokens_per_second.toFixed(1)} tok/s; drafted ${s.drafted}, accepted ${s.accepted}${rate}; prompt ${usage.prompt_tokens} tokens in ${s.prompt_seconds.toFixed(2)}s`;
}

// ---- sending a message -------------------------------------------------------------------------

function setBusy(controller) {
  state.busy = controller;
  $("send").disabled = !!controller;
  $("race").disabled = !!controller;
  $("stop").disabled = !controller;
}

async function send() {
  const text = $("prompt").value;
  if (!text.trim() || state.busy) return;
  $("prompt").value = "";
  const chat = currentChat();
  if (!chat.messages.length) { chat.title = text.trim().slice(0, 40); renderChatList(); }
  chat.messages.push({ role: "user", content: text });
  const answer = { role: "assistant", content: "", steps: [] };
  const history = chat.messages.slice();
  chat.messages.push(answer);
  saveChats();
  renderAll();
  await answerInto(answer, history);
}

// A streamed chunk's text, and the step that made it (null: a stream without draft_step)
function addPiece(message, text, step) {
  message.content += text;
  message.steps.push(step ? { ...step, chars: text.length, draft: text.slice(0, step.draft_chars) } : { source: "plain", plain: true, drafted: 0, accepted: 0, tokens: 0, draft_chars: 0, chars: text.length });
}

async function answerInto(answer, history) {
  const view = messageView(answer);
  const box = $("messages");
  box.lastChild.replaceWith(view.node);
  const controller = new AbortController();
  const figures = new Figures();
  setBusy(controller);
  let pending = false;
  const later = () => { if (!pending) { pending = true; requestAnimationFrame(() => { pending = false; view.render(); figures.show(); box.scrollTop = box.scrollHeight; }); } };
  try {
    const body = requestBody(history);
    const usage = await stream(body, controller.signal, (text, step) => {
      addPiece(answer, text, step);
      if (step) figures.add(step);
      later();
    });
    answer.summary = summaryLine(usage, body);
    showError("");
  } catch (e) {
    answer.notice = e.name === "AbortError" ? "(stopped)" : "error: " + e.message;
    if (e.name !== "AbortError" && !(e instanceof KeyNeeded)) showError(e.message);
  } finally {
    setBusy(null);
    saveChats();
    view.render();
    figures.show();
    refreshServer();
  }
}

// ---- the race: the same prompt with and without speculation --------------------------------------

async function runLane(history, speculative, lane) {
  const message = { role: "assistant", content: "", steps: [] };
  const view = messageView(message);
  lane.querySelector(".race-answer").replaceChildren(view.node);
  lane.querySelector(".race-speed").textContent = "…";
  const body = requestBody(history, { speculative });
  const usage = await stream(body, state.busy.signal, (text, step) => { addPiece(message, text, step); view.render(); });
  const speed = usage ? usage.speculative.tokens_per_second : 0;
  lane.querySelector(".race-speed").textContent = `${speed.toFixed(1)} tok/s (${usage ? usage.completion_tokens : 0} tokens)`;
  message.summary = summaryLine(usage, body);
  view.render();
  return { text: message.content, speed };
}

async function race() {
  const text = $("prompt").value;
  const chat = currentChat();
  const history = chat.messages.filter((m) => m.content).map((m) => ({ role: m.role, content: m.content }));
  if (text.trim()) history.push({ role: "user", content: text });
  if (state.busy) return;
  $("race-result").hidden = false;
  $("race-same").textContent = "";
  if (!history.length || history[history.length - 1].role !== "user") {
    $("race-ratio").textContent = "type a prompt first: the race runs it with and without speculation";
    return;
  }
  $("race-ratio").textContent = "running…";
  setBusy(new AbortController());
  try {
    const side = state.props && state.props.total_slots >= 2;
    let spec, plain;
    if (side) {
      [spec, plain] = await Promise.all([runLane(history, true, $("race-spec")), runLane(history, false, $("race-plain"))]);
    } else {
      spec = await runLane(history, true, $("race-spec"));
      plain = await runLane(history, false, $("race-plain"));
    }
    $("race-ratio").textContent = plain.speed ? `${(spec.speed / plain.speed).toFixed(2)}x ${side ? "(side by side)" : "(one after the other)"}` : "";
    if (settings().temperature === 0) $("race-same").textContent = spec.text === plain.text ? "identical" : "different";
  } catch (e) {
    $("race-ratio").textContent = e.name === "AbortError" ? "stopped" : "error: " + e.message;
    if (e.name !== "AbortError" && !(e instanceof KeyNeeded)) showError(e.message);
  } finally {
    setBusy(null);
    refreshServer();
  }
}

// ---- the server at a glance --------------------------------------------------------------------

function row(list, name, value) {
  list.append(el("dt", { textContent: name }), el("dd", { textContent: String(value) }));
}

async function refreshServer() {
  try {
    const [models, props, slots] = await Promise.all(["/v1/models", "/props", "/slots"].map((p) => call(p).then((r) => r.json())));
    state.props = props;
    const model = models.data[0].id;
    $("model").textContent = model;
    const params = props.default_generation_settings.params;
    const list = $("server");
    list.replaceChildren();
    row(list, "model", model);
    row(list, "drafting", params["speculative.types"]);
    row(list, "backend", props.backend || "?");
    row(list, "context", props.default_generation_settings.n_ctx + " tokens");
    row(list, "slots", props.total_slots);
    $("slots").replaceChildren(...slots.map((s) => el("li", { textContent: slotLine(s) })));
    if (!state.busy) showError("");
  } catch (e) {
    if (!(e instanceof KeyNeeded)) showError(e.message);
  }
}

function slotLine(s) {
  if (s.id_task === undefined) return `slot ${s.id}: idle, no task yet`;
  const rate = s.draft_n ? ` (${Math.round((100 * s.draft_n_accepted) / s.draft_n)}%)` : "";
  return `slot ${s.id}: ${s.is_processing ? "busy" : "idle"}, task ${s.id_task}, drafted ${s.draft_n}, accepted ${s.draft_n_accepted}${rate}`;
}

// ---- start -------------------------------------------------------------------------------------

function legend() {
  const names = { target: "the target's own", lookup: "prompt lookup", corpus: "corpus lookup", draft: "draft model", mtp: "MTP heads", eagle3: "EAGLE-3 head", dflash: "DFlash head", hybrid: "lookup + model", grammar: "grammar", prediction: "prediction" };
  $("legend").replaceChildren(...SOURCES.map((s) => el("li", {}, el("span", { className: "swatch src-" + s }), names[s])));
}

function start() {
  loadChats();
  loadSettings();
  legend();
  setupKey();
  renderAll();
  $("composer").onsubmit = (event) => { event.preventDefault(); send(); };
  $("prompt").onkeydown = (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) { event.preventDefault(); send(); }
  };
  $("stop").onclick = () => { if (state.busy) state.busy.abort(); };
  $("race").onclick = race;
  $("new-chat").onclick = () => { newChat(); renderAll(); };
  refreshServer();
  setInterval(() => { if (!state.busy) refreshServer(); }, 5000);
}

document.addEventListener("DOMContentLoaded", start);
