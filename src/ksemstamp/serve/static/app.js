// The page's script: tabs, the three forms, and the detection view with its chart.
// Everything is drawn here from the JSON the server returns; nothing is loaded from elsewhere.
"use strict";

const $ = (id) => document.getElementById(id);
const SVG = "http://www.w3.org/2000/svg";
let info = null;

// ---------------------------------------------------------------- helpers
function fmtP(p, log10) {
  if (p === null || p === undefined) return "–";
  // Below the reported floor the record gives the exact value as its logarithm.
  if (log10 !== null && log10 !== undefined) return `< ${p.toExponential(0)} (log₁₀ p = ${log10.toFixed(1)})`;
  if (p >= 0.001) return p.toPrecision(3).replace(/\.?0+$/, "");
  return p.toExponential(2);
}
function fmtNum(x, digits = 2) {
  return x === null || x === undefined ? "–" : Number(x).toFixed(digits);
}
async function api(path, options = {}) {
  const response = await fetch(path, options);
  let body = null;
  try { body = await response.json(); } catch (_) { body = null; }
  if (!response.ok) {
    const message = body && body.error ? body.error : `the server answered ${response.status}`;
    const err = new Error(message);
    err.status = response.status;
    throw err;
  }
  return body;
}
function setStatus(el, text, isError = false) {
  el.textContent = text;
  el.classList.toggle("error", isError);
}
function el(tag, attrs = {}, text = null) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== null) node.textContent = text;
  return node;
}
function svg(tag, attrs = {}, text = null) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== null) node.textContent = text;
  return node;
}

// ---------------------------------------------------------------- tabs
function showTab(name) {
  for (const t of ["detect", "generate", "batch"]) {
    $(`tab-${t}`).setAttribute("aria-selected", String(t === name));
    $(`panel-${t}`).hidden = t !== name;
  }
  history.replaceState(null, "", `#${name}`);
}
for (const t of ["detect", "generate", "batch"]) {
  $(`tab-${t}`).addEventListener("click", () => showTab(t));
}

// ---------------------------------------------------------------- the chart
// Region mark: bars of the exact test's null law of the valid count for this text's own region
// transitions (over random keys); the shaded bars, at or right of the observed count, add up to
// the p-value. Direction mark: the standard normal density of the exact z, shaded right of the
// observed z (the shaded area is the p-value).
function drawChart(container, nul, statistic) {
  container.replaceChildren();
  if (!nul) return;
  if (nul.kind === "normal") {
    drawNormal(container, nul);
    return;
  }
  const pmf = nul.pmf, n = pmf.length - 1;
  const W = 360, H = 180, L = 34, R = 8, T = 30, B = 30;
  const width = W - L - R, height = H - T - B;
  const top = Math.max(...pmf) || 1;
  const step = width / (n + 1);
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img",
    "aria-label": `null distribution of the valid count; observed ${nul.observed}, tail ${fmtP(nul.tail)}` });
  root.appendChild(svg("line", { x1: L, y1: T + height, x2: L + width, y2: T + height, stroke: "#8a949f" }));
  pmf.forEach((p, s) => {
    const h = (p / top) * height;
    const tail = s >= nul.observed;
    const bar = svg("rect", {
      x: L + s * step + step * 0.1, y: T + height - h, width: Math.max(step * 0.8, 0.5), height: h,
      fill: tail ? "#1f5fae" : "#c3cad2", class: tail ? "tail" : "body",
    });
    bar.appendChild(svg("title", {}, `P(valid count = ${s}) = ${fmtP(p)}`));
    root.appendChild(bar);
  });
  const ox = L + (nul.observed + 0.5) * step;
  drawObserved(root, ox, T, height, nul.observed > n * 0.6, `observed ${nul.observed}`);
  const ticks = new Set([0, n, nul.observed, Math.round(nul.expected)]);
  for (const s of ticks) {
    root.appendChild(svg("text", { x: L + (s + 0.5) * step, y: T + height + 13, "font-size": 10,
      fill: "#5b6572", "text-anchor": "middle" }, String(s)));
  }
  drawTitles(root, { x: L + width / 2, y: H - 3 }, T + height / 2,
    "valid sentences, if the key had been random", "chance");
  container.appendChild(root);
  const caption = el("p", { class: "caption" },
    `Shaded: P(valid count ≥ ${nul.observed}) = ${fmtP(nul.tail)} under the exact test` +
    (statistic === "exact" ? " (the p-value)." : " (the calibrated p-value; the decision uses the paper's)."));
  container.appendChild(caption);
}

// The observed statistic: a dashed red line at x = ox over the plot, labelled above it (to its
// left when it stands in the right part of the plot).
function drawObserved(root, ox, T, height, right, label) {
  root.appendChild(svg("line", { x1: ox, y1: T - 18, x2: ox, y2: T + height, stroke: "#c0392b",
    "stroke-width": 2, "stroke-dasharray": "4 2" }));
  const anchor = right ? "end" : "start";
  root.appendChild(svg("text", { x: ox + (anchor === "end" ? -4 : 4), y: T - 8, "font-size": 11,
    fill: "#c0392b", "text-anchor": anchor }, label));
}

// The axes' titles: the x title centred at ``at``, the y title turned along the left edge at
// height ``middle``.
function drawTitles(root, at, middle, xTitle, yTitle) {
  root.appendChild(svg("text", { x: at.x, y: at.y, "font-size": 10, fill: "#5b6572",
    "text-anchor": "middle" }, xTitle));
  root.appendChild(svg("text", { x: 4, y: middle, "font-size": 10, fill: "#5b6572",
    transform: `rotate(-90 10 ${middle})`, "text-anchor": "middle" }, yTitle));
}

function drawNormal(container, nul) {
  const W = 360, H = 180, L = 34, R = 8, T = 30, B = 30;
  const width = W - L - R, height = H - T - B;
  const lo = -4, hi = Math.max(4, Math.min(nul.z + 1, 12));
  const x = (z) => L + ((z - lo) / (hi - lo)) * width;
  const density = (z) => Math.exp(-z * z / 2) / Math.sqrt(2 * Math.PI);
  const y = (d) => T + height - (d / density(0)) * height;
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img",
    "aria-label": `null distribution of z: standard normal; observed ${fmtNum(nul.z)}, tail ${fmtP(nul.tail)}` });
  root.appendChild(svg("line", { x1: L, y1: T + height, x2: L + width, y2: T + height, stroke: "#8a949f" }));
  const steps = 160, curve = [], tail = [];
  for (let i = 0; i <= steps; i++) {
    const z = lo + ((hi - lo) * i) / steps;
    curve.push(`${x(z).toFixed(1)},${y(density(z)).toFixed(1)}`);
    if (z >= nul.z) tail.push(`${x(z).toFixed(1)},${y(density(z)).toFixed(1)}`);
  }
  if (tail.length) {
    const start = Math.min(Math.max(nul.z, lo), hi);
    const area = [`${x(start).toFixed(1)},${T + height}`, `${x(start).toFixed(1)},${y(density(start)).toFixed(1)}`,
      ...tail, `${x(hi).toFixed(1)},${T + height}`];
    root.appendChild(svg("polygon", { points: area.join(" "), fill: "#1f5fae", class: "tail" }));
  }
  root.appendChild(svg("polyline", { points: curve.join(" "), fill: "none", stroke: "#8a949f",
    "stroke-width": 1.5, class: "body" }));
  const ox = x(Math.min(Math.max(nul.z, lo), hi));
  drawObserved(root, ox, T, height, ox > L + width * 0.6, `observed z = ${fmtNum(nul.z)}`);
  for (let z = Math.ceil(lo); z <= hi; z += 2) {
    root.appendChild(svg("text", { x: x(z), y: T + height + 13, "font-size": 10,
      fill: "#5b6572", "text-anchor": "middle" }, String(z)));
  }
  drawTitles(root, { x: L + width / 2, y: H - 3 }, T + height / 2,
    "z, if the key had been random", "density");
  container.appendChild(root);
  container.appendChild(el("p", { class: "caption" },
    `Shaded: P(z ≥ ${fmtNum(nul.z)}) = ${fmtP(nul.tail)} under the exact test (the p-value).`));
}

// ---------------------------------------------------------------- the detection view
function renderDetection(target, view) {
  const node = $("detection-template").content.firstElementChild.cloneNode(true);
  node.dataset.decision = view.decision;
  const headline = node.querySelector(".headline");
  headline.textContent = view.headline;
  headline.classList.add(view.decision);
  headline.id = "verdict";
  const numbers = node.querySelector(".numbers");
  const rows = view.status === "ok" ? [
    ["p-value", `${fmtP(view.p_value, view.log10_p_value)} (${view.statistic})`],
    ["z-score", `${fmtNum(view.z_score)} (${view.z_label})`],
    [view.counted, `${view.num_valid} of ${view.num_scored}`],
    ["expected by chance", `${fmtNum(view.expected, 1)} (${view.expected_label})`],
    ["threshold", `p ≤ ${view.alpha}`],
    ["detection took", `${fmtNum(view.seconds, 3)} s`],
  ] : [["sentences", String(view.sentences.length)]];
  for (const [k, v] of rows) {
    numbers.appendChild(el("dt", {}, k));
    numbers.appendChild(el("dd", { "data-field": k }, v));
  }
  drawChart(node.querySelector(".chart"), view.null, view.statistic);
  node.querySelector(".explain").textContent = view.explanation;
  if (view.normalization) {
    node.querySelector(".explain").after(el("p", { class: "explain normalized" }, view.normalization));
  }
  const text = node.querySelector(".marked-text");
  for (const seg of view.segments) {
    if (seg.gap) text.appendChild(document.createTextNode(seg.gap));
    if (seg.sentence === undefined) continue;
    const s = view.sentences[seg.sentence];
    const span = el("span", { class: `s ${s.verdict}`, "data-verdict": s.verdict,
      "data-region": s.region }, s.text);
    const after = s.previous_region === null || s.previous_region === undefined
      ? "" : ` after region ${s.previous_region}`;
    const score = s.score === null || s.score === undefined ? "" : `, score ${fmtNum(s.score)}`;
    span.title = `sentence ${s.index + 1}: region ${s.region}${after}${score}: ${s.label}`;
    text.appendChild(span);
  }
  target.replaceChildren(node);
}

// ---------------------------------------------------------------- detect
// One scoring form (``detect`` or ``batch``): its button off while ``request()`` runs, its
// status "scoring …", then ``render`` of the answer into NAME-result, or the error in its status.
async function score(name, request, render) {
  const button = $(`${name}-button`), status = $(`${name}-status`);
  button.disabled = true;
  setStatus(status, "scoring …");
  try {
    render($(`${name}-result`), await request());
    setStatus(status, "");
  } catch (err) {
    $(`${name}-result`).replaceChildren();
    setStatus(status, err.message, true);
  } finally {
    button.disabled = false;
  }
}

$("detect-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  await score("detect", () => api("/api/detect", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ text: $("detect-text").value, prompt: $("detect-prompt").value || null }),
  }), renderDetection);
});

// ---------------------------------------------------------------- generate
let currentJob = null;
function showJob(snap) {
  const status = $("generate-status");
  const box = $("generate-progress");
  const live = snap.state === "queued" || snap.state === "running";
  $("generate-cancel").hidden = !live;
  $("generate-cancel").disabled = Boolean(snap.cancel_requested);
  if (snap.state === "cancelled") {
    box.hidden = true;
    $("generate-button").disabled = false;
    setStatus(status, snap.error);
    return true;
  }
  if (snap.state === "queued") {
    box.hidden = false;
    setStatus(status, snap.position === 1 && snap.ahead === 0
      ? "starting …"
      : `queued: position ${snap.position} (${snap.ahead} generation${snap.ahead === 1 ? "" : "s"} ahead)`);
    $("generate-counts").textContent = "";
    return false;
  }
  if (snap.state === "running") {
    box.hidden = false;
    setStatus(status, "generating …");
    const p = snap.progress;
    if (p) {
      $("generate-bar").max = p.max_tokens;
      $("generate-bar").value = Math.min(p.tokens, p.max_tokens);
      $("generate-counts").textContent =
        `${p.sentences} sentence${p.sentences === 1 ? "" : "s"} done, ${p.candidates} candidates drawn` +
        ` (${p.drawn_for_current} for the current sentence), ${p.tokens} / ${p.max_tokens} tokens`;
      $("generate-live").textContent = p.text;
    }
    return false;
  }
  $("generate-button").disabled = false;
  if (snap.state === "error") {
    setStatus(status, snap.error, true);
    return true;
  }
  const r = snap.result, g = r.generation;
  box.hidden = true;
  setStatus(status, `done: ${g.num_sentences} sentences, ${g.num_tokens} tokens, ` +
    `${g.candidates} candidates, ${g.fallbacks} fallbacks, ${fmtNum(g.seconds, 1)} s`);
  renderDetection($("generate-result"), r.detection);
  return true;
}

$("generate-cancel").addEventListener("click", async () => {
  if (!currentJob) return;
  $("generate-cancel").disabled = true;
  try { showJob(await api(`/api/jobs/${currentJob}`, { method: "DELETE" })); } catch (err) {
    setStatus($("generate-status"), err.message, true);
  }
});

function follow(id) {
  currentJob = id;
  let finished = false;
  const poll = async () => {
    while (!finished) {
      try { finished = showJob(await api(`/api/jobs/${id}`)); } catch (err) {
        setStatus($("generate-status"), err.message, true); $("generate-button").disabled = false; return;
      }
      await new Promise((r) => setTimeout(r, 1000));
    }
  };
  if (!window.EventSource) { poll(); return; }
  const source = new EventSource(`/api/jobs/${id}/events`);
  source.onmessage = (event) => {
    finished = showJob(JSON.parse(event.data));
    if (finished) source.close();
  };
  source.onerror = () => { source.close(); if (!finished) poll(); };
}

$("generate-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const button = $("generate-button");
  button.disabled = true;
  $("generate-result").replaceChildren();
  $("generate-live").textContent = "";
  $("generate-bar").value = 0;
  try {
    const tokens = parseInt($("generate-tokens").value, 10);
    const snap = await api("/api/generate", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ prompt: $("generate-prompt").value, max_new_tokens: tokens || null }),
    });
    showJob(snap);
    follow(snap.id);
  } catch (err) {
    setStatus($("generate-status"), err.message, true);
    button.disabled = false;
  }
});

// ---------------------------------------------------------------- batch
function renderBatch(target, out) {
  target.replaceChildren();
  const s = out.summary;
  target.appendChild(el("p", { id: "batch-summary" },
    `${out.file}: ${out.records.length} records; ${s.ok} scored (${s.watermarked} watermarked), ` +
    `${s.too_short} too short, ${s.unsupported} unsupported, ${s.error} with errors; ` +
    `${fmtNum(out.seconds, 2)} s.`));
  const table = el("table", { id: "batch-table" });
  const head = el("tr");
  for (const h of ["line", "id", "text", "status", "decision", "p-value", "z", "valid / scored", "error"]) {
    head.appendChild(el("th", {}, h));
  }
  table.appendChild(head);
  for (const r of out.records) {
    const wm = r.status === "ok" && r.watermarked;
    const tr = el("tr", { class: `status-${r.status}${wm ? " watermarked" : ""}` });
    const text = typeof r.text === "string" ? r.text : "";
    const cells = [
      [r.line, "num"], [r.id ?? "", ""], [text.length > 70 ? text.slice(0, 67) + "…" : text, ""],
      [r.status, ""],
      [r.status === "ok" ? (r.watermarked ? "watermarked" : "not watermarked") : "", "decision"],
      [r.status === "ok" ? fmtP(r.p_value, r.log10_p_value) : "", "num"],
      [r.status === "ok" ? fmtNum(r.z_score) : "", "num"],
      [r.status === "error" ? "" : `${r.num_valid} / ${r.num_scored}`, "num"],
      [r.error || "", ""],
    ];
    for (const [v, cls] of cells) tr.appendChild(el("td", cls ? { class: cls } : {}, String(v)));
    table.appendChild(tr);
  }
  target.appendChild(table);
  const url = URL.createObjectURL(new Blob([out.jsonl], { type: "application/x-ndjson" }));
  target.appendChild(el("a", { href: url, download: out.output_name, class: "download", id: "batch-download" },
    `Download ${out.output_name}`));
}

$("batch-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const file = $("batch-file").files[0];
  if (!file) { setStatus($("batch-status"), "choose a .txt or .jsonl file first", true); return; }
  const form = new FormData();
  form.append("file", file);
  await score("batch", () => api("/api/batch", { method: "POST", body: form }), renderBatch);
});

// ---------------------------------------------------------------- start

// The mark in force, as the server describes it (its own words).
function markSummary(info) {
  return `${info.mark_summary}, ${info.partition}, ${info.num_regions} regions`;
}

// What a prompt does at detection: it seeds the first unit only when the mark scores a unit
// on the one before it.
function promptHint(info) {
  if (!info.prompt_seeds) {
    return "(optional: under this mark every sentence is scored on its own, and the prompt " +
      "only tells where the text starts when it ended mid-sentence)";
  }
  return "(optional: its last sentence seeds the text's first sentence, which is then scored)";
}
(async () => {
  try {
    info = await api("/api/info");
    $("fingerprint").textContent = info.key_fingerprint;
    $("settings").textContent = ` · ${markSummary(info)}, ${info.statistic} test, α = ${info.alpha}`;
    $("prompt-hint").textContent = promptHint(info);
    $("demo-warning").hidden = !info.demo_key;
    $("generate-tokens").max = info.max_new_tokens;
    $("generate-tokens").value = info.max_new_tokens;
    if (!info.generation) {
      $("generate-button").disabled = true;
      setStatus($("generate-status"), "this server runs without a language model");
    }
  } catch (err) {
    $("fingerprint").textContent = `unavailable (${err.message})`;
  }
  const wanted = location.hash.slice(1);
  if (["detect", "generate", "batch"].includes(wanted)) showTab(wanted);
})();
